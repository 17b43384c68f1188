"""The table bench/run.py prints: one Figure per row, with its target and PASS/MISS."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.measure import (
    LONG_STEP_S,
    PROFILE,
    ChangedRun,
    CrashRun,
    LongStepRun,
    NoOpRun,
    ProcessParts,
    ProcessRun,
    VenvRun,
)

# A real CUDA library wheel of a few hundred MB (351 MB), for what a wheel's size costs once it is cached
LARGE_WHEEL = ("nvidia-nccl-cu12", "2.32.3")


# ---------------------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    runs: int
    target: str
    passed: bool | None  # None: a figure shown for context, without a target

    def __post_init__(self) -> None:
        if bool(self.target) == (self.passed is None):
            raise ValueError(f"{self.name!r}: a target is printed only with its verdict ({self.target!r}, "
                             f"{self.passed!r})")

    def row(self) -> tuple[str, str, str, str, str]:
        verdict = "" if self.passed is None else ("PASS" if self.passed else "MISS")
        return self.name, self.value, str(self.runs), self.target, verdict


def seconds_figure(name: str, samples: Sequence[float], limit: float | None, target: str = "") -> Figure:
    median = statistics.median(samples)
    spread = f" ({min(samples):.2f}-{max(samples):.2f})" if len(samples) > 1 else ""
    return Figure(name, f"{median:.2f} s{spread}", len(samples), target or (f"<= {limit:g} s" if limit else ""),
                  None if limit is None else median <= limit)


def table(figures: Sequence[Figure]) -> str:
    rows = [("figure", "median (min-max)", "runs", "target", ""), *(figure.row() for figure in figures)]
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def part_figure(name: str, walls: Sequence[float], cpus: Sequence[float]) -> Figure:
    return Figure(name, f"{statistics.median(walls):.2f} s, CPU {statistics.median(cpus):.2f} s", len(walls), "",
                  None)


def process_figures(processes: Sequence[ProcessRun], parts: Sequence[ProcessParts]) -> list[Figure]:
    """The whole-process no-op and where its time goes: each part of bench/noop_parts.py, then what `invoke` adds
    (its command line parse, the output): the whole minus the parts, wall and CPU. Its one target, ahead of
    pyinfra in the same run, is judged beside pyinfra's figure (bench/peer.py)."""
    names = list(parts[0].parts)
    wall = {name: [run.parts[name][0] for run in parts] for name in names}
    cpu = {name: [run.parts[name][1] for run in parts] for name in names}
    round_trips = statistics.median(run.round_trips for run in parts)
    trips = f" ({round_trips:g} round trip{'' if round_trips == 1 else 's'})"
    rows = [part_figure(f"  - {name}" + (trips if "round trips" in name else ""), wall[name], cpu[name])
            for name in names]
    parts_wall = sum(statistics.median(values) for values in wall.values())
    parts_cpu = sum(statistics.median(values) for values in cpu.values())
    return [
        seconds_figure(f"no-op `invoke deploy --profile {PROFILE} --yes`, whole process",
                       [run.seconds for run in processes], None),
        seconds_figure("  the process's own CPU time (user + sys)", [run.cpu_s for run in processes], None),
        *rows,
        part_figure("  - the rest: invoke's command line parse, the output (whole - parts)",
                    [run.seconds - parts_wall for run in processes], [run.cpu_s - parts_cpu for run in processes]),
    ]


def long_step_figure(runs: Sequence[LongStepRun]) -> Figure:
    cpu = statistics.median(run.cpu_s for run in runs)
    share = statistics.median(run.cpu_s / run.seconds for run in runs)
    return Figure(f"client's CPU while one {LONG_STEP_S:g} s remote step runs (a build, a download)",
                  f"{cpu:.3f} s ({share:.1%} of the step)", len(runs), "", None)


