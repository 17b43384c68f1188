"""Every module `make bench` runs has its quick run in tests/sandbox/test_bench_modules_sandbox.py, and every bench
module that runs as a program is one of them or is started by one (issue 30: bench/router.py had crashed unseen at
the third module of `make bench`). A module added to the Makefile's bench target without a quick test fails here,
without a guest."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
