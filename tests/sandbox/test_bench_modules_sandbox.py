"""Every module `make bench` runs, run as `make bench` runs it (a fresh `python -m bench.X`) in its quick mode (one
run, the smallest sizes), each on sandbox guests of its own: a changed signature between deploy_lib and bench breaks
this test, not a user's `make bench` (issue 30: bench/router.py had crashed unseen at its third module).

No figure is judged here (no timed assertions: `make bench` prints them); each run must end with exit 0 and print
the rows a reader looks for, pyinfra's beside ours included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]
REPO = Path(__file__).resolve().parents[2]


def run_quick(module: str, *options: str) -> str:
    """`python -m MODULE --quick OPTIONS` from the checkout; its output, or a failure with the run's tail."""
    done = subprocess.run([sys.executable, "-m", module, "--quick", *options], cwd=REPO, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, f"{module} --quick exited {done.returncode}:\n{done.stdout[-4000:]}\n" \
                                 f"{done.stderr[-4000:]}"
    return done.stdout


def test_bench_run_quick_prints_every_group_with_pyinfra_beside_ours() -> None:
    output = run_quick("bench.run")
    # the whole-process rows: "the rest" is the whole minus the parts a fresh bench.noop_parts process measured
    for row in ("peer: no-op whole process (ours | pyinfra | ratio)", "floor on the same guest", "the rest: invoke's",
                "peer: changed deploy's own time", "peer: readiness noticed", "crash noticed",
                "venv, unchanged lock", "model staging", "the tool's share (the old server's stop, systemd",
                "page cache dropped | after the pre-read"):
        assert row in output, f"`bench.run --quick` printed no row {row!r}:\n{output[-4000:]}"


def test_bench_fleet_quick_prints_own_time_cpu_and_round_trips_per_host() -> None:
    output = run_quick("bench.fleet")
    assert "own time, 2 hosts / one" in output and "trips/host" in output, output[-4000:]
    assert "a changed deploy's parts per host" in output and "to restart" in output, output[-4000:]


def test_bench_router_quick_prints_failed_requests_during_the_rollout() -> None:
    """Failed before: bench/router.py called behind_router with its old argument order (TypeError in StoreLayout)."""
    output = run_quick("bench.router")
    assert "failed (" in output and "added p99 latency" in output, output[-4000:]


def test_bench_tune_quick_prints_a_candidates_overhead() -> None:
    output = run_quick("bench.tune")
    assert "a candidate's overhead (total - server start - benchmark - grace window)" in output, output[-4000:]
    assert "the grid at concurrency 64: cap 1,024" in output, output[-4000:]


def test_bench_tune_group_quick_prints_the_group_against_one_host() -> None:
    output = run_quick("bench.tune_group")
    assert "group / one host:" in output, output[-4000:]


def test_bench_readme_sweep_quick_prints_the_estimate_beside_the_time_and_the_switches() -> None:
    output = run_quick("bench.readme_sweep")
    for row in ("its --dry-run estimate after, once history holds its levels", "its time (tune called -> its report)",
                "sweep's switches of venv or patch set, grid order -> tune's: the README's first sweep"):
        assert row in output, f"`bench.readme_sweep --quick` printed no row {row!r}:\n{output[-4000:]}"


def test_bench_workload_quick_prints_the_release_on_the_default_benchmark_and_on_its_workload() -> None:
    output = run_quick("bench.workload")
    assert "default benchmark: " in output and "\nworkload served: " in output, output[-4000:]
    assert "default benchmark and workload served, side by side" in output, output[-4000:]
