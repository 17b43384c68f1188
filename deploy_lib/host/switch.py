"""One command's transition of one host: switch `current` to a release, restart, climb the readiness ladder, record
history (the restore after a failed start is host/restore.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from deploy_lib.deploy.plan import BatchKind, SwitchBatches, recorded_switch, seconds_from_stop, stop_step
from deploy_lib.deploy.preflight import check_release, check_release_files
from deploy_lib.deploy.project import Target
from deploy_lib.errors import (
    ConnectFailed,
    ConnectionLost,
    DeployError,
    GateFailed,
    Interrupted,
    ReadinessFailed,
    WatchFailed,
)
from deploy_lib.facts.cuda_toolkit import cuda_home
from deploy_lib.facts.diagnose import (
    JOURNAL_SYNC,
    Diagnosis,
    diagnose,
    journal_cursor_step,
    journal_step,
    parse_journal_cursor,
)
from deploy_lib.facts.host import FactRequest, HostFacts, parse_systemctl_show
from deploy_lib.health import GenerationProbe, ProbeTarget, Rung, StartPrediction, Verdict
from deploy_lib.health.downtime import Downtime
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.readiness import ReadyReport, live_unit_step, live_verdict, wait_ready
from deploy_lib.host.store import LockOnFirstChange
from deploy_lib.interrupts import interrupted, signal_name
from deploy_lib.profile import read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.release.model import RecordedRelease, read_secret
from deploy_lib.release.server_args import API_KEY_ENV
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Readings
from deploy_lib.store import HEALTHY, StoreLayout, Tags, append_history, history_entry, operator_name, parse_current
from deploy_lib.versions import health_path_for

GRACE_S = 2.0  # healthy, then dead within this window, is a failed start
SWITCH_CURRENT = "switch: current"  # the step of store.switch_current that moves the link


def recorded_tags(target: Target, release_id: str, metadata: Mapping[str, Any]) -> Tags:
    """The tags a release.json records; for one written without them (an earlier version), what it does record."""
    try:
        return Tags.from_dict(metadata["tags"])
    except (KeyError, TypeError, ValueError, AttributeError):
        version = metadata.get("sglang_version")
        return Tags(who=operator_name(), host=target.host.name, release=release_id,
                    profile=str(metadata.get("profile_name") or "?"),
                    profile_hash=str(metadata.get("profile_hash") or ""),
                    versions={"sglang": str(version)} if version else {})


def probe_target(layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str],
                 generation: bool = True) -> ProbeTarget:
    """How to probe a release, from its own recorded profile (so a rollback probes the old release correctly).

    Only the generation rung sends the API key, so a probe without it needs none (and reads none)."""
    server = read_stored_profile(metadata.get("profile")).server
    version = metadata.get("sglang_version")
    key = server.api_key if generation else None
    return ProbeTarget(unit=layout.unit_name, port=server.port, host=server.host,
                       health_path=health_path_for(str(version)) if version else "/health",
                       generation=GenerationProbe() if generation else None,
                       api_key=read_secret(API_KEY_ENV, key, environ) if key is not None else None)


def live_target(layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]) -> ProbeTarget:
    """Where `Transition.live_verdict` probes a running release: unit, port and health endpoint, no generation."""
    return probe_target(layout, metadata, environ, generation=False)


def live_probe(layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]) -> Step:
    """The host's part of a release's live probe (its unit's state), for a round trip that goes anyway (the facts')."""
    return live_unit_step(live_target(layout, metadata, environ))


@dataclass(frozen=True)
class Readiness:
    """How a release's start is verified: where the ladder probes it, up to which rung, within which deadline."""

    probe: ProbeTarget
    rung: Rung
    deadline_s: float


class ReleaseKind(Protocol):
    """What a Transition needs to know of the kind of release it switches (SGLang's server, the router): how its
    start is verified, where it is probed while it runs, and the batches that switch back to one of its store."""

    def readiness(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]
                  ) -> Readiness: ...

    def live_target(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]
                    ) -> ProbeTarget: ...

    def switch_batches(self, run: Transition, release_id: str, metadata: Mapping[str, Any]) -> SwitchBatches: ...


