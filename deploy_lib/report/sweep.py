"""What a tuning sweep's report shows (`invoke report --tune ID`), from the host's history (pure: no host, no
plotting): the pre-sweep release and each candidate with its differences, outcome, objective, SLA met and GPU power;
their figures per concurrency level; each GPU's power against its limit; the winner and why. Each table also as rows
for CSV and JSON."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from deploy_lib.errors import ConfigError
from deploy_lib.profile.settings import measured_on
from deploy_lib.report.data import GpuReading, Row, gpu_readings
from deploy_lib.store import HistoryEntry
from deploy_lib.tune.record import BASE, CANDIDATE, RERUN, SKIPPED, read_tune, tune_ids
from deploy_lib.tune.record import Row as TuneRow
from deploy_lib.tune.spec import Objective

UNITS = {Objective.throughput: "output tok/s", Objective.goodput: "req/s"}


@dataclass(frozen=True)
class SweepCandidate:
    """One line of the candidates' table: the pre-sweep release (number 0, `base`) or a candidate."""

    number: int
    candidate: str
    release: str | None        # None: skipped, or refused before a release was staged
    outcome: str               # measured | missed SLA | failed | skipped
    sla_met: bool
    objective: float | None    # the mean of its qualifying runs (healthy, SLA met); None: it did not compete
    vs_base_pct: float | None  # against the pre-sweep release's best run, as the decision compares them
    power_mean_w: float | None  # over its GPUs during its newest run
    power_peak_w: float | None
    power_limit_w: float | None
    util_mean_pct: float | None
    winner: bool
    changes: str               # what differs from the pre-sweep release, flag by flag
    cause: str                 # why it failed or missed the SLA


@dataclass(frozen=True)
class SweepLevel:
    """A candidate's newest run at one concurrency level."""

    number: int
    candidate: str
    concurrency: int
    output_tok_s: float
    request_rate: float
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    itl_p99_ms: float | None


@dataclass(frozen=True)
class SweepGpu:
    """One GPU during a candidate's newest run, as the sampler recorded it."""

    number: int
    candidate: str
    gpu: int
    power_mean_w: float | None
    power_peak_w: float | None
    power_limit_w: float | None
    util_mean_pct: float | None


SWEEP_TABLES: dict[str, type] = {"candidates": SweepCandidate, "levels": SweepLevel, "gpus": SweepGpu}
SWEEP_COLUMNS: dict[str, tuple[str, ...]] = {name: tuple(f.name for f in fields(kind))
                                             for name, kind in SWEEP_TABLES.items()}


@dataclass(frozen=True)
class SweepData:
    host: str
    service: str
    generated_at: str
    tune_id: str
    profile: str
    objective: str             # `throughput at concurrency 1024 (output tok/s)`
    sla: str
    benchmark: str             # what its runs were measured on: default, or workload NAME (settings.measured_on)
    original: str              # the release serving before the sweep
    finished: bool
    winner: str | None
    serving: str | None        # the release serving at its end
    reason: str                # the decision's own words, as history recorded them
    candidates: tuple[SweepCandidate, ...]
    levels: tuple[SweepLevel, ...]
    gpus: tuple[SweepGpu, ...]

    def tables(self) -> dict[str, list[Row]]:
        return {name: [asdict(row) for row in getattr(self, name)] for name in SWEEP_TABLES}

    def summary(self) -> dict[str, Any]:
        """The sweep's own fields (the JSON document's head)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SWEEP_TABLES}


def _newest(lines: Sequence[HistoryEntry], label: str) -> HistoryEntry:
    roles = (BASE,) if label == "base" else (CANDIDATE, RERUN, SKIPPED)
    return [e for e in lines if e.tune.get("role") in roles and e.tune.get("candidate", "base") == label][-1]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 1) if known else None


def _most(values: Sequence[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def _candidate(number: int, row: TuneRow, gpus: Sequence[GpuReading], base: float | None,
               winner: str | None) -> SweepCandidate:
    objective = round(statistics.fmean(row.values), 3) if row.values else None
    vs_base = round((objective / base - 1) * 100, 1) if objective is not None and base else None
    return SweepCandidate(number=number, candidate=row.label, release=row.release_id, outcome=row.outcome,
                          sla_met=row.sla_met, objective=objective, vs_base_pct=None if number == 0 else vs_base,
                          power_mean_w=_mean([g.power_mean_w for g in gpus]),
                          power_peak_w=_most([g.power_peak_w for g in gpus]),
                          power_limit_w=_most([g.power_limit_w for g in gpus]),
                          util_mean_pct=_mean([g.util_mean_pct for g in gpus]), winner=row.label == winner,
                          changes=row.changes, cause=row.cause if not row.sla_met else "")


def collect_sweep(history: Sequence[HistoryEntry], host: str, service: str, generated_at: str,
                  tune: str, workload_names: Sequence[str] = ()) -> SweepData:
    """The sweep `tune` of a host's history; ConfigError naming it and the sweeps the history holds.
    `workload_names`: the project's recorded workloads, to name the one its runs replayed."""
    if tune not in tune_ids(history):
        raise ConfigError(f"{host}: no tuning sweep {tune!r} in the history of service {service}",
                          f"sweeps on {host}: {', '.join(tune_ids(history)) or 'none'} (`invoke tune` prints the id)")
    report = read_tune(history, tune)
    lines = [e for e in history if e.event == "tune" and e.tune.get("id") == tune]
    rows = [report.base, *report.rows] if report.base else list(report.rows)
    numbered = list(enumerate(rows, 0 if report.base else 1))
    base = max(report.base.values) if report.base and report.base.values else None
    readings = {row.label: gpu_readings(_newest(lines, row.label)) for row in rows}
    level = report.spec.level or max((lv.concurrency for row in rows for lv in row.levels), default=None)
    return SweepData(
        host=host, service=service, generated_at=generated_at, tune_id=tune, profile=report.profile,
        objective=f"{report.spec.objective.value}{f' at concurrency {level}' if level else ''} "
                  f"({UNITS[report.spec.objective]})",
        sla=report.spec.sla.describe(),
        benchmark=next((measured_on(e.figures, workload_names) for e in lines if e.figures), "default"),
        original=report.original, finished=report.finished, winner=report.winner,
        serving=report.serving, reason=report.reason,
        candidates=tuple(_candidate(n, row, readings[row.label], base, report.winner)
                         for n, row in numbered),
        levels=tuple(SweepLevel(n, row.label, lv.concurrency, lv.output_tok_s, round(lv.request_rate, 3),
                                lv.ttft.p99_ms, lv.tpot.p99_ms, lv.itl.p99_ms)
                     for n, row in numbered for lv in row.levels),
        gpus=tuple(SweepGpu(n, row.label, g.gpu, g.power_mean_w, g.power_peak_w, g.power_limit_w, g.util_mean_pct)
                   for n, row in numbered for g in readings[row.label]))
