"""A sweep in history.jsonl (event `tune`, the sweep's id in each line's `tune` map) and the table read back from it:
the start (the spec, the base profile, the release serving before), the base's runs, each candidate's run (figures,
outcome, differences), the skipped ones, the end (winner, what serves and why). `show` and `--resume` read these."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from deploy_lib.errors import ConfigError
from deploy_lib.health.downtime import Downtime
from deploy_lib.store import FAILED, HEALTHY, HistoryEntry, Tags, history_entry
from deploy_lib.throughput import BenchResult, LevelResult
from deploy_lib.throughput.history import gpu_power
from deploy_lib.tune.decide import Score, Standing, best_so_far
from deploy_lib.tune.spec import TuneSpec

START, BASE, CANDIDATE, RERUN, SKIPPED, END = "start", "base", "candidate", "rerun", "skipped", "end"
SHORT, ELIMINATED = "short", "eliminated"  # search: halving: a short-round run; a candidate that did not survive it
MEASURED, MISSED_SLA, FAILED_RUN = "measured", "missed SLA", "failed"  # a row's outcome (or SKIPPED, ELIMINATED)
OBJECTIVE_KEY = "tune.objective"  # the run's objective figure, beside the benchmark's own


def tune_id(now: datetime, token: str) -> str:
    return f"t{now:%Y%m%d-%H%M%S}-{token}"


def tune_line(tune: str, role: str, tags: Tags, when: datetime, *, outcome: str = HEALTHY, cause: str = "",
              label: str = "", figures: Mapping[str, float] | None = None,
              extra: Mapping[str, str] | None = None, timings: Mapping[str, float] | None = None) -> HistoryEntry:
    return history_entry("tune", outcome, tags, when, cause, timings=timings, figures=figures,
                         tune={"id": tune, "role": role, **({"candidate": label} if label else {}), **(extra or {})})


def start_line(tune: str, spec: TuneSpec, profile: str, tags: Tags, when: datetime, candidates: int,
               share: Sequence[str] | None = None) -> HistoryEntry:
    """`share`: a group's host runs these candidates of the spec (a resume runs the same)."""
    return tune_line(tune, START, tags, when, cause=f"sweep of {candidates} candidates over {profile} started",
                     extra={"spec": json.dumps(spec.identity(), sort_keys=True), "profile": profile,
                            **({"share": json.dumps(list(share))} if share is not None else {})})


def run_line(tune: str, role: str, label: str, tags: Tags, when: datetime, result: BenchResult | None, score: Score,
             cause: str = "", changes: Sequence[str] = (), has_release: bool = True,
             downtime: Downtime | None = None) -> HistoryEntry:
    """One measured (or failed) run: healthy when it qualified (benchmarked, SLA met). Without `has_release` (refused
    before it was staged) the tags are the pre-sweep release's and name no release of the candidate. `downtime`: its
    deploy's, when that stopped a running server."""
    figures = dict(result.figures()) if result is not None else {}
    if score.value is not None:
        figures[OBJECTIVE_KEY] = round(score.value, 3)
    why = cause or "; ".join(score.misses)
    return tune_line(tune, role, tags, when, outcome=HEALTHY if score.qualifies else FAILED, cause=why,
                     label=label, figures=figures, timings=downtime.timings_with_phases() if downtime else None,
                     extra={"sla_met": "yes" if score.sla_met else "no", "changes": "; ".join(changes),
                            **({} if has_release else {"release": ""})})


@dataclass(frozen=True)
class Row:
    """One line of the table: a candidate (or the base) with every run's figures, or why it has none."""

    label: str
    release_id: str | None
    outcome: str                      # measured | missed SLA | failed | skipped
    sla_met: bool
    changes: str
    levels: tuple[LevelResult, ...]   # of the newest run
    power: str
    values: tuple[float, ...]         # the objective's figure of each qualifying run
    cause: str
    downtime: Downtime | None = None  # the newest run's deploy's

    def standing(self) -> Standing:
        return Standing(self.label, self.release_id, self.values)


