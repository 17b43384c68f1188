# make test : install everything into .venv (and the host tools the sandbox needs), lint, run every test
# make demo : bring the sandbox VM up and deploy the reference profile to it
# make demo-fleet: three sandbox guests in group `sandbox`: a parallel deploy, a rolling one stopped at --max-fail,
#   one multi-node server over the three as one release
# make bench: print the performance figures (no timed assertions anywhere in tests)
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
# Test modules run in parallel, each whole on one worker (its module-scoped guest with it); the sandbox tests mostly
# wait on guests, so more workers than cores pay off. --durations=10 prints the slowest ten.
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10
export SGLANG_DEPLOY_CACHE ?= /var/tmp/sglang-deploy-cache

.PHONY: test test-fast demo demo-fleet bench lint install host-deps clean

$(VENV)/.installed: pyproject.toml
	@python3 -m venv --help >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# the bench extra (pyinfra, the peer bench/peer.py measures beside ours); `test` includes it, a venv made before not
$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

host-deps:
	bash sandbox/testhost.sh deps-if-missing

# mypy checks the wiring between modules (what it covers and how strictly: [tool.mypy] in pyproject.toml)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: install host-deps lint
	$(PYTEST)

test-fast: install lint
	$(PYTEST) -m "not sandbox"

demo: install host-deps
	$(VENV)/bin/invoke demo

demo-fleet: install host-deps
	$(VENV)/bin/invoke demo-fleet

bench: install $(VENV)/.bench-installed host-deps
	$(PY) -m bench.run
	$(PY) -m bench.fleet
	$(PY) -m bench.router
	$(PY) -m bench.tune
	$(PY) -m bench.tune_group

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
