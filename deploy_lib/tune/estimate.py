"""How long a sweep takes, from this host's history: the median of its recorded starts (a switch's downtime, else a
release's `ready` timing) and, level by level, the duration of the newest run of that level at the same lengths,
scaled to the prompts the level sends (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.health.downtime import DOWNTIME
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.store import HEALTHY, HistoryEntry

RERUNS = 2  # the top two, once each, when they are within the noise


@dataclass(frozen=True)
class LevelEstimate:
    """One level of the ladder: the prompts it sends and how long it will take."""

    concurrency: int
    prompts: int
    seconds: float | None  # None: this host never ran this level at these lengths


@dataclass(frozen=True)
class Estimate:
    starts: int                 # releases started: each candidate, then the switch to what serves at the end
    start_s: float | None       # median recorded start; None: no start recorded on this host
    start_samples: int
    runs: int                   # benchmarks: the base's runs, each candidate's, the re-runs at most
    levels: tuple[LevelEstimate, ...] = ()  # one benchmark's levels
    short_runs: int = 0         # search: halving: the short round's benchmarks, each ~short_fraction of a full one
    short_fraction: float = 1.0

    @property
    def bench_s(self) -> float | None:
        """One benchmark over the whole ladder; None when a level has no estimate."""
        seconds = [level.seconds for level in self.levels]
        return sum(s for s in seconds if s is not None) if seconds and None not in seconds else None

    @property
    def total_s(self) -> float | None:
        bench_s = self.bench_s
        if self.start_s is None or bench_s is None:
            return None
        return self.starts * self.start_s + (self.runs + self.short_runs * self.short_fraction) * bench_s


def recorded_start_s(history: Sequence[HistoryEntry]) -> tuple[float | None, int]:
    """The median start of this host's healthy starts (any profile), and how many there were: a start's downtime
    where it recorded one (what a candidate's switch costs, from the stop), else its time to ready."""
    durations = [e.timings.get(DOWNTIME) or e.timings["ready"] for e in history
                 if e.outcome == HEALTHY and e.timings.get("ready", 0) > 0]
    return (statistics.median(durations) if durations else None), len(durations)


def level_estimate(history: Sequence[HistoryEntry], settings: BenchSettings, concurrency: int) -> LevelEstimate:
    """The newest benchmark of this level at the same lengths and API (any prompts count), its duration scaled to
    the prompts this level sends: at one concurrency a run lasts in proportion to its requests."""
    prompts = settings.prompts_at(concurrency)
    lengths = {key: value for key, value in settings.identity().items()
               if key in ("settings.input_len", "settings.output_len", "settings.openai_api")}
    duration, completed = f"c{concurrency}.duration_s", f"c{concurrency}.completed"
    for entry in reversed(history):
        if entry.event not in ("bench", "tune") or not all(entry.figures.get(k) == v for k, v in lengths.items()):
            continue
        if entry.figures.get(completed, 0) > 0 and duration in entry.figures:
            return LevelEstimate(concurrency, prompts,
                                 round(entry.figures[duration] * prompts / entry.figures[completed], 1))
    return LevelEstimate(concurrency, prompts, None)


def estimate(history: Sequence[HistoryEntry], settings: BenchSettings, candidates: int, base_runs: int,
             survivors: int | None = None, short: BenchSettings | None = None) -> Estimate:
    """`survivors` and `short` for search: halving: every candidate runs `short`, the survivors (each switched to
    again) the full benchmark."""
    start_s, samples = recorded_start_s(history)
    full = candidates if survivors is None else survivors
    return Estimate(starts=candidates + 1 + (survivors or 0), start_s=start_s, start_samples=samples,
                    runs=base_runs + full + (RERUNS if full > 1 else 0),
                    levels=tuple(level_estimate(history, settings, c) for c in settings.concurrency),
                    short_runs=candidates if survivors is not None else 0,
                    short_fraction=short.output_len / settings.output_len if short else 1.0)
