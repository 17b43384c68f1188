"""The lock of a command that decides from one read whether it changes anything at all (a deploy: a no-op writes
nothing): taken with its first change, released with its last."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from deploy_lib.errors import LockHeld, StepFailed
from deploy_lib.host.store import HELD, raise_if_held, release_quietly
from deploy_lib.remote import OutputLine, Put, Remote, Step, StepResult
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
    first_change_take,
    no_longer_ours,
    release_lock,
    this_process_owner,
)


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