@dataclass(frozen=True)
class TuneReport:
    tune_id: str
    profile: str
    spec: TuneSpec
    original: str                     # the release serving before the sweep
    base: Row | None
    rows: tuple[Row, ...]             # candidates in the order they ran, then the skipped ones
    finished: bool
    winner: str | None = None
    serving: str | None = None        # the release serving at the end
    reason: str = ""
    short: tuple[Row, ...] = ()       # search: halving: each candidate's short-round run, in the order they ran
    share: tuple[str, ...] = ()       # a group's host: the candidates it runs (empty: every one)

    @property
    def finished_labels(self) -> list[str]:
        return [row.label for row in self.rows if row.outcome != SKIPPED]

    def best_release(self) -> str | None:
        """The best healthy release so far: by the full benchmark, else (search: halving) by the short one."""
        best = best_so_far([row.standing() for row in self.rows]) or best_so_far([row.standing() for row in self.short])
        return best.release_id if best else None


def _row(label: str, entries: Sequence[HistoryEntry]) -> Row:
    newest = entries[-1]
    result = BenchResult.from_figures(newest.tags.release, newest.figures) if newest.figures else None
    values = tuple(e.figures[OBJECTIVE_KEY] for e in entries if e.outcome == HEALTHY and OBJECTIVE_KEY in e.figures)
    role = newest.tune.get("role")
    outcome = role if role in (SKIPPED, ELIMINATED) else MEASURED if newest.outcome == HEALTHY else \
        MISSED_SLA if result is not None and result.ok else FAILED_RUN
    release = None if role == SKIPPED or newest.tune.get("release") == "" else newest.tags.release
    # a rerun line records no changes: they are the candidate's own run's
    changes = next((e.tune["changes"] for e in reversed(entries) if e.tune.get("changes")), "")
    return Row(label, release, outcome, newest.tune.get("sla_met") == "yes", changes,
               result.levels if result else (), _gpus(newest.figures), values, newest.cause,
               Downtime.from_timings(newest.timings))


def _gpus(figures: Mapping[str, float]) -> str:
    """Power as `invoke releases` shows it, and the mean utilisation over the GPUs, during the run."""
    utils = [value for key, value in figures.items() if key.startswith("gpu") and key.endswith(".util_mean_pct")]
    util = f", {sum(utils) / len(utils):.0f}% util" if utils else ""
    return gpu_power(figures) + util if gpu_power(figures) else ""


def tune_ids(history: Sequence[HistoryEntry]) -> list[str]:
    return list(dict.fromkeys(e.tune["id"] for e in history if e.event == "tune" and e.tune.get("role") == START))


def read_tune(history: Sequence[HistoryEntry], tune: str) -> TuneReport:
    """The sweep `tune` as history records it; ConfigError naming the sweeps on the host when there is none."""
    lines = [e for e in history if e.event == "tune" and e.tune.get("id") == tune]
    start = next((e for e in lines if e.tune.get("role") == START), None)
    if start is None:
        raise ConfigError(f"no sweep {tune!r} in the host's history",
                          f"sweeps on the host: {', '.join(tune_ids(history)) or 'none'}")
    spec = TuneSpec.model_validate(json.loads(start.tune["spec"]))
    base = [e for e in lines if e.tune.get("role") == BASE]
    by_label: dict[str, list[HistoryEntry]] = {}
    short: dict[str, list[HistoryEntry]] = {}
    for entry in lines:
        if entry.tune.get("role") in (CANDIDATE, RERUN, SKIPPED, ELIMINATED):
            by_label.setdefault(entry.tune["candidate"], []).append(entry)
        elif entry.tune.get("role") == SHORT:
            short.setdefault(entry.tune["candidate"], []).append(entry)
    rows = [_row(label, entries) for label, entries in by_label.items()]
    rows.sort(key=lambda row: row.outcome == SKIPPED)
    end = next((e for e in reversed(lines) if e.tune.get("role") == END), None)
    return TuneReport(tune, start.tune.get("profile", start.tags.profile), spec, start.tags.release,
                      _row("base", base) if base else None, tuple(rows), end is not None,
                      winner=end.tune.get("candidate") if end else None,
                      serving=end.tags.release if end else None, reason=end.cause if end else "",
                      short=tuple(_row(label, entries) for label, entries in short.items()),
                      share=tuple(json.loads(start.tune["share"])) if "share" in start.tune else ())

