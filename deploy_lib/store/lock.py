"""The host lock (Kamal's: mkdir is the atomic test-and-set, owner.json says who): who holds it, whether it looks
abandoned, the one re-entrant `host_lock` every change to a store runs under, and `lock_on_first_change` for a
command that decides from one read whether it changes anything at all (a deploy: a no-op writes nothing)."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from deploy_lib.errors import DeployError, LockHeld, StepFailed
from deploy_lib.facts.readings import ABSENT_OK, Readings, read
from deploy_lib.remote import OutputLine, Put, Remote, Step, StepResult
from deploy_lib.store.layout import FILE_MODE, StoreLayout, iso_time, json_line

# A lock older than this is reported as stale even when its owner cannot be checked (another machine).
STALE_LOCK_AFTER_S = 3 * 3600
# A lock directory without owner.json (acquire interrupted between mkdir and the write) is stale after this.
OWNERLESS_LOCK_GRACE_S = 60

FACT_CLOCK = "store facts: clock"
FACT_LOCK = "store facts: lock"
FACT_LOCK_OWNER = "store facts: lock owner"
FACT_STORE_DIGEST = "store facts: digest"

# What a command decides from and another command changes: where current points, each release directory and file
# (name, size, mtime) and history's size and mtime; their sha256, printed by the read and compared by the take.
_STORE_DIGEST = ('{ readlink -- "$1"; find "$2" -mindepth 1 -maxdepth 2 -printf \'%P %s %T@\\n\'; '
                 'stat -c \'%s %Y\' -- "$3"; } 2>/dev/null | sha256sum')


def _digest_argv(layout: StoreLayout, script: str, *more: str) -> tuple[str, ...]:
    return ("sh", "-c", script, "sh", str(layout.current), str(layout.releases), str(layout.history), *more)


def store_digest_step(layout: StoreLayout) -> Step:
    """Read-only: the digest of the store's state that `lock_on_first_change` compares when it takes the lock."""
    return Step(FACT_STORE_DIGEST, _digest_argv(layout, _STORE_DIGEST), ok=ABSENT_OK)


def parse_store_digest(result: StepResult | None) -> str | None:
    return result.stdout.strip() if result is not None and result.exit_code == 0 and result.stdout.strip() else None


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
LOCK_STORE_UNCHANGED = "lock: store unchanged since it was read"


def store_unchanged_step(layout: StoreLayout, digest: str) -> Step:
    """Exit 0 when the store's digest is still `digest` (what the command decided from), 1 when it changed."""
    return Step(LOCK_STORE_UNCHANGED, _digest_argv(layout, f'test "$({_STORE_DIGEST})" = "$4"', digest))


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

    def held_by(self, lock: LockInfo) -> LockHeld:
        return lock_held_error(self.where, lock, lock_staleness(lock, self.this_host, self.is_alive,
                                                                self.stale_after_s))


def read_lock(remote: Remote, layout: StoreLayout) -> LockInfo | None:
    return parse_lock_facts(read(remote, lock_fact_steps(layout)))


def raise_if_held(remote: Remote, layout: StoreLayout, context: LockContext) -> None:
    """After a failed take: LockHeld naming the holder; none when no lock exists (not contention: a full disk...)."""
    lock = read_lock(remote, layout)
    if lock is not None:
        raise context.held_by(lock) from None


