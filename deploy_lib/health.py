"""The readiness ladder: unit active and not restarted -> port open -> health endpoint 200 -> a real generation.

Every attempt is ONE remote step: deploy_lib/probe_script.py runs on the host under `python3 -`, looks at all
rungs every 50 ms and returns a JSON snapshot as soon as anything the verdict depends on changes (or after
`WATCH_S`), so a crash or "ready" is noticed within a poll of the host, not a round trip plus a backoff. Deciding
is pure (`assess`); waiting is a tenacity policy value (`ladder_policy`); `wait_ready` joins them and reports
through a Progress.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tenacity import (
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    stop_before_delay,
    wait_none,
)

from deploy_lib.errors import ReadinessFailed
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote, Step, StepResult

# One probe waits on the host up to this long for a change: the server's newest log line shows at least this often.
WATCH_S = 2.0
# How often the waiting probe looks: a change is noticed within this (plus one look) of happening.
POLL_S = 0.05


class Rung(StrEnum):
    """The rungs in the order they are climbed; a ladder runs up to and including a target rung."""

    UNIT = "unit"
    PORT = "port"
    HEALTH = "health"
    GENERATE = "generate"

    @property
    def index(self) -> int:
        return list(Rung).index(self)


class UnitState(BaseModel):
    """The `systemctl show` properties the ladder decides on."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    active_state: str = Field("", alias="ActiveState")
    sub_state: str = Field("", alias="SubState")
    n_restarts: int | None = Field(None, alias="NRestarts")
    exec_main_pid: int = Field(0, alias="ExecMainPID")
    exec_main_status: int = Field(0, alias="ExecMainStatus")
    # 1 = exited, 2 = killed, 3 = dumped core (the CLD_* codes of waitid(2)).
    exec_main_code: int = Field(0, alias="ExecMainCode")
    result: str = Field("", alias="Result")
    invocation_id: str = Field("", alias="InvocationID")

    @field_validator("n_restarts", mode="before")
    @classmethod
    def _unknown_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("exec_main_pid", "exec_main_status", "exec_main_code", mode="before")
    @classmethod
    def _zero_when_empty(cls, value: Any) -> Any:
        return 0 if value == "" else value

    def exit_text(self) -> str:
        """How the main process last ended, as a person would say it."""
        if self.exec_main_code in (2, 3):
            try:
                return f"killed by {signal.Signals(self.exec_main_status).name}"
            except ValueError:
                return f"killed by signal {self.exec_main_status}"
        return f"exit status {self.exec_main_status}"

    def summary(self) -> str:
        return (f"unit {self.active_state}/{self.sub_state}, Result={self.result or '-'}, "
                f"last exit: {self.exit_text()}, NRestarts={self.n_restarts}, MainPID={self.exec_main_pid}")


class Generation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int | None = None
    text: str | None = None
    error: str | None = None
    seconds: float = 0.0
    body: str | None = None


class LogLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    cursor: str


