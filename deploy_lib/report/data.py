"""What a host's report shows, collected from its history.jsonl (pure: no host, no plotting): benchmarks over time,
throughput against concurrency, GPU power and utilisation during each benchmark, start phases, each switch's
downtime, crashes and restarts; each table also as rows for CSV and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from deploy_lib.errors import ConfigError
from deploy_lib.health.downtime import Downtime
from deploy_lib.health.startup import PHASES, RUNG_PREFIX, recorded_phases
from deploy_lib.metrics.workload import Workload
from deploy_lib.profile.settings import measured_on
from deploy_lib.report.served import BenchFigures, ServedRow, served_rows
from deploy_lib.store import ACTIVATIONS, FAILED, HistoryEntry
from deploy_lib.throughput import BenchResult

Row = dict[str, Any]


@dataclass(frozen=True)
class BenchPoint:
    """One benchmark at one concurrency level."""

    when: str
    release: str
    profile: str
    sglang: str
    outcome: str  # healthy, or failed (the gate rejected it, or it did not run to the end)
    cause: str
    benchmark: str  # what it was measured on: default, or workload NAME (settings.measured_on)
    concurrency: int
    output_tok_s: float
    ttft_p99_ms: float | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU during one benchmark, as the sampler recorded it."""

    when: str
    release: str
    gpu: int
    power_mean_w: float | None
    power_peak_w: float | None
    power_limit_w: float | None
    util_mean_pct: float | None


@dataclass(frozen=True)
class StartRow:
    """One start of a release and its phases (None: unknown, its log line was not seen)."""

    when: str
    release: str
    event: str
    outcome: str
    ready_s: float | None
    init: float | None
    weights: float | None
    kv_cache: float | None
    cuda_graphs: float | None
    warmup: float | None
    first_generation: float | None

    def phases(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in PHASES}


@dataclass(frozen=True)
class DowntimeRow:
    """One switch that stopped a running server: how long the endpoint did not answer (health/downtime.py), and which
    part of it was the new server's own start and which the tool's."""

    when: str
    release: str  # the release switched to
    event: str
    downtime_s: float
    server_s: float
    tool_s: float

    @classmethod
    def of(cls, entry: HistoryEntry) -> DowntimeRow | None:
        """None for a switch with no downtime recorded (no server ran before it, or written before downtimes were)."""
        downtime = Downtime.from_timings(entry.timings)
        if downtime is None:
            return None
        return cls(entry.when, entry.tags.release, entry.event, downtime.total_s, downtime.server_s, downtime.tool_s)


@dataclass(frozen=True)
class HistoryEvent:
    """One history line on a time line: a failed release (a start or its benchmark) or a rollback, marked on the
    benchmarks' chart; or a start, failure, crash or stop on the host's events chart."""

    when: str
    release: str
    event: str
    outcome: str
    cause: str

    @classmethod
    def of(cls, entry: HistoryEntry) -> HistoryEvent:
        return cls(entry.when, entry.tags.release, entry.event, entry.outcome, entry.cause)


@dataclass(frozen=True)
class ReportData:
    host: str
    service: str
    generated_at: str
    benchmarks: tuple[BenchPoint, ...]
    marks: tuple[HistoryEvent, ...]
    concurrency: tuple[BenchPoint, ...]  # the chosen releases' newest benchmark, every level
    gpus: tuple[GpuReading, ...]
    starts: tuple[StartRow, ...]
    downtimes: tuple[DowntimeRow, ...]
    events: tuple[HistoryEvent, ...]
    served: tuple[ServedRow, ...] = ()  # each release's live traffic beside its newest benchmark

    def tables(self) -> dict[str, list[Row]]:
        """Every table as rows of plain values (the CSV files and the JSON document)."""
        return {name: [asdict(row) for row in getattr(self, name)] for name in TABLES}


TABLES: tuple[str, ...] = ("benchmarks", "marks", "concurrency", "gpus", "starts", "downtimes", "events", "served")
COLUMNS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in fields(kind)) for name, kind in
    (("benchmarks", BenchPoint), ("marks", HistoryEvent), ("concurrency", BenchPoint), ("gpus", GpuReading),
     ("starts", StartRow), ("downtimes", DowntimeRow), ("events", HistoryEvent), ("served", ServedRow))}
TIMELINE_EVENTS = (*ACTIVATIONS, "failure", "crash", "stop")


