"""What of the store reaches the host: its one read-only batch read (`read_store_facts`), and the host lock taken,
held and released (`take_lock`, `holding_lock`, the re-entrant `host_lock` every change to a store runs under,
`unlock`). The steps and the decisions are planning's (facts.py, lock.py); here they are only sent through the
`Remote` each function is given."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from deploy_lib.errors import DeployError, StepFailed
from deploy_lib.remote import Remote
from deploy_lib.remote.readings import read
from deploy_lib.store.facts import StoreFacts, parse_store_facts, release_fact_steps
from deploy_lib.store.layout import StoreLayout
from deploy_lib.store.lock import (
    LOCK_STILL_OURS,
    LOCK_STILL_THEIRS,
    LOCK_TAKE,
    LockContext,
    LockInfo,
    LockOwner,
    acquire_lock,
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
