"""A server's readiness, probed through a Remote: the ladder after a start, the live probe of a running one.

Climbing the ladder (a host action, through a Remote): the retry and grace policies and `wait_ready`.

The live probe of a running server, up to its health endpoint (a no-op's "is it serving right now?"): the host
reads only what must be read there, the unit's state (one `systemctl show`, which can ride in another round trip),
and the client sends the health request itself through the SSH connection it holds (remote/forward.py). A host
whose sshd forwards nothing is probed as the ladder probes it (host_scripts/probe.py, one round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    stop_before_delay,
    wait_none,
)

from deploy_lib.errors import ConnectionLost, ReadinessFailed
from deploy_lib.health.downtime import Downtime, measure_downtime, server_start_s
from deploy_lib.health.probe import WATCH_S, ProbeTarget, parse_snapshot, probe_step
from deploy_lib.health.snapshot import Rung, Snapshot, UnitState
from deploy_lib.health.startup import MARKER_PATTERNS, LogMark, startup_phases, startup_timings
from deploy_lib.health.verdict import NotReady, ProbeRejected, Ready, StartPrediction, UnitFailed, Verdict, assess
from deploy_lib.host_scripts.probe import (
    UNIT_PROPERTIES,
    health_get,
    health_reading,
    parse_systemctl_show,
)
from deploy_lib.progress import Progress
from deploy_lib.remote import Forwarded, Remote, Step, StepResult, forward


def ladder_policy(deadline_s: float, progress: Progress) -> Retrying:
    """Retry NotReady, at once (the probe itself waits on the host), and a connection lost for good after the remote
    layer's own reconnects (a partition shorter than the deadline does not fail the start); never start an attempt
    past the deadline, re-raise the last error as it is."""
    return Retrying(stop=stop_before_delay(deadline_s), wait=wait_none(),
                    retry=retry_if_exception_type((NotReady, ConnectionLost)),
                    before_sleep=progress.retrying, reraise=True, name="readiness")


def grace_policy(grace_s: float) -> Retrying:
    """Keep re-probing a Ready server until the grace window ends; any other verdict ends it at once."""
    return Retrying(stop=stop_after_delay(grace_s), wait=wait_none(),
                    retry=retry_if_result(lambda verdict: isinstance(verdict, Ready)),
                    retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
                    name="grace")


@dataclass(frozen=True)
class ReadyReport:
    """A ladder that reached its rung: how long the start took and what the server last said."""

    rung: Rung
    duration_s: float
    attempts: int
    snapshot: Snapshot
    last_log_line: str | None
    marks: tuple[LogMark, ...] = ()  # the startup lines this start logged (health.startup)
    rungs_s: Mapping[str, float] = field(default_factory=dict)  # rung -> seconds from the restart to passing it

    def phases(self) -> dict[str, float]:
        """This start's phases: the logged ones that are known, and the first generation."""
        generation = self.snapshot.generation
        first = generation.seconds if generation is not None and generation.text else None
        return startup_phases(self.marks, first)

    def timings(self) -> dict[str, float]:
        """This start's phases and rung times."""
        return startup_timings(self.phases(), self.rungs_s)

    def downtime(self, stopped_at: float, started_at: float) -> Downtime | None:
        """From `stopped_at` to the generation that passed the ladder (`started_at`: the clock's reading the rung
        times count from); None for a ladder that sent none."""
        answered_s = self.rungs_s.get(Rung.GENERATE)
        if answered_s is None:
            return None
        phases = self.phases()
        return measure_downtime(stopped_at, started_at + answered_s, server_start_s(self.marks, phases), phases)


