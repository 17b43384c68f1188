"""What a deploy, rollback, start or restart tells the world beside its own output: the project's hooks
(deploy_lib/host/hooks.py: `hooks/pre-deploy`, `post-deploy`, `pre-rollback`, `post-rollback`) run on this machine
around it, and each host's webhook (the inventory's `notify_webhook`, remote/webhook.py) told how it ended on that
host. The other commands that deploy releases (a patch set's enable or disable, a tuning sweep, the router's
release) run the deploy hooks and tell the webhook the same way.

A failing pre- hook stops the command before any host is reached. A post- hook's failure and a notification that
could not be delivered are progress notes: the command's own result and exit code stay what they were. The webhook
hears of a deploy done, a rollback (by hand, or the automatic one after a failed start or gate), a gate failure, a
failed start nothing could be rolled back to, and a crash loop systemd gave up on (found by `status`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from deploy_lib.errors import DeployError, GateFailed, ReadinessFailed, RollbackFailed, WatchFailed
from deploy_lib.host.hooks import HookContext, HookEvent, run_hook
from deploy_lib.ops.fleet import FleetRun, HostRun
from deploy_lib.ops.scope import Reach, Scope
from deploy_lib.outcomes import Action

if TYPE_CHECKING:
    from deploy_lib.commands.status import StatusReport
    from deploy_lib.commands.tune_request import Planned
    from deploy_lib.ops.tune_group import GroupTune
    from deploy_lib.remote.webhook import Notification, Notifier
    from deploy_lib.tune import TuneReport

T = TypeVar("T")
DEPLOYS = ("deploy", "patch", "tune", "router.deploy")  # the commands that take a host to a new release
PRE = {"rollback": HookEvent.pre_rollback} | {command: HookEvent.pre_deploy for command in DEPLOYS}
POST = {"rollback": HookEvent.post_rollback} | {command: HookEvent.post_deploy for command in DEPLOYS}


class Ended(Protocol):
    """A host's end as its hooks and webhook hear of it: deploy's Outcome, the router's RouterOutcome, a sweep's."""

    @property
    def action(self) -> Action: ...
    @property
    def release_id(self) -> str | None: ...  # the release the command left serving
    @property
    def previous_id(self) -> str | None: ...  # the one serving before


E = TypeVar("E", bound=Ended)


@dataclass(frozen=True)
class SweepEnd:
    """A tuning sweep's end on a host: its winner deployed, or the release that served before serving again."""

    action: Action
    release_id: str | None
    previous_id: str | None


def _action(end: HostRun[E]) -> Action:
    """The result's; an error's is rolled back when the release before serves again, else failed."""
    if end.result is not None:
        return end.result.action
    return Action.rolled_back if end.error is not None and end.error.serving_id else Action.failed


def _rolled_back_by_itself(end: HostRun[E]) -> bool:
    return end.error is not None and end.error.serving_id is not None


def notification(end: HostRun[E], service: str) -> Notification | None:
    """What the host's webhook is told of this end; None for an end nobody needs to hear of (unchanged, already
    running, a started release, an error before anything changed)."""
    from deploy_lib.remote.webhook import Notification, NotifyEvent  # loads only where a webhook is set
    error, outcome = end.error, end.result
    if outcome is not None:
        was = outcome.previous_id or "none"
        if outcome.action is Action.deployed:
            return Notification(NotifyEvent.deployed, end.host, service,
                                f"deployed release {outcome.release_id} (was {was})", outcome.release_id,
                                outcome.release_id)
        if outcome.action is Action.rolled_back:
            return Notification(NotifyEvent.rolled_back, end.host, service,
                                f"rolled back by hand to release {outcome.release_id} (was {was})",
                                outcome.release_id, outcome.release_id)
        return None
    if error is None or error.release_id is None:
        return None  # refused or lost before a release was switched: nothing changed that a person must hear of
    first_line = error.message.splitlines()[0]
    if isinstance(error, GateFailed) and error.serving_id:
        return Notification(NotifyEvent.gate_failed, end.host, service, first_line, error.release_id,
                            error.serving_id, figures=error.figures if isinstance(error, WatchFailed) else {})
    if error.serving_id:
        return Notification(NotifyEvent.rolled_back, end.host, service, first_line, error.release_id,
                            error.serving_id)
    if isinstance(error, RollbackFailed | ReadinessFailed):  # a start that failed with nothing to go back to
        return Notification(NotifyEvent.failed, end.host, service, first_line, error.release_id, None)
    return None


