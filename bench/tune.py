"""`make bench` (tuning part, issue 30 point 4): what a tuning sweep's candidate costs beyond the server's own start
and the benchmark, on a sandbox guest of its own that is always stopped at the end. Figures are printed, never
asserted.

A sweep (deploy_lib.tune, as `invoke tune` runs it) over `memory.max_running_requests`, the benchmark sized small
(the figure is the tool's time around it, not the server's throughput). Per candidate, from the progress events
and the unit's journal: the candidate's whole time (its progress phase to the next one, or to the sweep's return),
the server's start (restart -> "fired up"), the benchmark (its progress phase), the ladder's grace window (a policy's
wait, 2 s of watching a Ready server, as every deploy's), and the rest: the tool's own overhead (stage, switch,
restart sent, readiness noticed, history). Target: the overhead without the grace window <= 1 s. Then, on a guest of
its own, the grid's throughput: caps 64 and 1,024 at concurrency 1,024 on the sandbox profile's own benchmark
(`--quick`: the small one, which only checks that it runs). Target: >= 3x. `--timeline`
prints each candidate's round trips (their first step's name, their count of steps) and progress phases in order,
with the time between them spent on this side.

    .venv/bin/python -m bench.tune [--candidates 2] [--quick] [--timeline]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import Rig, make_rig
from bench.run import guest_for_bench
from bench.timeline import StampedProgress, StampedRemote, ready_instant, restart_instant, say
from deploy_lib import tune as tuning
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import tune as commands_tune
from deploy_lib.commands import tune_request
from deploy_lib.commands.deploy import Options
from deploy_lib.commands.deploy import deploy as deploy_release
from deploy_lib.deploy.project import Target, load_for_host
from deploy_lib.patches import list_patch_sets
from deploy_lib.profile import LoadedProfile
from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
from sandbox import manage, wheelhouse

PROFILE = "bench-tune"
# The sandbox profile's benchmark, small: 64 prompts of 32 -> 8 tokens at one level (seconds, not a minute)
PROFILE_TEXT = ("extends: glm5-nvfp4-sandbox\nbench:\n  prompts: 64\n  input_len: 32\n  output_len: 8\n"
                "  concurrency: [64]\n")
LADDER = [64]  # one level of the sweep's ladder (its default climbs several)
CAPS = (256, 512, 1024, 128)  # max_running_requests of the candidates (the base serves 64)
OVERHEAD_S = 1.0
# The grid's throughput (moved here from tests/sandbox/test_tune_sandbox.py: a figure, not an assertion): caps 64 and
# 1,024 at concurrency 1,024 on the sandbox profile's own benchmark (1,024 prompts of 32 -> 32 tokens). The simulator's
# curve gives 4.25x; the benchmark client, one process on a loaded machine, costs the cap of 1,024 a little.
GRID_CAPS = (64, 1024)
GRID_LADDER = [1024]
GRID_LEAST = 3.0
SLOW_STEP_S = 0.03  # a step the timeline names


@dataclass(frozen=True)
class CandidateRun:
    label: str
    total_s: float
    server_start_s: float
    benchmark_s: float
    grace_s: float
    timeline: tuple[str, ...] = ()

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.server_start_s - self.benchmark_s - self.grace_s


def _phases(progress: StampedProgress, prefix: str) -> list[tuple[float, str]]:
    return [(at, str(name)) for at, kind, name in progress.events if kind == "phase" and str(name).startswith(prefix)]


def _between(progress: StampedProgress, kind: str, name: str, start: float, end: float) -> list[float]:
    return [at for at, event_kind, value in progress.events if event_kind == kind and value == name
            and start <= at <= end]


@dataclass
class TimedRemote(StampedRemote):
    """A StampedRemote that also keeps how long each step of each batch took on the host."""

    steps: dict[int, list[tuple[str, float]]] = field(default_factory=dict)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results = super().run(batch, on_output)
        self.steps[len(self.batches) - 1] = [(r.step.name, r.duration_s) for r in results]
        return results


def _slowest(steps: Sequence[tuple[str, float]]) -> str:
    slow = sorted((s for s in steps if s[1] >= SLOW_STEP_S), key=lambda s: -s[1])[:4]
    return "".join(f"; {name} {seconds:.3f} s" for name, seconds in slow)


def timeline(progress: StampedProgress, remote: TimedRemote, start: float, end: float) -> tuple[str, ...]:
    """The candidate's round trips and progress events in order, each line its offset from the candidate's start,
    what it was and, for a round trip, how long it took (and its slowest steps on the host); the time spent on
    this side between them in brackets."""
    events = [(b.started, f"trip {b.ended - b.started:.3f} s: {b.names[0]} ({len(b.names)} steps)"
               f"{_slowest(remote.steps.get(i, ()))}", b.ended)
              for i, b in enumerate(remote.batches) if start <= b.started <= end]
    events += [(at, f"{kind} {value}", at) for at, kind, value in progress.events
               if start <= at <= end and kind in ("phase", "done")]
    lines, busy_until = [], start
    for at, what, until in sorted(events):
        if at - busy_until > 0.005:
            lines.append(f"         [{at - busy_until:.3f} s on this side]")
        lines.append(f"{at - start:+7.3f}  {what}")
        busy_until = max(busy_until, until)
    if end - busy_until > 0.005:
        lines.append(f"         [{end - busy_until:.3f} s on this side]")
    return tuple(lines)


@contextmanager
def serving_rig(profile_text: str) -> Iterator[tuple[Rig, LoadedProfile, Target]]:
    """A guest of its own serving `profile_text` as PROFILE (its gate skipped: a sweep measures it as its base)."""
    with guest_for_bench(None) as guest, tempfile.TemporaryDirectory(prefix="sglang-bench-tune-") as work:
        house = wheelhouse.prepare()
        if not manage.guest_venv_is(guest, house):
            manage.build_guest_venv(guest, house)
        rig = make_rig(guest, Path(work), 0)
        (rig.project.root / "inventory" / "profiles" / f"{PROFILE}.yaml").write_text(profile_text)
        loaded, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
        with FabricRemote(target.ssh) as remote:
            deploy_release(loaded, target, remote, StampedProgress(), Options(skip_gate=True))
        yield rig, loaded, target


def sweep_request(caps: Sequence[int], ladder: list[int]) -> tune_request.Request:
    spec, sources = tuning.sweep_spec(None, [f"memory.max_running_requests={','.join(map(str, caps))}"],
                                      {"ladder": ladder})
    return tune_request.Request(spec, sources, tuple(list_patch_sets(ROLES_DIR)))


def measure_grid(quick: bool) -> tuple[int, dict[int, float]]:
    """The grid's level and objective (output tok/s) per cap; `quick`: the small benchmark, which only checks that it
    runs."""
    base = PROFILE_TEXT if quick else "extends: glm5-nvfp4-sandbox\n"
    ladder = LADDER if quick else GRID_LADDER
    with serving_rig(base + "memory:\n  max_running_requests: 64\n") as (_rig, loaded, target), \
            FabricRemote(target.ssh) as remote:
        report = commands_tune.tune(loaded, target, remote, StampedProgress(), sweep_request(GRID_CAPS, ladder))
    assert isinstance(report, tuning.TuneReport) and report.finished, report
    rows = {row.label: row for row in report.rows}
    return ladder[0], {cap: statistics.fmean(row.values) if row.values else 0.0
                       for cap in GRID_CAPS for row in [rows[f"memory.max_running_requests={cap}"]]}


def grid_line(level: int, objective: dict[int, float]) -> str:
    low, high = (objective[cap] for cap in GRID_CAPS)
    ratio = high / low if low > 0 else float("inf")
    verdict = "PASS" if ratio >= GRID_LEAST else "MISS"
    return (f"the grid at concurrency {level:,}: cap {GRID_CAPS[1]:,} {high:,.0f} tok/s, cap {GRID_CAPS[0]} "
            f"{low:,.0f} tok/s: {ratio:.2f}x ({verdict}, target >= {GRID_LEAST:g}x at {GRID_LADDER[0]:,}; the "
            "simulator's curve: 4.25x)")


def measure(candidates: int) -> tuple[list[CandidateRun], float]:
    """One sweep of `candidates` candidates on a guest of its own: each candidate's figures, and the sweep's wall."""
    with serving_rig(PROFILE_TEXT + "memory:\n  max_running_requests: 64\n") as (rig, loaded, target):
        request = sweep_request(CAPS[:candidates], LADDER)
        progress, cursor = StampedProgress(), rig.journal.cursor()
        started = time.time()
        stamped = TimedRemote(FabricRemote(target.ssh))
        try:
            report = commands_tune.tune(loaded, target, stamped, progress, request)
        finally:
            stamped.close()
        ended = time.time()
        assert isinstance(report, tuning.TuneReport) and report.finished, report
        entries = rig.journal.since(cursor)
    # a candidate ends where the next one starts, or the sweep switches (back to the best, to the winner), or returns
    marks = _phases(progress, "tune")
    runs = []
    for index, (at, name) in enumerate(marks):
        if not name.startswith(f"tune {report.tune_id}: candidate "):
            continue
        end = marks[index + 1][0] if index + 1 < len(marks) else ended
        restarted = restart_instant(entries, at)
        bench_started = _between(progress, "phase", "benchmark", at, end)
        bench_done = _between(progress, "done", "benchmark", at, end)
        grace_started = [when for when, kind, value in progress.events if kind == "phase"
                         and str(value).startswith("readiness: grace") and at <= when <= end]
        grace_done = _between(progress, "done", "readiness: grace", at, end)
        runs.append(CandidateRun(name.split(": ", 2)[-1], end - at, ready_instant(entries, restarted) - restarted,
                                 sum(b - a for a, b in zip(bench_started, bench_done, strict=True)),
                                 sum(b - a for a, b in zip(grace_started, grace_done, strict=True)),
                                 timeline(progress, stamped, at, end)))
    return runs, ended - started


def report_lines(runs: Sequence[CandidateRun], sweep_s: float) -> list[str]:
    lines = [f"{'candidate':<40}  {'total':>7}  {'start':>7}  {'bench':>7}  {'grace':>7}  {'overhead':>8}"]
    for run in runs:
        lines.append(f"{run.label:<40}  {run.total_s:>5.2f} s  {run.server_start_s:>5.2f} s  {run.benchmark_s:>5.2f} s"
                     f"  {run.grace_s:>5.2f} s  {run.overhead_s:>6.2f} s")
    median = statistics.median(run.overhead_s for run in runs)
    verdict = "PASS" if median <= OVERHEAD_S else "MISS"
    lines.append(f"a candidate's overhead (total - server start - benchmark - grace window), median of {len(runs)}: "
                 f"{median:.2f} s ({verdict}, target <= {OVERHEAD_S:g} s); with the grace window "
                 f"{statistics.median(run.overhead_s + run.grace_s for run in runs):.2f} s; the sweep "
                 f"{sweep_s:.1f} s in all (the base benchmarked twice first)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=3, choices=range(1, len(CAPS) + 1))
    parser.add_argument("--quick", action="store_true", help="one candidate: checks that it runs")
    parser.add_argument("--timeline", action="store_true", help="each candidate's round trips and phases in order")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the tune bench needs root (the sandbox guest is a systemd-nspawn machine)")
        return 2
    runs, sweep_s = measure(1 if options.quick else options.candidates)
    say(f"\ntuning sweep on a sandbox guest (load average {os.getloadavg()[0]:.1f}):")
    for line in report_lines(runs, sweep_s):
        say(f"  {line}")
    for run in runs if options.timeline else ():
        say(f"\n{run.label}:")
        for line in run.timeline:
            say(f"  {line}")
    say(f"\n{grid_line(*measure_grid(options.quick))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
