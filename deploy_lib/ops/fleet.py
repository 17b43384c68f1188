"""A group of hosts as one target. Which hosts run in which batch and when a rollout stops is decided by pure code
with Ansible's `serial` and `max_fail_percentage` semantics (ansible-core, lib/ansible/executor/playbook_executor.py
`_get_serialized_batches`, lib/ansible/plugins/strategy/linear.py); the runner acts on each batch's hosts in
parallel through the per-host entry points (deploy, rollback, status...), one connection per host and thread.
Each host keeps its own release store, lock, history and automatic rollback."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from deploy_lib.deploy.project import Target
from deploy_lib.errors import (
    ConfigError,
    ConnectFailed,
    DeployError,
    DriftDetected,
    LockHeld,
    PreflightError,
    RollbackFailed,
)
from deploy_lib.interrupts import Interrupt, interrupted, signals_noted
from deploy_lib.outcomes import Action
from deploy_lib.progress import Progress

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome

T = TypeVar("T")
Item = TypeVar("Item")
_SIZE_RE = re.compile(r"^(?P<number>[0-9]{1,6})(?P<percent>%?)$")
# errors raised before anything on the host changed (docs/troubleshooting.md: "nothing"; no connection at all)
_NOTHING_CHANGED = (ConfigError, PreflightError, LockHeld, DriftDetected, ConnectFailed)


@dataclass(frozen=True)
class Size:
    """A number of hosts, or a percentage of some number of hosts."""

    number: int
    percent: bool = False

    @classmethod
    def parse(cls, option: str, text: str, minimum: int) -> Size:
        match = _SIZE_RE.match(text.strip())
        size = cls(int(match["number"]), bool(match["percent"])) if match else None
        if size is None or size.number < minimum or (size.percent and size.number > 100):
            raise ConfigError(f"{option} takes a whole number of hosts (>= {minimum}) or a percentage "
                              f"({minimum}%-100%), got {text!r}", f"for example {option} 2 or {option} 25%")
        return size

    def __str__(self) -> str:
        return f"{self.number}{'%' if self.percent else ''}"


@dataclass(frozen=True)
class Rollout:
    """`--serial` (hosts per batch; several values are Ansible's list: one per batch, the last one repeating) and
    `--max-fail`: K hosts may fail in the whole rollout, or (K%) Ansible's max_fail_percentage of each batch."""

    serial: tuple[Size, ...] = ()
    max_fail: Size | None = None

    @classmethod
    def parse(cls, serial: Iterable[str] = (), max_fail: str | None = None) -> Rollout:
        return cls(tuple(Size.parse("--serial", text, 1) for text in serial),
                   Size.parse("--max-fail", max_fail, 0) if max_fail is not None else None)

    def batches(self, hosts: Sequence[str]) -> list[list[str]]:
        """Ansible's serialized batches: without serial one batch of every host; a percentage of the whole group,
        rounded down but at least one host."""
        left = list(hosts)
        found: list[list[str]] = []
        sizes = self.serial or (None,)
        while left:
            size = sizes[min(len(found), len(sizes) - 1)]
            count = len(left) if size is None else \
                (int(size.number / 100 * len(hosts)) or 1) if size.percent else size.number
            found.append(left[:count])
            left = left[count:]
        return found

    def stop_reason(self, batch_size: int, failed_in_batch: int, failed_total: int) -> str | None:
        """Why the rollout stops after a batch, or None to go on. --max-fail K stops once more than K hosts failed
        in the whole rollout (K is the number the user allows, so it alone decides); otherwise Ansible's rules: K%
        once more than K% of a batch failed, and always once every host of a batch failed."""
        limit = self.max_fail
        if limit is not None and not limit.percent:
            return f"{_hosts(failed_total)} failed, more than --max-fail {limit}" if failed_total > limit.number \
                else None
        if limit is not None and failed_in_batch * 100 > limit.number * batch_size:
            return f"{failed_in_batch} of {_hosts(batch_size)} of the batch failed, more than --max-fail {limit}"
        if batch_size and failed_in_batch == batch_size:
            return f"every host of the batch failed ({batch_size})"
        return None


def _hosts(count: int) -> str:
    return f"{count} host{'' if count == 1 else 's'}"


ALL_AT_ONCE = Rollout()  # no --serial: one batch of every host


@dataclass(frozen=True)
class HostRun(Generic[T]):
    """One host's part: what the per-host call returned or raised; not started when the rollout stopped first."""

    host: str
    result: T | None = None
    error: DeployError | None = None
    started: bool = True

    @property
    def exit_code(self) -> int:
        return self.error.exit_code if self.error else 0


@dataclass(frozen=True)
class FleetRun(Generic[T]):
    runs: tuple[HostRun[T], ...]
    batches: tuple[tuple[str, ...], ...]
    stopped: str | None = None          # why hosts were left untouched
    interruption: DeployError | None = None  # a signal: no new host started, the running ones finished

    @property
    def not_started(self) -> list[str]:
        return [run.host for run in self.runs if not run.started]

    @property
    def failed(self) -> list[str]:
        return [run.host for run in self.runs if run.error is not None]

    @property
    def exit_code(self) -> int:
        """0 only when every host did its part; otherwise the worst host's code (see worst_exit_code)."""
        codes = [run.exit_code for run in self.runs]
        if self.interruption is not None:
            codes.append(self.interruption.exit_code)
        return worst_exit_code(codes)


def worst_exit_code(codes: Iterable[int]) -> int:
    """The code that needs most attention: 8 (a host's unit is left stopped) first, then the highest."""
    found = set(codes) - {0}
    if not found:
        return 0
    return RollbackFailed.exit_code if RollbackFailed.exit_code in found else max(found)


def run_hosts(targets: Sequence[Target], act: Callable[[Target], T], progress: Progress,
              rollout: Rollout = ALL_AT_ONCE) -> FleetRun[T]:
    """Act on every target, batch by batch (hosts of a batch in parallel, one thread and connection each); stop
    starting batches when the rollout's limit is passed. SIGINT/SIGTERM start no new host: the running ones finish
    (each ends verified or rolled back, as a single-host deploy does), then the run ends with Interrupted."""
    by_name = {target.host.name: target for target in targets}
    batches = rollout.batches(list(by_name))
    runs: dict[str, HostRun[T]] = {}
    stopped: str | None = None
    failed_total = 0
    with _signals_noted(progress) as signals:
        for number, batch in enumerate(batches, 1):
            if stopped or signals:
                runs |= {host: HostRun(host, started=False) for host in batch}
                continue
            if len(batches) > 1:
                progress.phase_started(f"batch {number} of {len(batches)}: {', '.join(batch)}")
            futures = in_parallel([by_name[host] for host in batch], act, "host")
            done = {host: host_run(host, future) for host, future in zip(batch, futures, strict=True)}
            runs |= done
            failed_in_batch = sum(run.error is not None for run in done.values())
            failed_total += failed_in_batch
            if number < len(batches):
                stopped = rollout.stop_reason(len(batch), failed_in_batch, failed_total)
                if stopped:
                    progress.note(f"rollout stopped: {stopped}")
    interruption = interrupted(Interrupt(signals[0]), f"interrupted ({signal.Signals(signals[0]).name}): no "
                               "further host was started; the hosts already running finished first") \
        if signals else None
    return FleetRun(tuple(runs[host] for host in by_name), tuple(map(tuple, batches)), stopped, interruption)


def in_parallel(items: Sequence[Item], act: Callable[[Item], T], thread_name: str) -> list[Future[T]]:
    """`act` on every item at once, one thread (and so one connection) each; returns once every one has ended, its
    result or error in its future. The one way hosts act together: a group's batch (run_hosts: each host's error
    is its own) and a multi-node release's nodes (multinode_switch.each: the first error is the group's)."""
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix=thread_name) as pool:
        futures = [pool.submit(act, item) for item in items]
        wait(futures)
    return futures


