"""Every module `make bench` runs has its quick run in tests/sandbox/test_bench_modules_sandbox.py, and every bench
module that runs as a program is one of them or is started by one (issue 30: bench/router.py had crashed unseen at
the third module of `make bench`). A module added to the Makefile's bench target without a quick test fails here,
without a guest."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bench.readme_sweep import sweep_request
from deploy_lib.tune.spec import DEFAULT_LADDER

REPO = Path(__file__).resolve().parent.parent
QUICK_TESTS = REPO / "tests" / "sandbox" / "test_bench_modules_sandbox.py"
# the bench program `make bench` does not run itself: bench.run starts it, a fresh process per no-op's parts
# (bench/measure.py), and its quick run checks those rows; bench/peer_deploy.py is pyinfra's deploy file, no program
STARTED_BY_BENCH_RUN = {"bench.noop_parts"}


def make_bench_modules() -> list[str]:
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, "the Makefile has no bench target"
    return re.findall(r"\$\(PY\) -m (bench\.\w+)", recipe.group(1))


def quick_run_modules() -> list[str]:
    tree = ast.parse(QUICK_TESTS.read_text())
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "run_quick"
            and isinstance(node.args[0], ast.Constant)]


def test_each_module_make_bench_runs_has_a_quick_run_on_the_sandbox() -> None:
    modules = make_bench_modules()
    assert "bench.run" in modules, modules
    assert sorted(quick_run_modules()) == sorted(modules)


def test_every_bench_program_is_run_by_make_bench_or_started_by_bench_run() -> None:
    programs = {f"bench.{path.stem}" for path in (REPO / "bench").glob("*.py")
                if 'if __name__ == "__main__":' in path.read_text()}
    assert programs == set(make_bench_modules()) | STARTED_BY_BENCH_RUN


def test_make_bench_sweeps_the_readmes_first_grid_with_the_default_ladder_and_only_its_quick_run_is_small() -> None:
    """Issue 41: `make bench` prints the dry-run estimate of the README's first sweep beside the time it took: the
    sweep as a user types it, no spec (every level of the default ladder, the profile's benchmark)."""
    full = sweep_request(quick=False).spec
    assert full is not None and full.bench is None and full.ladder == list(DEFAULT_LADDER)
    assert full.vary == {"memory.max_running_requests": [64, 1024], "patches": ["none", "fusion-sm120"]}
    quick = sweep_request(quick=True).spec
    assert quick is not None and quick.ladder != list(DEFAULT_LADDER) and quick.bench is not None
