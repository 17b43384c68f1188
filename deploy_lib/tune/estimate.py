"""How long a sweep takes, from this host's history: the median of its recorded start times (a release's `ready`
timing) and the duration of a benchmark at the same settings and levels (pure)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.profile.settings import BenchSettings
from deploy_lib.store import HEALTHY, HistoryEntry

RERUNS = 2  # the top two, once each, when they are within the noise


@dataclass(frozen=True)
class Estimate:
    starts: int                 # releases started: each candidate, then the switch to what serves at the end
    start_s: float | None       # median recorded start; None: no start recorded on this host
    start_samples: int
    runs: int                   # benchmarks: the base's runs, each candidate's, the re-runs at most
    bench_s: float | None       # one benchmark over the whole ladder; None: never run at these settings
    short_runs: int = 0         # search: halving: the short round's benchmarks, each ~short_fraction of a full one
    short_fraction: float = 1.0

    @property
    def total_s(self) -> float | None:
        if self.start_s is None or self.bench_s is None:
            return None
        return self.starts * self.start_s + (self.runs + self.short_runs * self.short_fraction) * self.bench_s


def recorded_start_s(history: Sequence[HistoryEntry]) -> tuple[float | None, int]:
    """The median time to ready of this host's healthy starts (any profile), and how many there were."""
    durations = [e.timings["ready"] for e in history if e.outcome == HEALTHY and e.timings.get("ready", 0) > 0]
    return (statistics.median(durations) if durations else None), len(durations)


def recorded_bench_s(history: Sequence[HistoryEntry], settings: BenchSettings) -> float | None:
    """The newest benchmark at these settings with every level of the ladder: the sum of its levels' durations."""
    keys = [f"c{level}.duration_s" for level in settings.concurrency]
    for entry in reversed(history):
        if entry.event not in ("bench", "tune") or not entry.figures:
            continue
        same = all(entry.figures.get(k) == v for k, v in settings.identity().items())
        if same and all(key in entry.figures for key in keys):
            return sum(entry.figures[key] for key in keys)
    return None


def estimate(history: Sequence[HistoryEntry], settings: BenchSettings, candidates: int, base_runs: int,
             survivors: int | None = None, short: BenchSettings | None = None) -> Estimate:
    """`survivors` and `short` for search: halving: every candidate runs `short`, the survivors (each switched to
    again) the full benchmark."""
    start_s, samples = recorded_start_s(history)
    full = candidates if survivors is None else survivors
    return Estimate(starts=candidates + 1 + (survivors or 0), start_s=start_s, start_samples=samples,
                    runs=base_runs + full + (RERUNS if full > 1 else 0), bench_s=recorded_bench_s(history, settings),
                    short_runs=candidates if survivors is not None else 0,
                    short_fraction=short.output_len / settings.output_len if short else 1.0)