def take_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> None:
    """Take the lock, or raise LockHeld naming its owner (and whether it looks stale)."""
    try:
        remote.run(acquire_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_TAKE:
            raise
        raise_if_held(remote, layout, context)
        raise


@contextmanager
def holding_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> Iterator[LockOwner]:
    """Hold the lock for the block; released on any exit, Ctrl-C included, if it is still ours."""
    try:
        take_lock(remote, layout, owner, context)
    except KeyboardInterrupt:  # the host may have taken it before the interrupt reached this process
        release_quietly(remote, layout, owner)
        raise
    try:
        yield owner
    except BaseException:
        release_quietly(remote, layout, owner)
        raise
    try:
        remote.run(release_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_STILL_OURS:
            raise
        raise no_longer_ours(context.where) from failure


def no_longer_ours(where: str) -> LockHeld:
    return LockHeld(f"the deploy lock on {where} was no longer ours at the end of this run (forced open and taken "
                    "by someone else?); it was left in place", hint="`invoke unlock` shows who holds it now")


def release_quietly(remote: Remote, layout: StoreLayout, owner: LockOwner) -> None:
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


class LockOnFirstChange:
    """The host's lock for a command that may change nothing: a Remote that passes the command's read through, then
    takes the lock in the first round trip after it and releases it in the last (`finish`), so that a command that
    changes nothing takes no lock and writes nothing.

    The read carries the lock's state and the store's digest (`release_fact_steps`); `decided_from` refuses at once
    when someone holds the lock (LockHeld, as `take_lock` would). The take is a compare-and-set: mkdir, owner.json,
    then the store's digest compared with the one read, all before the first change of that round trip; a store
    another command changed meanwhile ends the command with LockHeld and nothing changed. Inside a lock this process
    holds already (`host_lock`: a patch-fusion deploy, a venv build) it only passes batches through."""

    def __init__(self, remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext,
                 held_already: bool) -> None:
        self.inner = remote
        self.layout = layout
        self.owner = owner
        self.context = context
        self.held_already = held_already
        self.digest: str | None = None  # the store as the command read it; None: not decided yet
        self.taken = False  # the take was sent: released on the way out, if it is still ours
        self.released = False

    def decided_from(self, lock: LockInfo | None, digest: str | None, purpose: str | None = None) -> None:
        """The command decides from a read carrying the lock's state and the store's digest: raise LockHeld when
        another run holds the lock; any later batch takes it first (owner.json saying `purpose`, when given)."""
        if self.held_already:
            return
        if purpose is not None:
            self.owner = replace(self.owner, purpose=purpose)
        if lock is not None:
            raise self.context.held_by(lock)
        self.digest = digest or ""

    def _take_steps(self) -> list[Step | Put]:
        if self.held_already or self.digest is None or self.taken:
            return []
        return [*acquire_lock(self.layout, self.owner), store_unchanged_step(self.layout, self.digest)]

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        if not batch:
            return []
        return self._send([*batch], [], on_output)

    def finish(self, batch: Sequence[Step | Put]) -> list[StepResult]:
        """Run the command's last batch with the lock's release in the same round trip (when the command took the
        lock, or takes it with this batch); raise LockHeld when the lock is no longer ours by then."""
        taking = bool(batch and self._take_steps())
        release = release_lock(self.layout, self.owner) if (self.taken and not self.released) or taking else []
        if not batch and not release:
            return []
        try:
            results = self._send([*batch], release, None)
        except StepFailed as failure:
            if getattr(failure.step, "name", None) != LOCK_STILL_OURS:
                raise
            self.released = True
            raise no_longer_ours(self.context.where) from failure
        self.released = self.released or bool(release)
        return results

    def _send(self, batch: list[Step | Put], release: Sequence[Step | Put], on_output: OutputLine | None
              ) -> list[StepResult]:
        """One call of the inner remote: the take first when the lock is still to be taken, the release last."""
        take = self._take_steps()
        if not take:
            return self.inner.run([*batch, *release], on_output)[:len(batch)]
        self.taken = True
        try:
            results = self.inner.run([*take, *batch, *release], on_output)
        except StepFailed as failure:
            name = getattr(failure.step, "name", None)
            if name == LOCK_TAKE:
                self.taken = False
                raise_if_held(self.inner, self.layout, self.context)
                raise
            if name == LOCK_STORE_UNCHANGED:
                self.release_quietly()
                raise LockHeld(f"the release store on {self.context.where} changed after this command read it "
                               "(another command ran meanwhile); nothing was changed",
                               hint="rerun: it decides again from the host as it is now") from None
            raise
        return results[len(take):len(take) + len(batch)]

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        self._send([], [], None)  # rsync is a round trip of its own: the lock is taken before it
        return self.inner.push_directory(local_dir, dest, link_dest, on_output)

    def close(self) -> None:
        self.inner.close()

    def release_quietly(self) -> None:
        """Release the lock if this command took it and it is still ours; an error here would hide the real one."""
        if self.taken and not self.released:
            self.released = True
            release_quietly(self.inner, self.layout, self.owner)


@contextmanager
def lock_on_first_change(remote: Remote, layout: StoreLayout, purpose: str, where: str,
                         context: LockContext | None = None) -> Iterator[LockOnFirstChange]:
    """The block's remote (`LockOnFirstChange`): the lock taken with the first batch after the read the block
    decides from, released with its last (`finish`) or on any exit, Ctrl-C included; inside `host_lock` it passes
    batches through."""
    key = (id(remote), str(layout.lock))
    held = _HELD.get(key)
    locked = LockOnFirstChange(remote, layout, held or this_process_owner(purpose, datetime.now(UTC)),
                               context or LockContext(where=where), held_already=held is not None)
    # the lock held already is held through this remote too: a venv build inside the block re-enters it
    through = (id(locked), str(layout.lock))
    if held is not None:
        _HELD[through] = held
    try:
        yield locked
    except BaseException:
        locked.release_quietly()
        raise
    finally:
        _HELD.pop(through, None)
    locked.finish([])


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
