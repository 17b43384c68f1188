"""Benchmarks in history.jsonl (event "bench"): the baseline (the last good release's figures at the same
settings), the newest benchmark of a release, power and throughput per release, comparisons of two releases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from deploy_lib.errors import ConfigError
from deploy_lib.profile.settings import OPTIONAL_KEYS, WORKLOAD_KEY, BenchSettings, measured_on
from deploy_lib.store import (
    ACTIVATIONS,
    FAILED,
    HEALTHY,
    HistoryEntry,
    Tags,
    history_entry,
)
from deploy_lib.throughput.gate import GateVerdict
from deploy_lib.throughput.results import BenchResult, ratio

# The lines that carry a release's benchmark figures: `invoke bench` and the gate's, and a sweep's runs (`invoke tune`).
MEASURED = ("bench", "tune")


def last_good_release(history: Sequence[HistoryEntry], exclude: str | None = None) -> str | None:
    """The newest release that a start (deploy, rollback, adopt, start, restart) recorded healthy, but `exclude`."""
    for entry in reversed(history):
        if entry.event in ACTIVATIONS and entry.outcome == HEALTHY and entry.tags.release != exclude:
            return entry.tags.release
    return None


def _newest_bench(history: Sequence[HistoryEntry], release_id: str) -> HistoryEntry | None:
    """The newest `bench` line of a release that has figures."""
    return next((entry for entry in reversed(history)
                 if entry.event in MEASURED and entry.tags.release == release_id and entry.figures), None)


def _result(entry: HistoryEntry) -> BenchResult:
    """A benchmark rebuilt from its history line."""
    return BenchResult.from_figures(entry.tags.release, entry.figures,
                                    error=None if entry.outcome == HEALTHY else entry.cause or "failed")


def gpu_power(figures: Mapping[str, float]) -> str:
    """Power drawn during a benchmark, over all GPUs: `222 W mean, 250 W peak of 600 W`; '' without telemetry."""
    def values(metric: str) -> list[float]:
        return [value for key, value in figures.items() if key.startswith("gpu") and key.endswith(f".{metric}")]
    means, peaks, limits = values("power_mean_w"), values("power_peak_w"), values("power_limit_w")
    if not means:
        return ""
    limit = f" of {max(limits):.0f} W" if limits else ""
    peak = f", {max(peaks):.0f} W peak" if peaks else ""
    return f"{sum(means) / len(means):.0f} W mean{peak}{limit}"


def power_by_release(history: Sequence[HistoryEntry]) -> dict[str, str]:
    """Each release's GPU power during its newest benchmark (for `invoke releases`)."""
    releases = {entry.tags.release for entry in history if entry.event in MEASURED}
    return {release: gpu_power(entry.figures) for release in releases
            if (entry := _newest_bench(history, release)) is not None}


def find_baseline(history: Sequence[HistoryEntry], settings: BenchSettings, new_release: str) -> BenchResult | None:
    """The last good release's newest passing benchmark at the same settings and levels, or None."""
    release = last_good_release(history, exclude=new_release)
    if release is None:
        return None
    for entry in reversed(history):
        if entry.event != "bench" or entry.tags.release != release or entry.outcome != HEALTHY:
            continue
        identity = settings.identity()
        same = all(entry.figures.get(key) == value for key, value in identity.items()) and not any(
            key in entry.figures and key not in identity for key in OPTIONAL_KEYS)
        result = BenchResult.from_figures(release, entry.figures)
        if same and sorted(level.concurrency for level in result.levels) == sorted(settings.concurrency):
            return result
    return None


def bench_history_entry(result: BenchResult, verdict: GateVerdict | None, tags: Tags, when: datetime) -> HistoryEntry:
    """The history line of one benchmark: healthy if it ran (and passed the gate, when there was one)."""
    passed = result.ok and (verdict is None or verdict.passed)
    cause = verdict.message if verdict is not None else (result.error or "")
    return history_entry("bench", HEALTHY if passed else FAILED, tags, when, cause, figures=result.figures())


