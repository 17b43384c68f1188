"""`make bench` (issue 41): the README's first sweep on a sandbox guest of its own, its `tune --dry-run` estimate
beside the time it took, and a sweep's switches of venv or patch set before and after tune's ordering (pure,
bench/sweep_switches.py).

The sweep is `tune --profile glm5-nvfp4-sandbox --vary memory.max_running_requests=64,1024 --vary
patches=none,fusion-sm120` with the default ladder and no spec, over a release serving the reference user's cap of
64 (as tests/sandbox/test_tune_readme_sweep_sandbox.py runs it): about half an hour on the sandbox. Its dry run is
asked twice: before the sweep, as a user sees it on a host that never ran these levels, and after it, once history
holds every level (the estimate of a second run, judged against the time the first took). `--quick`: two candidates
of one venv at one small level, which only checks that it runs.

    .venv/bin/python -m bench.readme_sweep [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.figures import Figure, seconds_figure, table
from bench.sweep_switches import GRIDS, switch_figures
from bench.timeline import StampedProgress, say
from bench.tune import serving_rig
from deploy_lib import tune as tuning
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import tune as commands_tune
from deploy_lib.commands import tune_request
from deploy_lib.deploy.project import load_for_host
from deploy_lib.health.downtime import Downtime
from deploy_lib.health.startup import duration_text
from deploy_lib.host.store import read_store_facts
from deploy_lib.patches import list_patch_sets
from deploy_lib.remote import FabricRemote
from deploy_lib.store import ACTIVATIONS, HistoryEntry
from deploy_lib.tune.estimate import Estimate

PROFILE = "glm5-nvfp4-sandbox"
SERVING = f"extends: {PROFILE}\nmemory:\n  max_running_requests: 64\n"  # what serves before the sweep
README_VARY = GRIDS["the README's first sweep"]
QUICK_VARY = ("memory.max_running_requests=64,128",)
QUICK_SPEC = {"ladder": [64], "bench": {"tokenizer": "/opt/sim-tokenizer", "prompts": 64, "input_len": 32,
                                        "output_len": 8}}
CLOSE_ENOUGH = 0.25  # an estimate within a quarter of the time the sweep took


@dataclass(frozen=True)
class SweepTime:
    options: str              # the sweep's `--vary` options
    before: Estimate          # the dry run's on the fresh guest
    after: Estimate           # the same dry run once the sweep had run
    measured_s: float         # the sweep's wall time, from its call to its report
    benchmark_s: float        # of it, its benchmarks (their progress phases)
    benchmarks: int
    starts_s: float           # of it, its starts (each one's downtime, as its deploy recorded it in history)
    starts: int
    levels_measured: int      # rows (the base's and each candidate's) with every level of the ladder measured
    rows: int


def estimate_text(estimate: Estimate) -> str:
    span = (duration_text(estimate.fewest_s) if estimate.fewest_s == estimate.most_s
            else f"{duration_text(estimate.fewest_s)}-{duration_text(estimate.most_s)}")
    reruns = f" and up to {estimate.reruns.most} re-runs" if estimate.reruns.most else ""
    levels = ", ".join(f"c{level.concurrency} {duration_text(level.seconds)}{'' if level.recorded else ' (default)'}"
                       for level in estimate.levels)
    return (f"{span}: {estimate.starts.text()} starts of {duration_text(estimate.start_s)}"
            f"{'' if estimate.start_samples else ' (default)'}, {estimate.runs} benchmarks{reruns} of "
            f"{duration_text(estimate.bench_s)} ({levels})")


def off_by(estimate: Estimate, measured_s: float) -> float:
    """How far the measured time lies outside the estimate's range, relative to it (0 inside it)."""
    nearest = min(max(measured_s, estimate.fewest_s), estimate.most_s)
    return nearest / measured_s - 1


