"""The release store on the host, through a Remote: its read, and the host lock in both its forms.

What of the store reaches the host: its one read-only batch read (`read_store_facts`), and the host lock taken,
held and released (`take_lock`, `holding_lock`, the re-entrant `host_lock` every change to a store runs under,
`unlock`). The steps and the decisions are planning's (facts.py, lock.py); here they are only sent through the
`Remote` each function is given.

The lock of a command that decides from one read whether it changes anything at all (a deploy: a no-op writes
nothing): taken with its first change, released with its last."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from deploy_lib.errors import DeployError, LockHeld, StepFailed
from deploy_lib.remote import OutputLine, Put, Remote, Step, StepResult
from deploy_lib.remote.readings import read
from deploy_lib.store.facts import StoreFacts, parse_store_facts, release_fact_steps
from deploy_lib.store.layout import StoreLayout
from deploy_lib.store.lock import (
    LOCK_STILL_OURS,
    LOCK_STILL_THEIRS,
    LOCK_STORE_UNCHANGED,
    LOCK_TAKE,
    LockContext,
    LockInfo,
    LockOwner,
    Takeover,
    acquire_lock,
    first_change_take,
    lock_fact_steps,
    lock_held_error,
    lock_staleness,
    no_longer_ours,
    parse_lock_facts,
    release_lock,
    remove_lock,
    this_process_owner,
)


def read_store_facts(remote: Remote, layout: StoreLayout) -> StoreFacts:
    return parse_store_facts(layout, read(remote, release_fact_steps(layout)))


def read_lock(remote: Remote, layout: StoreLayout) -> LockInfo | None:
    return parse_lock_facts(read(remote, lock_fact_steps(layout)))


def raise_if_held(remote: Remote, layout: StoreLayout, context: LockContext) -> None:
    """After a failed take: LockHeld naming the holder; none when no lock exists (not contention: a full disk...)."""
    lock = read_lock(remote, layout)
    if lock is not None:
        raise context.held_by(lock) from None


def take_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> None:
    """Take the lock (over from an owner that is gone: `LockContext.takeover`), or raise LockHeld naming its owner
    (and whether it looks stale)."""
    try:
        remote.run(acquire_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_TAKE:
            raise
        lock = read_lock(remote, layout)
        takeover = context.takeover(lock) if lock is not None else None
        if takeover is None:
            raise_if_held(remote, layout, context)
            raise
        try:
            remote.run([*takeover.steps(layout, context.where), *acquire_lock(layout, owner),
                        *takeover.recorded(layout, context.where)])
            context.announce(takeover)
        except StepFailed as again:  # another command took it over first
            if getattr(again.step, "name", None) not in (LOCK_TAKE, LOCK_STILL_THEIRS):
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


def release_quietly(remote: Remote, layout: StoreLayout, owner: LockOwner) -> None:
    try:
        remote.run(release_lock(layout, owner))
    except DeployError:
        pass  # the error that is propagating matters more than a lock left behind


# Locks this process holds, by (remote, lock path): a library call that changes the host takes the lock itself, and
# one that runs inside another (patch-fusion's deploy, deploy's venv build) reuses it, as Kamal's `holding_lock?`.
HELD: dict[tuple[int, str], LockOwner] = {}


@contextmanager
def host_lock(remote: Remote, layout: StoreLayout, purpose: str, where: str,
              context: LockContext | None = None) -> Iterator[LockOwner]:
    """The one lock for every change to a service's store on a host: deploy, rollback, venv build/adopt/derive,
    patching, prune. Re-entrant within this process; released on any exit, Ctrl-C included (`holding_lock`)."""
    key = (id(remote), str(layout.lock))
    if key in HELD:
        yield HELD[key]
        return
    owner = this_process_owner(purpose, datetime.now(UTC))
    with holding_lock(remote, layout, owner, context or LockContext(where=where)) as held:
        HELD[key] = held
        try:
            yield held
        finally:
            del HELD[key]


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


class LockOnFirstChange:
    """The host's lock for a command that may change nothing: a Remote that passes the command's read through, then
    takes the lock in the first round trip after it and releases it in the last (`finish`), so that a command that
    changes nothing takes no lock and writes nothing.

    The read carries the lock's state and the store's digest (`release_fact_steps`); `decided_from` refuses at once
    when someone holds the lock (LockHeld, as `take_lock` would). The take is a compare-and-set: mkdir, owner.json,
    then the store's digest compared with the one read, all before the first change of that round trip; a store
    another command changed meanwhile ends the command with LockHeld and nothing changed. Inside a lock this process
    holds already (`host_lock`: a patch-fusion deploy, a venv build) it only passes batches through. A lock whose
    owner is gone (`LockContext.takeover`) is taken over in the same first round trip, and history records it."""

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
        self.takeover: Takeover | None = None  # a dead owner's lock, removed by the take

    def decided_from(self, lock: LockInfo | None, digest: str | None, purpose: str | None = None) -> None:
        """The command decides from a read carrying the lock's state and the store's digest: raise LockHeld when
        another run holds the lock; any later batch takes it first (owner.json saying `purpose`, when given)."""
        if self.held_already:
            return
        if purpose is not None:
            self.owner = replace(self.owner, purpose=purpose)
        if lock is not None:
            self.takeover = self.context.takeover(lock)
            if self.takeover is None:
                raise self.context.held_by(lock)
        self.digest = digest or ""

    def _take_steps(self) -> list[Step | Put]:
        if self.held_already or self.digest is None or self.taken:
            return []
        return first_change_take(self.layout, self.owner, self.digest, self.takeover, self.context.where)

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
            if name in (LOCK_TAKE, LOCK_STILL_THEIRS):
                self.taken = False
                raise_if_held(self.inner, self.layout, self.context)
                raise
            if name == LOCK_STORE_UNCHANGED:
                self.release_quietly()
                raise LockHeld(f"the release store on {self.context.where} changed after this command read it "
                               "(another command ran meanwhile); nothing was changed",
                               hint="rerun: it decides again from the host as it is now") from None
            raise
        self.context.announce(self.takeover)
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
    held = HELD.get(key)
    locked = LockOnFirstChange(remote, layout, held or this_process_owner(purpose, datetime.now(UTC)),
                               context or LockContext(where=where), held_already=held is not None)
    # the lock held already is held through this remote too: a venv build inside the block re-enters it
    through = (id(locked), str(layout.lock))
    if held is not None:
        HELD[through] = held
    try:
        yield locked
    except BaseException:
        locked.release_quietly()
        raise
    finally:
        HELD.pop(through, None)
    locked.finish([])