def _ends(fleet: FleetRun[E]) -> list[HostRun[E]]:
    return [run for run in fleet.runs if run.started]


def _joined(ids: Sequence[str | None]) -> str | None:
    found = list(dict.fromkeys(i for i in ids if i))
    return ",".join(found) or None


def _group_action(ends: Sequence[HostRun[E]]) -> Action:
    """One outcome for the whole command: every host's, when they share it; else failed when any host failed, else
    deployed (some hosts deployed, the others unchanged)."""
    actions = {_action(end) for end in ends}
    if len(actions) == 1:
        return actions.pop()
    return Action.failed if actions & {Action.failed, Action.rolled_back} else Action.deployed


def _released(end: HostRun[E]) -> tuple[str | None, str | None]:
    """(the release the command took the host to, the one before): from the outcome, or the error's `about`."""
    if end.result is not None:
        return end.result.release_id, end.result.previous_id
    return (end.error.release_id, end.error.previous_id) if end.error is not None else (None, None)


class Announced:
    """A command between its hooks, its hosts' webhooks told how it ended (`around`)."""

    def __init__(self, command: str, scope: Scope, service: str | Callable[[str], str], reach: Reach,
                 profile: str | None = None) -> None:
        self.command, self.scope, self.reach, self.profile = command, scope, reach, profile
        self.service_of = service if callable(service) else (lambda host: service)
        self.progress = reach.progress("")

    def hook(self, event: HookEvent | None, release_id: str | None = None, previous_id: str | None = None,
             outcome: Action | None = None) -> None:
        """The event's hook of the project, if it has one; a pre- hook's failure raises (PreflightError)."""
        if event is None or self.reach.project_root is None:
            return
        context = HookContext(self.command, tuple(self.scope.names), self.profile, release_id, previous_id, outcome)
        result = run_hook(self.reach.project_root, event, context, self.reach.environ)
        if result is not None and not result.ok:
            self.progress.note(f"{event.value} hook {result.path} exited with status {result.exit_code} (the "
                               f"{self.command} itself is done)" + (f": {result.output}" if result.output else ""))

    def around(self, act: Callable[[], FleetRun[E]], release_id: str | None = None) -> FleetRun[E]:
        """The pre- hook (before any host is reached), `act`, then the post- hooks and the notifications; an error
        `act` raises (a one-host command's) is raised again after them."""
        return self.around_call(act, _ends, release_id)

    def around_call(self, act: Callable[[], T], ends: Callable[[T], Sequence[HostRun[E]]],
                    release_id: str | None = None) -> T:
        """`around` for a command whose result is not a FleetRun of ends: `ends` reads each host's end from it."""
        self.hook(PRE.get(self.command), release_id)
        try:
            result = act()
        except DeployError as error:  # a one-host command's, or a whole group's (a multi-node release refused)
            self.ended([HostRun(host, error=error) for host in self.scope.names])
            raise
        self.ended(ends(result))
        return result

    def around_one(self, act: Callable[[], T], end_of: Callable[[T], E]) -> T:
        """`around` for a one-host command whose result holds its end (`end_of`: a patch set's deploy, a sweep)."""
        [host] = self.scope.names
        return self.around_call(act, lambda result: [HostRun(host, result=end_of(result))])

    def ended(self, ends: Sequence[HostRun[E]]) -> None:
        released = [_released(end) for end in ends]
        self.hook(POST.get(self.command), _joined([r for r, _ in released]), _joined([p for _, p in released]),
                  _group_action(ends) if ends else None)
        restored = [end for end in ends if _rolled_back_by_itself(end)]
        if restored and self.command != "rollback":  # the automatic rollback after a failed start or gate
            self.hook(HookEvent.post_rollback, _joined([end.error.serving_id for end in restored if end.error]),
                      _joined([end.error.release_id for end in restored if end.error]), Action.rolled_back)
        told = {target.host.name for target in self.scope.targets if target.host.vars.notify_webhook}
        self.notify([(end.host, notification(end, self.service_of(end.host))) for end in ends if end.host in told])

    def notify(self, notes: Sequence[tuple[str, Notification | None]]) -> None:
        """Each notification to its host's webhook, all sent at once; waits a bounded time for them at the end."""
        urls = {target.host.name: target.host.vars.notify_webhook for target in self.scope.targets}
        notifiers: dict[str, Notifier] = {}
        for host, note in notes:
            url = urls.get(host)
            if note is not None and url is not None:
                from deploy_lib.remote.webhook import NOTIFY_RETRY, Notifier  # urllib.request: a webhook only
                notifiers.setdefault(url, Notifier(url, self.reach.notify_retry or NOTIFY_RETRY)).notify(note)
        for notifier in notifiers.values():
            for sent in notifier.close():
                if not sent.delivered:
                    self.progress.note(f"{sent.notification.host}: the {sent.notification.event} notification was "
                                       f"not delivered to the webhook: {sent.error}")