def sweep_time_figures(run: SweepTime) -> list[Figure]:
    """The sweep's time beside its estimates; the one after the sweep judged: its range within CLOSE_ENOUGH of the
    time it took."""
    off = off_by(run.after, run.measured_s)
    return [
        Figure(f"sweep `tune {run.options}`: rows with every level measured",
               f"{run.levels_measured} of {run.rows}", 1, "all", run.levels_measured == run.rows),
        seconds_figure("  its time (tune called -> its report)", [run.measured_s], None),
        seconds_figure(f"  of it {run.benchmarks} benchmarks", [run.benchmark_s], None),
        seconds_figure(f"  of it {run.starts} starts (their downtime: the candidates', the switch at the end)",
                       [run.starts_s], None),
        seconds_figure("  the rest (venvs, stages, grace windows, the tool's steps)",
                       [run.measured_s - run.benchmark_s - run.starts_s], None),
        Figure("  its --dry-run estimate before, on a host that never ran its levels",
               f"{estimate_text(run.before)} ({off_by(run.before, run.measured_s):+.0%})", 1, "", None),
        Figure("  its --dry-run estimate after, once history holds its levels",
               f"{estimate_text(run.after)} ({off:+.0%})", 1, f"within {CLOSE_ENOUGH:.0%} of its time",
               abs(off) <= CLOSE_ENOUGH),
    ]


def _benchmarks(progress: StampedProgress) -> list[float]:
    started = [at for at, kind, name in progress.events if kind == "phase" and name == "benchmark"]
    done = [at for at, kind, name in progress.events if kind == "done" and name == "benchmark"]
    return [end - start for start, end in zip(started, done, strict=True)]


def sweep_request(quick: bool) -> tune_request.Request:
    """The README's first sweep as `tune` takes it (no spec: the default ladder); `quick`: the small one."""
    spec, sources = tuning.sweep_spec(None, QUICK_VARY if quick else README_VARY, dict(QUICK_SPEC) if quick else {})
    return tune_request.Request(spec, sources, tuple(list_patch_sets(ROLES_DIR)))


def measure(request: tune_request.Request) -> SweepTime:
    """The sweep of `request` on a guest of its own, with its dry run before and after."""
    with serving_rig(SERVING) as (rig, _serving, _target):
        loaded, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
        layout = target.layout(loaded.profile.service.name)

        def tune(dry_run: bool, progress: StampedProgress) -> tuning.TuneReport | tune_request.Planned:
            with FabricRemote(target.ssh) as remote:
                return commands_tune.tune(loaded, target, remote, progress, replace(request, dry_run=dry_run))

        def history() -> list[HistoryEntry]:
            with FabricRemote(target.ssh) as remote:
                return list(read_store_facts(remote, layout).history)

        before = tune(True, StampedProgress())
        assert isinstance(before, tune_request.Planned), before
        say(f"the sweep's dry run: {estimate_text(before.estimate)}")
        known = len(history())
        progress, started = StampedProgress(), time.time()
        report = tune(False, progress)
        measured_s = time.time() - started
        starts = [downtime.total_s for entry in history()[known:] if entry.event in ACTIVATIONS
                  and (downtime := Downtime.from_timings(entry.timings)) is not None]
        after = tune(True, StampedProgress())
    assert isinstance(report, tuning.TuneReport) and isinstance(after, tune_request.Planned), (report, after)
    rows = [row for row in (report.base, *report.rows) if row is not None]
    ladder = after.sweep.bench.concurrency
    benchmarks = _benchmarks(progress)
    return SweepTime(" ".join(request.sources.values()), before.estimate, after.estimate, measured_s,
                     sum(benchmarks), len(benchmarks), sum(starts), len(starts),
                     sum(row.outcome == "measured" and [level.concurrency for level in row.levels] == ladder
                         for row in rows), len(rows))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two candidates at one small level: checks that it runs")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the README sweep's bench needs root (the sandbox guest is a systemd-nspawn machine)")
        return 2
    run = measure(sweep_request(options.quick))
    say(f"\nthe README's first sweep on a sandbox guest (load average now {os.getloadavg()[0]:.1f}):\n")
    say(table([*switch_figures(), *sweep_time_figures(run)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