@dataclass
class _LadderRun:
    """The state of one ladder between attempts: journal cursor, rung reached, warnings given."""

    remote: Remote
    target: ProbeTarget
    rung: Rung
    progress: Progress
    baseline_restarts: int | None
    after_cursor: str | None
    prediction: StartPrediction | None
    started_at: float
    clock: Callable[[], float]
    deadline_s: float = 0.0
    baseline_pid: int | None = None
    state: str | None = None  # the last snapshot's, so the next probe waits for a change from it
    waiting_on: Rung | None = None
    rungs_passed: int = 0
    last_log_line: str | None = None
    attempts: int = 0
    warned_slow: bool = False
    marks: list[LogMark] = field(default_factory=list)
    rungs_s: dict[str, float] = field(default_factory=dict)

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def evidence(self, error: ReadinessFailed) -> tuple[str, ...]:
        """The error's evidence, plus the server's newest line when this probe saw no new one."""
        last = f"last log line: {self.last_log_line}"
        return error.evidence if self.last_log_line is None or last in error.evidence else (*error.evidence, last)

    def probe(self, rung: Rung, wait_s: float = 0.0) -> Verdict:
        self.attempts += 1
        [result] = self.remote.run([probe_step(self.target, rung, self.after_cursor, self.state, wait_s,
                                               MARKER_PATTERNS)])
        snapshot = parse_snapshot(result, rung)
        self.state = snapshot.state
        self.marks.extend(snapshot.marks)
        if snapshot.last_log is not None:
            self.after_cursor = snapshot.last_log.cursor
            if snapshot.last_log.text != self.last_log_line:
                self.last_log_line = snapshot.last_log.text
                self.progress.log_line(snapshot.last_log.text)
        verdict = assess(snapshot, self.baseline_restarts, rung, self.baseline_pid)
        if self.baseline_pid is None and snapshot.unit is not None and snapshot.unit.exec_main_pid:
            self.baseline_pid = snapshot.unit.exec_main_pid
        return verdict

    def attempt(self) -> Ready:
        """One ladder attempt: probe (waiting on the host, within the deadline), report newly passed rungs, raise the
        verdict unless Ready."""
        verdict = self.probe(self.rung, max(0.0, min(WATCH_S, self.deadline_s - self.elapsed())))
        if isinstance(verdict, UnitFailed | ProbeRejected):
            raise verdict
        waiting_on = Rung(verdict.rung) if isinstance(verdict, NotReady) else None
        passed = self.rung.position + 1 if waiting_on is None else waiting_on.position
        for rung in list(Rung)[self.rungs_passed:passed]:
            self.rungs_s[str(rung)] = self.elapsed()
            self.progress.step_done(f"readiness: {rung}", self.elapsed())
        self.rungs_passed = max(self.rungs_passed, passed)
        if waiting_on is not None and waiting_on != self.waiting_on:
            self.progress.phase_started(f"readiness: {waiting_on}")
        self.waiting_on = waiting_on
        if self.prediction and not self.warned_slow and self.elapsed() > self.prediction.threshold_s:
            self.warned_slow = True
            self.progress.note(self.prediction.warning())
        if isinstance(verdict, Ready):
            return verdict
        raise verdict


def wait_ready(remote: Remote, target: ProbeTarget, *, deadline_s: float, progress: Progress,
               rung: Rung = Rung.GENERATE, baseline_restarts: int | None = 0, after_cursor: str | None = None,
               prediction: StartPrediction | None = None, grace_s: float = 0.0,
               policy: Retrying | None = None, grace: Retrying | None = None,
               started_at: float | None = None, clock: Callable[[], float] = time.monotonic) -> ReadyReport:
    """Climb the ladder up to `rung` or raise ReadinessFailed (UnitFailed, ProbeRejected, or the deadline's).

    `after_cursor` is the unit's journal cursor from before the restart, so only this start's lines show;
    `started_at` (a `clock()` value) is when the restart was issued, so durations match the history's.
    With `grace_s`, a Ready server is watched that much longer: healthy then dead within it is a failure.
    """
    run = _LadderRun(remote=remote, target=target, rung=rung, progress=progress,
                     baseline_restarts=baseline_restarts, after_cursor=after_cursor, prediction=prediction,
                     started_at=clock() if started_at is None else started_at, clock=clock, deadline_s=deadline_s)
    policy = policy or ladder_policy(deadline_s, progress)
    try:
        ready = policy(run.attempt)
    except NotReady as exc:
        raise ReadinessFailed(f"not ready after {run.elapsed():.0f} s (deadline {deadline_s:.0f} s): {exc.message}",
                              exc.rung, run.evidence(exc),
                              hint="a model that needs longer to load needs a larger service.startup_timeout_s"
                              ) from exc
    except (UnitFailed, ProbeRejected) as exc:
        exc.evidence = run.evidence(exc)
        raise
    duration_s = run.elapsed()
    if grace_s > 0:
        progress.phase_started(f"readiness: grace {grace_s:.0f} s")
        grace_rung, grace_ends = min(rung, Rung.HEALTH, key=lambda r: r.position), run.clock() + grace_s
        after = (grace or grace_policy(grace_s))(
            lambda: run.probe(grace_rung, max(0.0, min(WATCH_S, grace_ends - run.clock()))))
        if not isinstance(after, Ready):
            raise ReadinessFailed(f"ready after {duration_s:.0f} s, then within the {grace_s:.0f} s grace window: "
                                  f"{after.message}", "grace", run.evidence(after), after.hint)
        progress.step_done("readiness: grace", run.elapsed())
    return ReadyReport(rung=rung, duration_s=duration_s, attempts=run.attempts, snapshot=ready.snapshot,
                       last_log_line=run.last_log_line, marks=tuple(run.marks), rungs_s=dict(run.rungs_s))