class Snapshot(BaseModel):
    """What one probe saw, as printed by probe_script.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: UnitState | None = None
    unit_error: str | None = None
    port_open: bool = False
    port_error: str | None = None
    health_status: int | None = None
    health_error: str | None = None
    generation: Generation | None = None
    last_log: LogLine | None = None
    journal_error: str | None = None
    state: str | None = None  # what the verdict depends on, as the probe compares it (passed back as `seen`)
    probe_s: float = 0.0


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


def ladder_policy(deadline_s: float, progress: Progress) -> Retrying:
    """Retry NotReady only, at once (the probe itself waits on the host), never start an attempt past the deadline,
    re-raise the last error as it is."""
    return Retrying(stop=stop_before_delay(deadline_s), wait=wait_none(),
                    retry=retry_if_exception_type(NotReady),
                    before_sleep=progress.retrying, reraise=True, name="readiness")


def grace_policy(grace_s: float) -> Retrying:
    """Keep re-probing a Ready server until the grace window ends; any other verdict ends it at once."""
    return Retrying(stop=stop_after_delay(grace_s), wait=wait_none(),
                    retry=retry_if_result(lambda verdict: isinstance(verdict, Ready)),
                    retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
                    name="grace")


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


@dataclass(frozen=True)
class GenerationProbe:
    """The one real request of the last rung; `path` is /generate (native) or /v1/completions (needs `model`)."""

    path: str = "/generate"
    prompt: str = "The capital of France is"
    max_new_tokens: int = 4
    timeout_s: float = 60.0
    model: str | None = None

    def body(self) -> dict[str, Any]:
        if self.path == "/generate":
            return {"text": self.prompt, "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0}}
        return {"model": self.model or "default", "prompt": self.prompt, "max_tokens": self.max_new_tokens,
                "temperature": 0}


@dataclass(frozen=True)
class ProbeTarget:
    """Where and how to probe one server. The API key is a secret value: kept out of repr and logs."""

    unit: str | None
    port: int
    host: str = "127.0.0.1"
    health_path: str | None = "/health"
    generation: GenerationProbe | None = field(default_factory=GenerationProbe)
    api_key: str | None = field(default=None, repr=False)
    python: str = "python3"
    connect_timeout_s: float = 0.5
    http_timeout_s: float = 5.0  # /health on SGLang < 0.5.20 runs a real 1-token generation

    @property
    def probe_host(self) -> str:
        return reachable_host(self.host)


# A server bound to every address: its own host reaches it on loopback, clients elsewhere at the host's address.
_ANY_ADDRESS_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def reachable_host(bind_host: str, host_address: str | None = None) -> str:
    """Where a server bound to `bind_host` is reached: a specific address as it is; an any-address bind on
    loopback from the host itself, or at `host_address` (the inventory's address) from elsewhere."""
    if bind_host not in _ANY_ADDRESS_LOOPBACK:
        return bind_host
    return host_address or _ANY_ADDRESS_LOOPBACK[bind_host]


def http_url(host: str, port: int | str) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


PROBE_SOURCE = resources.files("deploy_lib").joinpath("probe_script.py").read_text(encoding="utf-8")


def probe_step(target: ProbeTarget, rung: Rung, after_cursor: str | None = None, seen: str | None = None,
               wait_s: float = 0.0) -> Step:
    """One remote step running the probe for every rung up to `rung`: one look, or with `wait_s` a look every
    POLL_S until the state differs from `seen` (the `state` of the caller's last snapshot)."""
    wants_generation = rung is Rung.GENERATE and target.generation is not None
    generation = target.generation if wants_generation else None
    config = {
        "unit": target.unit,
        "journal_after_cursor": after_cursor,
        "seen": seen,
        "wait_s": wait_s,
        "poll_s": POLL_S,
        "host": target.probe_host,
        "port": target.port,
        "connect_timeout_s": target.connect_timeout_s,
        "health_path": target.health_path if rung.index >= Rung.HEALTH.index else None,
        "http_timeout_s": target.http_timeout_s,
        "generate": None if generation is None else {
            "path": generation.path, "body": generation.body(), "timeout_s": generation.timeout_s,
            "api_key": target.api_key,
        },
    }
    stdin = f"{PROBE_SOURCE}\nrun_probe_and_print({json.dumps(config)!r})\n".encode()
    timeout_s = 15 + wait_s + target.http_timeout_s + (generation.timeout_s if generation else 0)
    # sudo: reading a system unit's journal needs root or the systemd-journal group.
    return Step(name=f"readiness probe ({rung})", argv=(target.python, "-"), sudo=True, stdin=stdin,
                timeout_s=timeout_s, secret=bool(generation and target.api_key))


def parse_snapshot(result: StepResult, rung: Rung) -> Snapshot:
    """The probe's JSON line; anything else means the probe itself is broken, which waiting cannot fix."""
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        payload = json.loads(lines[-1])
        if "probe_error" in payload:
            raise ValueError(payload["probe_error"])
        return Snapshot.model_validate(payload)
    except (IndexError, ValueError, ValidationError) as exc:
        raise ReadinessFailed(f"the readiness probe printed no snapshot: {exc}", str(rung),
                              tuple(result.stdout.splitlines()[-5:] + result.stderr.splitlines()[-5:])) from exc


@dataclass(frozen=True)
class ReadyReport:
    """A ladder that reached its rung: how long the start took and what the server last said."""

    rung: Rung
    duration_s: float
    attempts: int
    snapshot: Snapshot
    last_log_line: str | None


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

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def evidence(self, error: ReadinessFailed) -> tuple[str, ...]:
        """The error's evidence, plus the server's newest line when this probe saw no new one."""
        last = f"last log line: {self.last_log_line}"
        return error.evidence if self.last_log_line is None or last in error.evidence else (*error.evidence, last)

    def probe(self, rung: Rung, wait_s: float = 0.0) -> Verdict:
        self.attempts += 1
        [result] = self.remote.run([probe_step(self.target, rung, self.after_cursor, self.state, wait_s)])
        snapshot = parse_snapshot(result, rung)
        self.state = snapshot.state
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
        passed = self.rung.index + 1 if waiting_on is None else waiting_on.index
        for rung in list(Rung)[self.rungs_passed:passed]:
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
        grace_rung, grace_ends = min(rung, Rung.HEALTH, key=lambda r: r.index), run.clock() + grace_s
        after = (grace or grace_policy(grace_s))(
            lambda: run.probe(grace_rung, max(0.0, min(WATCH_S, grace_ends - run.clock()))))
        if not isinstance(after, Ready):
            raise ReadinessFailed(f"ready after {duration_s:.0f} s, then within the {grace_s:.0f} s grace window: "
                                  f"{after.message}", "grace", run.evidence(after), after.hint)
        progress.step_done("readiness: grace", run.elapsed())
    return ReadyReport(rung=rung, duration_s=duration_s, attempts=run.attempts, snapshot=ready.snapshot,
                       last_log_line=run.last_log_line)