class ServerRelease:
    """SGLang's server: verified up to a generation within its profile's startup timeout; switched back to after
    the same preflight as a rollback (`check_target`: venv, GPUs, port, its files)."""

    def readiness(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]) -> Readiness:
        return Readiness(probe_target(layout, metadata, environ), Rung.GENERATE,
                         read_stored_profile(metadata.get("profile")).service.startup_timeout_s)

    def live_target(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]
                    ) -> ProbeTarget:
        return live_target(layout, metadata, environ)

    def switch_batches(self, run: Transition, release_id: str, metadata: Mapping[str, Any]) -> SwitchBatches:
        return recorded_switch(run.layout, run.check_target(release_id, metadata), release_id)


SERVER = ServerRelease()


@dataclass
class Transition:
    """One command against one host: the remote, the clock, where timings go, and how far the transition got."""

    remote: Remote
    layout: StoreLayout
    target: Target
    progress: Progress
    environ: Mapping[str, str]
    clock: Callable[[], float] = time.monotonic
    grace_s: float = GRACE_S
    timings: dict[str, float] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)  # the watch's windows, for the next history line
    cursor: str | None = None  # the unit's journal position just before the last restart
    previous: str | None = None  # the release `current` named when the command read the host
    switched_to: str | None = None  # the release `current` was last switched to
    verified: str | None = None  # the release the last ladder found ready
    before_restart: Callable[[], None] | None = None
    unsent: list[Step | Put] = field(default_factory=list)  # the verified batch, sent with the healthy record
    lock: LockOnFirstChange | None = None  # a deploy's lock, taken with its first change and released with `last`
    read_at_switch: Readings | None = None  # what the last activation's round trip read and did
    switch_confirmed: bool = False  # the result of the last activation's round trip came: `current` is switched_to
    linked_before: str | None = None  # where `current` pointed before the last activation's round trip
    restoring: tuple[str, str, str] | None = None  # during a restore: the failed release, its failure, the target
    kind: ReleaseKind = SERVER  # what is switched: SGLang's server, or the router (ops/router_deploy.py)
    serving_before: bool = False  # a server ran when the command read the host: its stop starts a downtime
    # All on `clock`, the client's monotonic one: it sees the first answer where users see it and never jumps (the
    # host's wall clock can); the host's step durations only place the stop within its round trip.
    stopped_at: float | None = None  # when the old server stopped (kept through a restore: the downtime goes on)
    downtime: Downtime | None = None  # the last verified start's, from `stopped_at`

    @property
    def where(self) -> str:
        return self.target.host.name

    def phase(self, name: str, batch: Sequence[Step | Put]) -> list[StepResult]:
        if not batch:
            return []
        self.progress.phase_started(name)
        started = self.clock()
        results = self.remote.run(batch)
        self.timings[name] = round(self.clock() - started, 3)
        self.progress.step_done(name, self.timings[name])
        return results

    def record(self, event: str, outcome: str, tags: Tags, cause: str = "", then: Sequence[Step | Put] = (),
               last: bool = False) -> list[StepResult]:
        """Append the history line, in one round trip with the verified batch of the start it records healthy
        (what `activate` left unsent), with `then`, and (`last`: the command's last round trip) the lock's release."""
        verified, self.unsent = (self.unsent if outcome == HEALTHY else []), []
        figures, self.figures = self.figures, {}  # the line of the deploy they were read for, not a later one
        entry = history_entry(event, outcome, tags, datetime.now(UTC), cause, self.timings, figures)
        batch = [*verified, *append_history(self.layout, entry), *then]
        return self.lock.finish(batch) if last and self.lock is not None else self.remote.run(batch)

    def journal_diagnosis(self, cursor: str | None, profile: str | None) -> Diagnosis:
        """Why the release of `profile` did not start, from the unit's journal since `cursor`."""
        result = self.remote.run([JOURNAL_SYNC, journal_step(self.layout.unit_name, cursor)])[-1]
        return diagnose(result.stdout.splitlines(), profile=profile)

    def check_target(self, release_id: str, metadata: Mapping[str, Any]) -> HostFacts:
        """Preflight for switching to a recorded release (rollback): what deploy checks, plus the release's files."""
        release = RecordedRelease.of(release_id, metadata)
        for note in release.profile.notes(release_id):
            self.progress.note(note)
        toolkit_home = cuda_home(release.environment) if release.profile.features.allreduce_fusion else None
        facts = read_host_facts(self.remote, FactRequest(self.layout, release.venv, release.profile.server.port,
                                                         toolkit_home, release.profile.service.working_directory,
                                                         release_id=release_id))
        check_release(release, self.target, facts)
        check_release_files(release, self.layout, facts, self.where)
        return facts

    def live_verdict(self, metadata: Mapping[str, Any], read: Readings | None = None) -> Verdict:
        """One probe of the running server up to the health endpoint (no generation): is it ready right now? The
        unit's state is taken from `read` when that batch read it (the facts' round trip), else read now; the health
        request goes through the connection (host/readiness.py)."""
        target = self.kind.live_target(self.layout, metadata, self.environ)
        step = live_unit_step(target)
        seen = read.get(step.name) if read is not None else None
        # the facts' round trip sends it as a concurrent step
        unit = seen if seen is not None and seen.step in (step, replace(step, concurrent=True)) else None
        # a read: past the lock's wrapper, which takes the lock with any batch after the facts (a no-op takes none)
        return live_verdict(self.lock.inner if self.lock is not None else self.remote, target, unit)

    def activate(self, release_id: str, metadata: Mapping[str, Any], prediction: StartPrediction | None,
                 grace_s: float, switch: SwitchBatches,
                 staged: Sequence[Step | Put] = (), reads: Sequence[Step | Put] = (),
                 reads_after_restart: Sequence[Step] = ()) -> ReadyReport:
        """Switch `current` to a release on the host, restart, and climb the readiness ladder.

        A deploy gives its plan's switch (what its dry run listed), with the stage batch in `staged`; a switch
        to a recorded release gives `plan.recorded_switch` for that release. One round trip stages, reads the
        journal position, switches and restarts; from that position on, the ladder shows this start's log lines
        and a failure is diagnosed from them (`self.cursor`). `reads` run in it between the stage and the switch,
        `reads_after_restart` at its end (both in `self.read_at_switch`)."""
        if self.before_restart is not None:
            self.before_restart()
        restarted_at = self.clock()
        self.linked_before = self.switched_to if self.switched_to is not None else self.previous
        self.switched_to = release_id  # from here on a signal switches back: the switch may be under way
        self.switch_confirmed = False
        batch = [*staged, *reads, *switch.activate, *reads_after_restart]
        results = self.phase(f"{BatchKind.stage}, {BatchKind.activate}" if staged else BatchKind.activate, batch)
        self.switch_confirmed = True
        if self.serving_before and self.stopped_at is None:
            self.stopped_at = self.clock() - seconds_from_stop(results)
        self.read_at_switch = Readings(results)
        cursor_step = journal_cursor_step(self.layout.unit_name)
        # by name: a restore sends its steps marked repeatable (`_switch_back`), otherwise the same
        self.cursor = parse_journal_cursor(next(r.stdout for r in results if r.step.name == cursor_step.name))
        readiness = self.kind.readiness(self.layout, metadata, self.environ)
        self.progress.phase_started("readiness")
        report = wait_ready(self.remote, readiness.probe, deadline_s=readiness.deadline_s, progress=self.progress,
                            rung=readiness.rung, baseline_restarts=0, after_cursor=self.cursor,
                            prediction=prediction, grace_s=grace_s, started_at=restarted_at, clock=self.clock)
        self.verified = release_id
        self.timings["ready"] = round(report.duration_s, 3)
        self.timings |= report.timings()  # its phases from the server's log lines, and the ladder's rung times
        if self.stopped_at is not None:
            self.downtime = report.downtime(self.stopped_at, restarted_at)
            self.timings |= self.downtime.timings() if self.downtime else {}
        self.progress.step_done("readiness", report.duration_s)
        # The verified start leaves the start-limit window (reset-failed), so the restart policy allows the same number
        # of restarts whether a crash comes a minute or a day after the deploy; sent with the healthy record.
        self.unsent = list(switch.verified)
        return report

    def host_state(self) -> str:
        """Where `current` points and what the unit does, read once more (best effort: after an interrupt)."""
        steps = [Step("state: current", ("readlink", "--", str(self.layout.current)), ok=ABSENT_OK, repeatable=True),
                 Step("state: unit", ("systemctl", "show", "-p", "ActiveState,SubState", "--", self.layout.unit_name),
                      repeatable=True)]
        try:
            try:
                current, unit = self.remote.run(steps)
            except (ConnectFailed, ConnectionLost):  # the interrupt cut a round trip (a waiting probe): read again
                current, unit = self.remote.run(steps)
        except (DeployError, KeyboardInterrupt) as error:
            return f"unknown (it could not be read: {error or type(error).__name__})"
        props = parse_systemctl_show(unit.stdout)
        return (f"current: {parse_current(current.stdout) or 'none'}, unit {props.get('ActiveState', '?')}/"
                f"{props.get('SubState', '?')}")

    def connection_lost(self, lost: ConnectionLost, command: str) -> ConnectionLost:
        """The lost connection's error, completed with what this command knows of the host: where `current` points,
        whether the release switched to was verified, and what to run once the host answers again."""
        if self.switched_to is None:
            link = f"current is {self.previous or 'none'} (nothing was switched)"
        elif self.switch_confirmed or SWITCH_CURRENT in lost.completed:
            link = f"current is {self.switched_to}"
        else:  # the host runs a round trip's script on after its connection died
            link = (f"current is {self.linked_before or 'none'}, or {self.switched_to} if the host ran on (the switch "
                    "was in that round trip)")
        verified = "" if self.switched_to is None else \
            f"; release {self.switched_to} was {'verified' if self.verified == self.switched_to else 'NOT verified'}"
        unlock = "the lock of the lost command, if it is still there, is released with `invoke unlock`"
        if self.restoring is None:
            lost.message = f"{self.where}: {lost.message}; {link}{verified}"
            lost.about(self.switched_to, self.previous, self.timings)
            lost.hint = (f"once the host answers: `invoke status` shows what it serves; `invoke {command}` verifies "
                         f"the current release (or rolls back); {unlock}")
            return lost
        failed, failure, restore_id = self.restoring  # `restore` has said which release failed (`about`)
        lost.message = (f"{self.where}: release {failed} failed ({failure}) and the rollback to {restore_id} did not "
                        f"finish: {lost.message}; {link}{verified}")
        lost.hint = (f"once the host answers: `invoke status` shows what it serves; `invoke rollback --to "
                     f"{restore_id}` finishes the rollback (switches if needed, restarts and verifies it); {unlock}")
        return lost

    def interrupted_outside(self, stop: KeyboardInterrupt) -> Interrupted:
        """The error for a signal that came outside a switch and its verification."""
        name = signal_name(stop)
        if self.switched_to is None:
            serving = f": release {self.previous} is current" if self.previous else ""
            return interrupted(stop, f"{self.where}: interrupted ({name}) before the switch; nothing was switched or "
                                     f"restarted{serving}")
        if self.verified == self.switched_to:
            return interrupted(stop, f"{self.where}: interrupted ({name}) after release {self.verified} was verified; "
                                     f"release {self.verified} is serving")
        return interrupted(stop, f"{self.where}: interrupted ({name}) while release {self.switched_to} was not "
                                 f"verified; the host now: {self.host_state()}",
                           hint="`invoke status` shows whether it serves; a deploy or rollback verifies it")