def throughput_by_release(history: Sequence[HistoryEntry], workload_names: Sequence[str] = ()) -> dict[str, str]:
    """Each release's newest benchmark as one line (for `invoke releases`), with the workload it was measured on
    (named from `workload_names`, the project's recorded ones) where it is not the default benchmark."""
    def line(entry: HistoryEntry) -> str:
        on = measured_on(entry.figures, workload_names)
        return _result(entry).summary() + ("" if on == "default" else f" on {on}")

    releases = {entry.tags.release for entry in history if entry.event in MEASURED}
    return {release: line(entry) for release in releases if (entry := _newest_bench(history, release)) is not None}


@dataclass(frozen=True)
class ComparisonRow:
    """One figure of every compared release, in the order they were given."""

    label: str
    values: tuple[float | None, ...]

    @property
    def ratios(self) -> tuple[float | None, ...]:
        """Each release's value over the first release's (the first is 1.0, or None without a value)."""
        return tuple(ratio(value, self.values[0]) for value in self.values)


_COMPARED = (("output_tok_s", "output tok/s"), ("ttft_mean_ms", "mean TTFT ms"), ("ttft_median_ms", "median TTFT ms"),
             ("ttft_p99_ms", "p99 TTFT ms"), ("itl_mean_ms", "mean ITL ms"), ("itl_median_ms", "median ITL ms"),
             ("itl_p99_ms", "p99 ITL ms"))


def compare(results: Sequence[BenchResult]) -> list[ComparisonRow]:
    """Side by side, per concurrency level any ran, with each one's ratio to the first (`invoke bench --compare A
    --compare B [--compare C ...]`)."""
    figures = [result.figures() for result in results]
    levels = sorted({level.concurrency for result in results for level in result.levels})
    return [ComparisonRow(f"c={c} {label}", tuple(each.get(f"c{c}.{key}") for each in figures))
            for c in levels for key, label in _COMPARED]


def comparison_records(results: Sequence[BenchResult], rows: Sequence[ComparisonRow]) -> list[dict[str, object]]:
    """The comparison as flat records (one per release and figure) for CSV and JSON."""
    return [{"release": result.release_id, "figure": row.label, "value": row.values[index],
             "ratio_to_first": row.ratios[index]} for row in rows for index, result in enumerate(results)]


def compare_releases(history: Sequence[HistoryEntry], releases: Sequence[str], workload_names: Sequence[str] = ()
                     ) -> tuple[list[BenchResult], list[ComparisonRow]]:
    """Each release's newest benchmark from history, side by side; ConfigError names a release without one, or
    releases whose newest benchmarks were measured on different workloads (named from `workload_names`, the
    project's recorded ones): their figures are not compared."""
    if len(releases) < 2:
        raise ConfigError(f"a comparison needs two releases or more, got {len(releases)}",
                          "`invoke bench --compare A --compare B` (repeat --compare for more)")
    entries = []
    for release in releases:
        found = _newest_bench(history, release)
        if found is None:
            known = sorted({entry.tags.release for entry in history if entry.event in MEASURED and entry.figures})
            raise ConfigError(f"release {release} has no benchmark in history",
                              f"benchmarked releases: {', '.join(known) or 'none'}; `invoke bench` runs one")
        entries.append(found)
    if len({entry.figures.get(WORKLOAD_KEY) for entry in entries}) > 1:
        measured = ", ".join(f"{entry.tags.release} on {measured_on(entry.figures, workload_names)}"
                             for entry in entries)
        raise ConfigError(f"the releases' newest benchmarks were measured on different workloads ({measured}); "
                          "figures are compared only when measured on the same one",
                          "benchmark each release on the same one (the profile's bench.workload), then compare")
    results = [_result(entry) for entry in entries]
    return results, compare(results)
