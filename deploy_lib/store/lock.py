"""The host lock (Kamal's: mkdir is the atomic test-and-set, owner.json says who): who holds it, whether it looks
abandoned, and the one re-entrant `host_lock` every change to a store runs under."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from deploy_lib.errors import DeployError, LockHeld, StepFailed
from deploy_lib.readings import ABSENT_OK, Readings, read
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.store.layout import FILE_MODE, StoreLayout, iso_time, json_line

# A lock older than this is reported as stale even when its owner cannot be checked (another machine).
STALE_LOCK_AFTER_S = 3 * 3600
# A lock directory without owner.json (acquire interrupted between mkdir and the write) is stale after this.
OWNERLESS_LOCK_GRACE_S = 60

FACT_CLOCK = "store facts: clock"
FACT_LOCK = "store facts: lock"
FACT_LOCK_OWNER = "store facts: lock owner"


def lock_fact_steps(layout: StoreLayout) -> list[Step]:
    return [
        Step(FACT_CLOCK, ("date", "+%s")),
        Step(FACT_LOCK, ("stat", "-c", "%Y", "--", str(layout.lock)), ok=ABSENT_OK),
        Step(FACT_LOCK_OWNER, ("cat", "--", str(layout.lock_owner)), ok=ABSENT_OK),
    ]


@dataclass(frozen=True)
class LockOwner:
    """Who holds the lock and for what; `token` tells this holder's lock from one taken after a forced unlock."""

    user: str
    host: str
    pid: int
    time: str
    purpose: str   # what the holder is doing: "deploy glm5-nvfp4", "venv build", ...
    token: str

    def to_json(self) -> bytes:
        return json_line({"user": self.user, "host": self.host, "pid": self.pid, "time": self.time,
                           "purpose": self.purpose, "token": self.token})

    @classmethod
    def from_json(cls, text: str) -> LockOwner:
        data = json.loads(text)
        # owner.json written before `purpose` existed names the release being deployed
        purpose = data["purpose"] if "purpose" in data else f"deploy of release {data['release']}"
        return cls(user=str(data["user"]), host=str(data["host"]), pid=int(data["pid"]), time=str(data["time"]),
                   purpose=str(purpose), token=str(data["token"]))

    def __str__(self) -> str:
        return f"{self.user}@{self.host} (pid {self.pid}) since {self.time} ({self.purpose})"


def this_process_owner(purpose: str, now: datetime) -> LockOwner:
    return LockOwner(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid(), time=iso_time(now),
                     purpose=purpose, token=secrets.token_hex(8))


@dataclass(frozen=True)
class LockInfo:
    owner: LockOwner | None  # None: owner.json missing or unreadable
    age_s: float             # from the lock directory's mtime, by the host's own clock


def parse_lock(clock_out: str, stat: StepResult, owner: StepResult) -> LockInfo | None:
    if stat.exit_code != 0:
        return None
    try:
        lock_owner: LockOwner | None = LockOwner.from_json(owner.stdout) if owner.exit_code == 0 else None
    except (ValueError, KeyError, TypeError):
        lock_owner = None
    return LockInfo(lock_owner, max(float(clock_out.strip()) - float(stat.stdout.strip()), 0.0))


def parse_lock_facts(results: Sequence[StepResult] | Readings) -> LockInfo | None:
    found = Readings.of(results)
    return parse_lock(found[FACT_CLOCK].stdout, found[FACT_LOCK], found[FACT_LOCK_OWNER])


LOCK_TAKE = "lock: take"
LOCK_STILL_OURS = "lock: still ours"


def acquire_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    return [
        Step("lock: store directory", ("mkdir", "-p", "--", str(layout.base)), sudo=True),
        Step(LOCK_TAKE, ("mkdir", "--", str(layout.lock)), sudo=True),
        Put(layout.lock_owner, owner.to_json(), FILE_MODE, sudo=True),
    ]


def release_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    """Remove the lock only if it is still ours (someone may have forced it open and taken it since)."""
    token = f'"token":"{owner.token}"'
    return [
        Step(LOCK_STILL_OURS, ("grep", "-q", "-F", "-e", token, "--", str(layout.lock_owner))),
        Step("lock: release", ("rm", "-rf", "--", str(layout.lock)), sudo=True),
    ]