def _signals_noted(progress: Progress) -> AbstractContextManager[list[int]]:
    """SIGINT and SIGTERM are noted, not raised, while hosts deploy: a deploy in a worker thread cannot be
    interrupted (handlers run in the main thread only), so the run starts no further host and lets the running
    ones finish their transition."""
    return signals_noted(lambda signum: progress.note(f"{signal.Signals(signum).name}: starting no further host; "
                                                      "the running ones finish first"))


def host_run(host: str, future: Future[T]) -> HostRun[T]:
    """A finished host's future as its result: a DeployError is that host's failure, anything else a bug raised."""
    error = future.exception()
    if error is None:
        return HostRun(host, result=future.result())
    if isinstance(error, DeployError):
        return HostRun(host, error=error)
    raise error  # a bug, not a host's failure: shown whole


@dataclass(frozen=True)
class HostEnd:
    """How a host's call that returned ended: what the command did, and what runs there now (a dry run: what ran)."""

    outcome: Action
    release: str | None
    serving: str | None
    ready_s: float | None = None


@dataclass(frozen=True)
class HostSummary:
    """One row of a group deploy's or rollback's result table."""

    host: str
    outcome: Action
    release: str | None          # the release this command took the host to (or tried to)
    serving: str                 # what runs on the host now, as far as this command knows
    ready_s: float | None = None
    cause: str = ""
    exit_code: int = 0