def stop_unit(remote: Remote, layout: StoreLayout, stop_timeout_s: int) -> None:
    """Stop the unit, waiting as long as its TimeoutStopSec= (`stop_timeout_s`) lets SGLang drain (plan.stop_wait_s)."""
    remote.run([stop_step(layout, stop_timeout_s)])


def gate_diagnosis(failure: GateFailed) -> Diagnosis:
    """A release that started but benchmarked too slow: the verdict is the cause, the GPU telemetry the evidence."""
    return Diagnosis("throughput_gate", failure.message, failure.hint or "", failure.evidence)


def interruption(stop: KeyboardInterrupt) -> tuple[Interrupted, Diagnosis]:
    """A signal during a switch, as the failure of the release being verified."""
    cause = f"interrupted by {signal_name(stop)} before it was verified"
    return interrupted(stop, cause), Diagnosis("interrupted", cause, "", ())


def failure_line(failure: DeployError, diagnosis: Diagnosis) -> str:
    """One line: what the ladder saw, and the cause the journal shows when it matches a known signature."""
    if diagnosis.signature == "unknown":
        return f"{failure.message} (no known failure signature in the log)"
    if isinstance(failure, GateFailed | Interrupted):
        return diagnosis.cause
    return f"{diagnosis.one_line()}; {failure.message}"


def same_kind(failure: DeployError, message: str, diagnosis: Diagnosis) -> DeployError:
    """The error to end with after the restore: of the first failure's kind, with the new message."""
    if isinstance(failure, Interrupted):
        return type(failure)(message, failure.hint)
    evidence = diagnosis.evidence or getattr(failure, "evidence", ())
    if isinstance(failure, WatchFailed):  # keeps both windows' figures, for the webhook
        return WatchFailed(message, failure.rung, evidence, diagnosis.hint or failure.hint, failure.figures)
    error = type(failure) if isinstance(failure, GateFailed) else ReadinessFailed
    return error(message, getattr(failure, "rung", ""), evidence, diagnosis.hint or failure.hint)