def remove_lock(layout: StoreLayout) -> list[Step | Put]:
    return [Step("lock: remove", ("rm", "-rf", "--", str(layout.lock)), sudo=True)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def lock_staleness(lock: LockInfo, this_host: str, is_alive: Callable[[int], bool],
                   stale_after_s: float = STALE_LOCK_AFTER_S) -> str | None:
    """Why the lock looks abandoned, or None while its owner may still be working."""
    owner = lock.owner
    if owner is not None and owner.host == this_host and not is_alive(owner.pid):
        return f"its owner, pid {owner.pid} on this machine ({this_host}), is no longer running"
    if owner is None and lock.age_s > OWNERLESS_LOCK_GRACE_S:
        return f"it has no readable owner.json and is {lock.age_s:.0f} s old"
    if lock.age_s > stale_after_s:
        return f"it is {lock.age_s / 3600:.1f} h old (stale after {stale_after_s / 3600:.1f} h)"
    return None


def lock_held_error(where: str, lock: LockInfo, staleness: str | None) -> LockHeld:
    holder = str(lock.owner) if lock.owner else "an unknown owner (no readable owner.json)"
    message = f"the deploy lock on {where} is held by {holder}; lock age {lock.age_s:.0f} s"
    if staleness:
        return LockHeld(f"{message}; it looks stale: {staleness}",
                        hint="`invoke unlock` removes it")
    return LockHeld(message, hint="wait for that run to finish; if you are sure it is gone, "
                                  "`invoke unlock --force` removes the lock")


@dataclass(frozen=True)
class LockContext:
    """What lock decisions need to know about this machine; injectable for tests."""

    where: str                                   # the target host, for messages
    this_host: str = field(default_factory=socket.gethostname)
    is_alive: Callable[[int], bool] = pid_alive
    stale_after_s: float = STALE_LOCK_AFTER_S


def read_lock(remote: Remote, layout: StoreLayout) -> LockInfo | None:
    return parse_lock_facts(read(remote, lock_fact_steps(layout)))


def take_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> None:
    """Take the lock, or raise LockHeld naming its owner (and whether it looks stale)."""
    try:
        remote.run(acquire_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_TAKE:
            raise
        lock = read_lock(remote, layout)
        if lock is None:
            raise  # mkdir failed and no lock exists: not contention (read-only or full filesystem, ...)
        raise lock_held_error(context.where, lock,
                              lock_staleness(lock, context.this_host, context.is_alive, context.stale_after_s)
                              ) from None


@contextmanager
def holding_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> Iterator[LockOwner]:
    """Hold the lock for the block; released on any exit, Ctrl-C included, if it is still ours."""
    try:
        take_lock(remote, layout, owner, context)
    except KeyboardInterrupt:  # the host may have taken it before the interrupt reached this process
        _release_quietly(remote, layout, owner)
        raise
    try:
        yield owner
    except BaseException:
        _release_quietly(remote, layout, owner)
        raise
    try:
        remote.run(release_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_STILL_OURS:
            raise
        raise LockHeld(f"the deploy lock on {context.where} was no longer ours at the end of this run "
                       "(forced open and taken by someone else?); it was left in place",
                       hint="`invoke unlock` shows who holds it now") from failure


def _release_quietly(remote: Remote, layout: StoreLayout, owner: LockOwner) -> None:
    try:
        remote.run(release_lock(layout, owner))
    except DeployError:
        pass  # the error that is propagating matters more than a lock left behind


# Locks this process holds, by (remote, lock path): a library call that changes the host takes the lock itself, and
# one that runs inside another (patch-fusion's deploy, deploy's venv build) reuses it, as Kamal's `holding_lock?`.
_HELD: dict[tuple[int, str], LockOwner] = {}


@contextmanager
def host_lock(remote: Remote, layout: StoreLayout, purpose: str, where: str,
              context: LockContext | None = None) -> Iterator[LockOwner]:
    """The one lock for every change to a service's store on a host: deploy, rollback, venv build/adopt/derive,
    patching, prune. Re-entrant within this process; released on any exit, Ctrl-C included (`holding_lock`)."""
    key = (id(remote), str(layout.lock))
    if key in _HELD:
        yield _HELD[key]
        return
    owner = this_process_owner(purpose, datetime.now(UTC))
    with holding_lock(remote, layout, owner, context or LockContext(where=where)) as held:
        _HELD[key] = held
        try:
            yield held
        finally:
            del _HELD[key]


def unlock(remote: Remote, layout: StoreLayout, force: bool, context: LockContext) -> LockInfo | None:
    """Remove the lock if stale, or if `force`; returns what was removed (None: there was no lock)."""
    lock = read_lock(remote, layout)
    if lock is None:
        return None
    staleness = lock_staleness(lock, context.this_host, context.is_alive, context.stale_after_s)
    if staleness is None and not force:
        raise lock_held_error(context.where, lock, None)
    remote.run(remove_lock(layout))
    return lock