LIVE_UNIT = "live probe: unit state"
EVERY_EXIT = frozenset(range(256))  # a unit state that cannot be read is a reading (unit_error), not a failed batch


def live_unit_step(target: ProbeTarget) -> Step:
    """The host's part of the live probe: the unit's properties the verdict reads (the ladder's own set)."""
    unit = target.unit or ""
    return Step(LIVE_UNIT, ("systemctl", "show", "--no-pager", "-p", ",".join(UNIT_PROPERTIES), "--", unit),
                ok=EVERY_EXIT, timeout_s=10, repeatable=True)


def health_request(target: ProbeTarget) -> bytes:
    """The health endpoint's GET, as the host probe sends it; nothing for a target without one (the exchange only
    connects: the port rung)."""
    return b"" if target.health_path is None else health_get(target.probe_host, target.port, target.health_path)


def unit_reading(unit: StepResult) -> tuple[UnitState | None, str | None]:
    """The unit's state from live_unit_step's result, or None and why not."""
    if unit.exit_code != 0:
        return None, f"systemctl show exited {unit.exit_code}: {unit.stderr.strip()[-300:]}"
    try:
        return UnitState.model_validate(parse_systemctl_show(unit.stdout)), None
    except ValidationError as error:
        return None, f"systemctl show printed no unit state: {error.errors()[0]['msg']}"


def forwarded_snapshot(target: ProbeTarget, unit: StepResult | None, answer: Forwarded) -> Snapshot:
    """The snapshot the host probe would have printed, from the unit's `systemctl show` and the forwarded request."""
    state, unit_error = unit_reading(unit) if target.unit and unit is not None else (None, None)
    # the host probe's own decision of its answer: the same server state gets the same verdict either way
    status, health_error = health_reading(answer.answer, answer.error) if answer.connected and target.health_path \
        else (None, None)
    return Snapshot(unit=state, unit_error=unit_error, port_open=answer.connected,
                    port_error=None if answer.connected else answer.error, health_status=status,
                    health_error=health_error)


def live_verdict(remote: Remote, target: ProbeTarget, unit: StepResult | None = None) -> Verdict:
    """Is the server ready right now, up to its health endpoint? `unit` is the live_unit_step's result when a batch
    sent it already (the facts' round trip), else it is read here. A probe that cannot be read is NotReady."""
    answer = forward(remote, target.probe_host, target.port, health_request(target), target.http_timeout_s)
    try:
        if not answer.sent:
            [result] = remote.run([probe_step(target, Rung.HEALTH)])
            return assess(parse_snapshot(result, Rung.HEALTH), None, Rung.HEALTH)
        if unit is None and target.unit:
            [unit] = remote.run([live_unit_step(target)])
        return assess(forwarded_snapshot(target, unit, answer), None, Rung.HEALTH)
    except ReadinessFailed as broken:
        return NotReady(broken.message, broken.rung, broken.evidence)