@dataclass(frozen=True)
class Summary:
    rows: tuple[HostSummary, ...]
    stopped: str | None
    exit_code: int
    interruption: str | None = None
    by_release: dict[str, list[str]] = field(default_factory=dict)  # serving release -> hosts


def outcome_end(outcome: Outcome) -> HostEnd:
    """A deploy's, rollback's or plan's end on a host; a dry run changed nothing, so what ran before still serves."""
    serving = outcome.previous_id if outcome.action is Action.planned else outcome.release_id
    return HostEnd(outcome.action, outcome.release_id, serving, outcome.ready.duration_s if outcome.ready else None)


def would_change(fleet: FleetRun[Outcome]) -> bool:
    """A dry run's verdict: some host's plan changes it (`plan --detailed-exitcode` exits 2 then)."""
    return any(run.result is not None and run.result.plan is not None and not run.result.plan.unchanged
               for run in fleet.runs)


def summarize(fleet: FleetRun[T], ended: Callable[[T], HostEnd]) -> Summary:
    """The per-host table and which hosts run which release, from the per-host outcomes and errors."""
    rows = []
    for run in fleet.runs:
        if not run.started:
            why = fleet.stopped or (fleet.interruption.message if fleet.interruption else "")
            rows.append(HostSummary(run.host, Action.not_started, None, "untouched", cause=why))
        elif run.error is not None:
            rows.append(HostSummary(run.host, Action.failed, run.error.release_id, serving_after(run.error), None,
                                    run.error.message, run.error.exit_code))
        else:
            assert run.result is not None
            end = ended(run.result)
            rows.append(HostSummary(run.host, end.outcome, end.release, end.serving or "none", end.ready_s))
    by_release: dict[str, list[str]] = {}
    for row in rows:
        by_release.setdefault(row.serving, []).append(row.host)
    return Summary(tuple(rows), fleet.stopped, fleet.exit_code,
                   fleet.interruption.message if fleet.interruption else None, by_release)


def serving_after(error: DeployError) -> str:
    """What a host that failed runs now: the release it was rolled back to, or what it ran before when the error
    came before any change; `status` tells when neither is known."""
    if isinstance(error, RollbackFailed):
        return "none (unit stopped)"
    if error.serving_id:
        return error.serving_id
    if isinstance(error, _NOTHING_CHANGED):
        return "as before"
    return "unknown (see status)"


__all__ = ["ALL_AT_ONCE", "FleetRun", "HostEnd", "HostRun", "HostSummary", "Rollout", "Size", "Summary", "in_parallel",
           "outcome_end", "run_hosts", "serving_after", "summarize", "worst_exit_code",
           "would_change"]