def _sweep_end(result: TuneReport | Planned) -> SweepEnd:
    """A sweep's end on the host it ran on: its winner deployed when it kept one, else the release before serving."""
    from deploy_lib.tune import TuneReport
    if not isinstance(result, TuneReport):  # a dry run (it runs no hook): nothing changed
        return SweepEnd(Action.unchanged, result.original, result.original)
    kept = result.serving is not None and result.serving != result.original
    return SweepEnd(Action.deployed if kept else Action.unchanged, result.serving or result.original, result.original)


def sweep_ends(result: GroupTune | TuneReport | Planned, scope: Scope) -> list[HostRun[SweepEnd]]:
    """Each host's end of a sweep. One host, or a multi-node group (one server, one table): the sweep's end on every
    host. A group of replicas: a host's error (its part, or the winner's rollout there), else the release it serves
    at the end (the rollout's) against the one before the sweep (a host that measured the winner is "unchanged" by
    the rollout, but deployed by the sweep)."""
    from deploy_lib.commands.tune_request import Planned
    from deploy_lib.tune import TuneReport
    if isinstance(result, TuneReport | Planned):
        return [HostRun(host, result=_sweep_end(result)) for host in scope.names]
    rollout = result.rollout.runs if result.rollout else ()
    errors = {run.host: run.error for run in result.parts.runs if run.error is not None} | {
        run.host: run.error for run in rollout if run.error is not None}
    outcomes = {run.host: run.result for run in rollout if run.result is not None}
    originals = {run.host: run.result.original for run in result.parts.runs if run.result is not None}

    def end(host: str) -> HostRun[SweepEnd]:
        if host in errors:
            return HostRun(host, error=errors[host])
        rolled = outcomes.get(host)
        serving = rolled.release_id if rolled is not None else (result.serving or {}).get(host)
        before = originals.get(host) or (rolled.previous_id if rolled is not None else None) or serving
        return HostRun(host, result=SweepEnd(Action.deployed if serving != before else Action.unchanged, serving,
                                                    before))
    return [end(host) for host in scope.names]


def crash_loops(fleet: FleetRun[StatusReport], scope: Scope, reach: Reach) -> None:
    """Tell each host's webhook of a crash loop systemd gave up on that this status read found first (it recorded
    the crash that ended it in history: the next read finds it recorded and tells nobody again)."""
    from deploy_lib.remote.webhook import Notification, NotifyEvent
    notes: list[tuple[str, Notification | None]] = []
    for run in fleet.runs:
        report = run.result
        if report is not None and report.crashes is not None and report.crashes.gave_up and report.recorded_crashes:
            notes.append((run.host, Notification(NotifyEvent.crash_loop, run.host, report.service,
                                                 f"release {report.current} is down: {report.crashes.verdict}",
                                                 report.current, None)))
    if notes:
        Announced("status", scope, "", reach).notify(notes)


__all__ = ["Announced", "Ended", "SweepEnd", "crash_loops", "notification", "sweep_ends"]
