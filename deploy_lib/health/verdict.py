"""Deciding one snapshot (pure): Ready up to a rung, NotReady (retry), UnitFailed or ProbeRejected (stop now); and
what past starts predict of this one (StartPrediction)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.errors import ReadinessFailed
from deploy_lib.health.snapshot import Rung, Snapshot


@dataclass(frozen=True)
class Ready:
    """Every rung up to `rung` passed in `snapshot`."""

    rung: Rung
    snapshot: Snapshot


class NotReady(ReadinessFailed):
    """Not there yet (loading, warming up, generation slow): the ladder tries again until the deadline."""


class UnitFailed(ReadinessFailed):
    """The unit died, failed or restarted: waiting cannot help, so the ladder stops at once."""


class ProbeRejected(ReadinessFailed):
    """The server answered with a client error (a wrong path or API key): waiting cannot help either."""


Verdict = Ready | NotReady | UnitFailed | ProbeRejected


def evidence_of(snapshot: Snapshot) -> tuple[str, ...]:
    """The snapshot as short lines for a failure report."""
    lines = []
    if snapshot.unit is not None:
        lines.append(snapshot.unit.summary())
    elif snapshot.unit_error:
        lines.append(f"unit state unknown: {snapshot.unit_error}")
    lines.append("port open" if snapshot.port_open else f"port closed ({snapshot.port_error})")
    if snapshot.health_status is not None or snapshot.health_error:
        lines.append(f"health endpoint: {snapshot.health_status or snapshot.health_error}")
    if snapshot.generation is not None:
        gen = snapshot.generation
        lines.append(f"generation: status {gen.status}, {gen.seconds:.1f} s, "
                     f"{'text ' + repr(gen.text[:80]) if gen.text is not None else gen.error or gen.body}")
    if snapshot.last_log is not None:
        lines.append(f"last log line: {snapshot.last_log.text}")
    return tuple(lines)


def _client_error(status: int) -> bool:
    # 408 and 429 are the 4xx codes that do change with time.
    return 400 <= status < 500 and status not in (408, 429)


def assess(snapshot: Snapshot, baseline_restarts: int | None, rung: Rung,
           baseline_pid: int | None = None) -> Verdict:
    """Decide one snapshot: Ready up to `rung`, NotReady (retry), UnitFailed or ProbeRejected (stop now).

    `baseline_restarts` is NRestarts right after our own (re)start (an explicit restart resets it to 0);
    `baseline_pid` is the main PID first seen in this ladder, so a restart that NRestarts misses still shows.
    """
    evidence = evidence_of(snapshot)
    unit = snapshot.unit
    if unit is not None:
        if baseline_restarts is not None and unit.n_restarts is not None and unit.n_restarts > baseline_restarts:
            return UnitFailed(f"the server restarted {unit.n_restarts - baseline_restarts} time(s) since our start "
                              f"(last {unit.exit_text()})", Rung.UNIT, evidence)
        if baseline_pid and unit.exec_main_pid and unit.exec_main_pid != baseline_pid:
            return UnitFailed(f"the server's main process changed from PID {baseline_pid} to {unit.exec_main_pid}: "
                              "it was restarted", Rung.UNIT, evidence)
        if unit.active_state == "failed":
            return UnitFailed(f"the unit failed (Result={unit.result}, {unit.exit_text()})", Rung.UNIT, evidence)
        if unit.sub_state == "auto-restart":
            return UnitFailed(f"the server exited ({unit.exit_text()}) and systemd is about to restart it",
                              Rung.UNIT, evidence)
        if unit.active_state in ("inactive", "deactivating"):
            return UnitFailed(f"the unit is {unit.active_state}: the server exited ({unit.exit_text()})",
                              Rung.UNIT, evidence)
        if unit.active_state != "active":
            return NotReady(f"the unit is {unit.active_state}/{unit.sub_state}", Rung.UNIT, evidence)
    elif snapshot.unit_error:
        return NotReady(f"unit state unknown: {snapshot.unit_error}", Rung.UNIT, evidence)
    if rung is Rung.UNIT:
        return Ready(rung, snapshot)

    if not snapshot.port_open:
        return NotReady(f"port closed ({snapshot.port_error}): still loading", Rung.PORT, evidence)
    if rung is Rung.PORT:
        return Ready(rung, snapshot)

    status = snapshot.health_status
    if status == 503:
        return NotReady("health endpoint answers 503: warming up", Rung.HEALTH, evidence)
    if status is not None and _client_error(status):
        return ProbeRejected(f"health endpoint answers {status}", Rung.HEALTH, evidence,
                             hint="/ready exists from SGLang 0.5.20 on; older versions have only /health")
    if status not in (None, 200) or snapshot.health_error:
        return NotReady(f"health endpoint: {status or snapshot.health_error}", Rung.HEALTH, evidence)
    if rung is Rung.HEALTH:
        return Ready(rung, snapshot)

    gen = snapshot.generation
    if gen is None:
        return NotReady("no generation was tried", Rung.GENERATE, evidence)
    if gen.status == 200 and gen.text:
        return Ready(rung, snapshot)
    if gen.status is not None and _client_error(gen.status):
        return ProbeRejected(f"generation request answered {gen.status}: {gen.body}", Rung.GENERATE, evidence,
                             hint="401/403: the API key sent is not the server's --api-key")
    if gen.status == 200:
        return NotReady(f"generation answered 200 without text ({gen.error or gen.body!r})", Rung.GENERATE, evidence)
    return NotReady(f"generation failed: {gen.error or f'status {gen.status}: {gen.body}'} after {gen.seconds:.1f} s",
                    Rung.GENERATE, evidence)


@dataclass(frozen=True)
class StartPrediction:
    """What past successful starts of a profile say about this one."""

    samples: int
    median_s: float
    threshold_s: float

    def warning(self) -> str:
        return f"start is taking longer than the last {self.samples} starts (median {self.median_s:.0f} s)"


def predict_start(durations_s: Sequence[float], factor: float = 1.5, margin_s: float = 30.0,
                  min_samples: int = 3, window: int = 10) -> StartPrediction | None:
    """Median of the last `window` successful start durations; warn past median * factor + margin.

    None until there are `min_samples` starts: a guess from one or two starts warns too often.
    """
    recent = [d for d in durations_s if d > 0][-window:]
    if len(recent) < min_samples:
        return None
    median = statistics.median(recent)
    return StartPrediction(samples=len(recent), median_s=median, threshold_s=median * factor + margin_s)