def deploy_figures(no_ops: Sequence[NoOpRun], processes: Sequence[ProcessRun], parts: Sequence[ProcessParts],
                   changed: Sequence[ChangedRun], crashes: Sequence[CrashRun],
                   long_steps: Sequence[LongStepRun]) -> list[Figure]:
    round_trips = statistics.median(run.round_trips for run in no_ops)
    plural = "" if round_trips == 1 else "s"
    phases = {name: statistics.median(run.phases.get(name, 0.0) for run in changed) for name in changed[0].phases}
    return [
        seconds_figure(f"no-op redeploy (one SSH connection, {round_trips:g} round trip{plural})",
                       [run.seconds for run in no_ops], 1.0),
        *process_figures(processes, parts),
        seconds_figure("changed deploy, total", [run.total_s for run in changed], None),
        seconds_figure("  server's own start (restart -> fired up)", [run.server_start_s for run in changed], None),
        # the grace window is a policy's wait (GRACE_S), not the tool's overhead: targets judge the time around it
        seconds_figure("  tool's own time (total - server start), the grace window included",
                       [run.tool_s for run in changed], None),
        seconds_figure("  tool's own time without the grace window",
                       [run.tool_s - run.grace_s for run in changed], 1.0),
        seconds_figure("  - before the restart (connect, facts, stage, switch)",
                       [run.before_restart_s for run in changed], None),
        seconds_figure("  - restart sent -> systemd's job starts (enable; daemon-reload only for another unit text)",
                       [run.restart_to_job_s for run in changed], None),
        seconds_figure("  - readiness noticed (fired up -> Ready verdict)", [run.ready_noticed_s for run in changed],
                       0.3),
        seconds_figure("    of it the server answering the one real generation", [run.generation_s for run in changed],
                       None),
        seconds_figure("  - the ladder's grace window after Ready", [run.grace_s for run in changed], None),
        seconds_figure("  - ladder returned -> deploy returned (history, prune)",
                       [run.ladder_to_return_s for run in changed], None),
        Figure("  phases (Outcome.timings); round trips",
               " ".join(f"{name} {value:.2f}" for name, value in phases.items())
               + f"; {statistics.median(run.round_trips for run in changed):g} round trips", len(changed), "", None),
        Figure("  systemctl daemon-reload sent (env changed, same unit settings)",
               str(max(run.daemon_reloads for run in changed)), len(changed), "0",
               all(run.daemon_reloads == 0 for run in changed)),
        seconds_figure("crash noticed (process exit -> ladder raised)", [run.noticed_s for run in crashes], 1.0),
        seconds_figure("rollback, total (ladder raised -> rolled back)", [run.rollback_s for run in crashes], None),
        seconds_figure("  previous release's start (restart -> fired up)", [run.previous_start_s for run in crashes],
                       None),
        seconds_figure("  rollback minus the previous release's start", [run.rollback_s - run.previous_start_s
                                                                         for run in crashes], None),
        seconds_figure("  - of it the restored release's grace window after Ready", [run.grace_s for run in crashes],
                       None),
        seconds_figure("  rollback minus the previous release's start and the grace window",
                       [run.rollback_s - run.previous_start_s - run.grace_s for run in crashes], 1.0,
                       "start + grace + <= 1 s"),
        long_step_figure(long_steps),
    ]


@dataclass(frozen=True)
class VenvRuns:
    unchanged: Sequence[VenvRun]   # the built lock again
    changed: Sequence[VenvRun]     # one flashinfer-python wheel swapped, each a new venv
    changed_wheels: Sequence[Path]
    fresh: Sequence[VenvRun]       # the reference lock's venv removed and built again: every wheel in uv's cache
    large_first: VenvRun           # the reference lock plus the large wheel: sent, unpacked into the cache once
    large_fresh: Sequence[VenvRun]  # that venv removed and built again
    large_bytes: int


def venv_figures(runs: VenvRuns) -> list[Figure]:
    only_that_wheel = all(run.wheels_sent == (wheel.name,) and run.bytes_sent == wheel.stat().st_size
                          for run, wheel in zip(runs.changed, runs.changed_wheels, strict=True))
    sent = statistics.median(run.bytes_sent for run in runs.changed)
    round_trips = statistics.median(run.round_trips for run in runs.unchanged)
    fresh, large = statistics.median(r.seconds for r in runs.fresh), statistics.median(r.seconds for r in
                                                                                        runs.large_fresh)
    # "does not grow with size": the large wheel's share is within the spread of the fresh builds themselves
    spread = max(max(samples) - min(samples) for samples in ([r.seconds for r in runs.fresh],
                                                              [r.seconds for r in runs.large_fresh]))
    size = f"{runs.large_bytes / 1e6:.0f} MB"
    return [
        Figure("venv, unchanged lock: wheels / bytes sent / round trips (inside the deploy's lock)",
               f"{max(len(run.wheels_sent) for run in runs.unchanged)} / "
               f"{max(run.bytes_sent for run in runs.unchanged)} B / {round_trips:g}", len(runs.unchanged),
               "0 wheels, 1 round trip", all(not run.wheels_sent for run in runs.unchanged) and round_trips == 1),
        seconds_figure("venv, unchanged lock: ensure_venv", [run.seconds for run in runs.unchanged], 1.0),
        Figure("venv, one package changed: wheels / bytes sent",
               f"{max(len(run.wheels_sent) for run in runs.changed)} / {sent / 1e6:.1f} MB", len(runs.changed),
               "only that wheel", only_that_wheel),
        seconds_figure("venv, one package changed: ensure_venv, end to end (uv)", [run.seconds for run in runs.changed],
                       3.0),
        seconds_figure("venv, fresh venv of the reference wheelhouse, warm host cache (uv)",
                       [run.seconds for run in runs.fresh], 5.0),
        seconds_figure(f"venv, reference + {LARGE_WHEEL[0]} ({size}): first build (send, unpack once)",
                       [runs.large_first.seconds], None),
        seconds_figure(f"venv, reference + {LARGE_WHEEL[0]} ({size}): fresh venv, warm cache",
                       [run.seconds for run in runs.large_fresh], None),
        Figure(f"  the {size} wheel's share of a fresh venv once cached", f"{large - fresh:+.2f} s", len(runs.fresh),
               f"does not grow with size: <= the runs' spread, {spread:.2f} s", large - fresh <= spread),
    ]