def _bench_points(entry: HistoryEntry, workload_names: Sequence[str]) -> list[BenchPoint]:
    result = BenchResult.from_figures(entry.tags.release, entry.figures)
    return [BenchPoint(when=entry.when, release=entry.tags.release, profile=entry.tags.profile,
                       sglang=entry.tags.versions.get("sglang", ""), outcome=entry.outcome, cause=entry.cause,
                       benchmark=measured_on(entry.figures, workload_names), concurrency=level.concurrency,
                       output_tok_s=level.output_tok_s, ttft_p99_ms=level.ttft.p99_ms)
            for level in result.levels]


def gpu_readings(entry: HistoryEntry) -> list[GpuReading]:
    indices = sorted({int(key[3:].split(".", 1)[0]) for key in entry.figures
                      if key.startswith("gpu") and key[3:].split(".", 1)[0].isdigit()})

    def value(index: int, metric: str) -> float | None:
        return entry.figures.get(f"gpu{index}.{metric}")

    return [GpuReading(when=entry.when, release=entry.tags.release, gpu=index,
                       power_mean_w=value(index, "power_mean_w"), power_peak_w=value(index, "power_peak_w"),
                       power_limit_w=value(index, "power_limit_w"), util_mean_pct=value(index, "util_mean_pct"))
            for index in indices]


def _start_row(entry: HistoryEntry) -> StartRow | None:
    """A start that recorded any phase or rung time; one recorded before they were has nothing to show."""
    phases = recorded_phases(entry.timings)
    if all(value is None for value in phases.values()) and not any(k.startswith(RUNG_PREFIX) for k in entry.timings):
        return None
    return StartRow(when=entry.when, release=entry.tags.release, event=entry.event, outcome=entry.outcome,
                    ready_s=entry.timings.get("ready"), **phases)


def _newest_benches(points: Sequence[BenchPoint]) -> dict[str, BenchFigures]:
    """Each release's newest benchmark at its highest level (a benchmark's levels share its `when`)."""
    newest: dict[str, BenchPoint] = {}
    for point in points:  # oldest first
        known = newest.get(point.release)
        if known is None or point.when > known.when or (point.when == known.when
                                                         and point.concurrency > known.concurrency):
            newest[point.release] = point
    return {release: BenchFigures(p.concurrency, p.output_tok_s, p.ttft_p99_ms, p.benchmark)
            for release, p in newest.items()}


def collect(history: Sequence[HistoryEntry], host: str, service: str, generated_at: str,
            releases: Sequence[str] = (), workloads: Sequence[Workload] = ()) -> ReportData:
    """The report's tables from a host's history, oldest first; `releases` picks the lines of the throughput-vs-
    concurrency chart (default: every benchmarked release); `workloads`: the project's recorded workloads (those
    read on this host are served traffic). ConfigError names a chosen release never benchmarked."""
    benches = [entry for entry in history if entry.event == "bench" and entry.figures]
    points = [point for entry in benches for point in _bench_points(entry, [w.name for w in workloads])]
    benchmarked = list(dict.fromkeys(point.release for point in points))
    unknown = [release for release in releases if release not in benchmarked]
    if unknown:
        raise ConfigError(f"{host}: release {', '.join(unknown)} has no benchmark in history",
                          f"benchmarked releases: {', '.join(benchmarked) or 'none'}")
    newest = {point.release: point.when for point in points}
    concurrency = tuple(point for point in points if point.release in (releases or benchmarked)
                        and point.when == newest[point.release])
    marks = tuple(HistoryEvent.of(entry) for entry in history
                  if (entry.outcome == FAILED and entry.event in (*ACTIVATIONS, "bench")) or entry.event == "rollback")
    starts = tuple(row for entry in history if entry.event in ACTIVATIONS and (row := _start_row(entry)))
    downtimes = tuple(switch for entry in history if entry.event in ACTIVATIONS and (switch := DowntimeRow.of(entry)))
    events = tuple(HistoryEvent.of(entry) for entry in history if entry.event in TIMELINE_EVENTS)
    return ReportData(host=host, service=service, generated_at=generated_at, benchmarks=tuple(points), marks=marks,
                      concurrency=concurrency, gpus=tuple(r for entry in benches for r in gpu_readings(entry)),
                      starts=starts, downtimes=downtimes, events=events,
                      served=served_rows(history, host, workloads, _newest_benches(points)))
