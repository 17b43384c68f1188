# make test : install everything into .venv (and the host tools the sandbox needs), lint, build the guide, run every test
# make docs : build the user guide (docs/, mkdocs.yml) in strict mode into site/
# make demo : bring the sandbox VM up and deploy the reference profile to it
# make demo-fleet: three sandbox guests in group `sandbox`: a parallel deploy, a rolling one stopped at --max-fail,
#   one multi-node server over the three as one release
# make bench: print the performance figures (no timed assertions anywhere in tests)
SHELL := /bin/bash
VENV  ?= .venv
BENCH_VENV := .venv-bench
PY    := $(VENV)/bin/python
# Test modules run in parallel, each whole on one worker (its module-scoped guest with it); the sandbox tests mostly
# wait on guests, so more workers than cores pay off. --durations=10 prints the slowest ten.
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=10
export SGLANG_DEPLOY_CACHE ?= /var/tmp/sglang-deploy-cache

.PHONY: test test-fast docs demo demo-fleet bench lint install bench-venv host-deps clean

$(VENV)/.installed: pyproject.toml
	@python3 -m venv --help >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# invoke runs without writing bytecode: compiled once here, so a command in the checkout does not recompile each
	$(PY) -m compileall -q deploy_lib deploy_cli tasks.py
	touch $@

install: $(VENV)/.installed

# pyinfra, the peer bench/peer.py runs beside ours (a program of its own, through a subprocess), in an environment of
# its own: it caps paramiko below 5, and the suite runs against the paramiko a user's `pip install` gets
$(BENCH_VENV)/.installed: bench/requirements.txt | $(VENV)/.installed  # after it: python3-venv is ensured there
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -r bench/requirements.txt
	touch $@

bench-venv: $(BENCH_VENV)/.installed

host-deps:
	bash sandbox/testhost.sh deps-if-missing

# mypy checks the wiring between modules (what it covers and how strictly: [tool.mypy] in pyproject.toml)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# the user guide as a site (mkdocs.yml): strict, so a page left out of nav, a link to a missing page or heading fails.
# Not --quiet: mkdocs 1.6 then no longer counts the warnings, and a broken link passes strict mode
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

# the sandbox's quick run of bench.run runs the peer (tests/sandbox/test_bench_modules_sandbox.py)
test: install bench-venv host-deps lint docs
	$(PYTEST)

test-fast: install lint docs
	$(PYTEST) -m "not sandbox"

demo: install host-deps
	$(VENV)/bin/invoke demo

demo-fleet: install host-deps
	$(VENV)/bin/invoke demo-fleet

bench: install bench-venv host-deps
	$(PY) -m bench.run
	$(PY) -m bench.fleet
	$(PY) -m bench.router
	$(PY) -m bench.tune
	$(PY) -m bench.tune_group
	$(PY) -m bench.readme_sweep
	$(PY) -m bench.workload

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .ruff_cache .mypy_cache site
