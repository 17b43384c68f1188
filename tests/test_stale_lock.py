"""A lock whose owner is gone is taken over by the next command, with one line and a history record: the host
rebooted since it was taken (its boot id changed), or the owner's process on this machine no longer exists. Every
other lock stands: a live owner, one on another machine, an old one (`unlock`, `unlock --force`)."""

from __future__ import annotations

import json

import pytest
from helpers.fake_remote import FakeRemote

from deploy_lib.errors import LockHeld
from deploy_lib.host.store import lock_on_first_change, take_lock
from deploy_lib.remote import Step
from deploy_lib.store import (
    FACT_BOOT_ID,
    FACT_CLOCK,
    FACT_LOCK,
    FACT_LOCK_BOOT,
    FACT_LOCK_OWNER,
    LOCK_TAKE,
    LockContext,
    LockInfo,
    LockOwner,
    StoreLayout,
    owner_gone,
)
from deploy_lib.store.lock import FACT_UP, LOCK_STILL_THEIRS, lock_staleness

LAYOUT = StoreLayout("sglang")
BOOT_THEN, BOOT_NOW = "3ddfbdf7-140e-464f-96dd-25a9ed396369", "0b8bcf0f-1945-47ab-845d-7b05926d0b94"
HOLDER = LockOwner("ops", "laptop", 4242, "2026-12-01T23:50:00+00:00", "deploy glm5-omp4", "beef")
ME = LockOwner("me", "ci-runner", 7, "2026-12-02T00:10:00+00:00", "deploy glm5-nvfp4", "f00d")


def _info(owner: LockOwner | None = HOLDER, taken: str | None = BOOT_THEN, now: str | None = BOOT_NOW,
          age_s: float = 30) -> LockInfo:
    return LockInfo(owner, age_s, taken, now)


@pytest.mark.parametrize(("lock", "this_host", "alive", "gone"), [
    (_info(), "ci-runner", True, "the host has rebooted since it was taken (boot 3ddfbdf7, now 0b8bcf0f)"),
    (_info(owner=None), "ci-runner", True, "rebooted"),             # ownerless, from an earlier boot
    (_info(now=BOOT_THEN), "ci-runner", True, None),                # same boot, owner elsewhere: may be working
    (_info(now=BOOT_THEN), "laptop", True, None),                   # same boot, owner here and running
    (_info(now=BOOT_THEN), "laptop", False, "pid 4242 on this machine (laptop), is no longer running"),
    (_info(taken=None), "ci-runner", True, None),                   # a lock of an older version: no boot id
    (_info(taken=None), "laptop", False, "no longer running"),
    (_info(now=None), "ci-runner", True, None),                     # the host's boot id could not be read
    # no boot id (a power cut between the mkdir and its files): older than the host's uptime is an earlier boot
    (LockInfo(None, 90, None, BOOT_NOW, 20), "ci-runner", True, "the lock is 90 s old, the host up 20 s"),
    (LockInfo(None, 10, None, BOOT_NOW, 20), "ci-runner", True, None),
])
def test_an_owner_is_gone_after_a_reboot_or_when_its_process_here_ended(lock: LockInfo, this_host: str, alive: bool,
                                                                       gone: str | None) -> None:
    reason = owner_gone(lock, this_host, lambda pid: alive)
    assert (reason is None) if gone is None else (gone in (reason or ""))


def test_an_old_or_ownerless_lock_is_stale_but_not_taken_over() -> None:
    """Input tried: a 4 h old lock of a live owner elsewhere, and a 2 min old lock without owner.json, same boot."""
    for lock in (_info(now=BOOT_THEN, age_s=4 * 3600), _info(owner=None, now=BOOT_THEN, age_s=120)):
        assert lock_staleness(lock, "ci-runner", lambda pid: True) is not None
        assert owner_gone(lock, "ci-runner", lambda pid: True) is None


def _held(owner: LockOwner | None = HOLDER, taken: str = BOOT_THEN, now: str = BOOT_NOW) -> FakeRemote:
    """A host whose lock was taken in boot `taken`; the host is in boot `now`; the first take fails on it."""
    return (FakeRemote()
            .reply(LOCK_TAKE, exit_code=1, stderr="mkdir: cannot create directory: File exists", times=1)
            .reply(FACT_CLOCK, stdout="1764634200\n")
            .reply(FACT_LOCK, stdout="1764634170\n")
            .reply(FACT_LOCK_OWNER, **({"stdout": owner.to_json().decode()} if owner else {"exit_code": 1}))
            .reply(FACT_LOCK_BOOT, stdout=f"{taken}\n")
            .reply(FACT_BOOT_ID, stdout=f"{now}\n"))


def _history(remote: FakeRemote) -> list[dict]:
    return [json.loads(step.stdin) for step in remote.ran if step.name == "history: append"]


def test_a_lock_taken_before_the_host_rebooted_is_taken_over_with_one_line_and_a_history_record() -> None:
    remote, lines = _held(), []
    take_lock(remote, LAYOUT, ME, LockContext(where="gpu1", this_host="ci-runner", note=lines.append))
    assert lines == [f"took over the deploy lock on gpu1 from {HOLDER}: the host has rebooted since it was taken "
                     "(boot 3ddfbdf7, now 0b8bcf0f)"]
    takeover = remote.batches[-1]
    names = [step.name for step in takeover]
    assert names[:3] == [LOCK_STILL_THEIRS, "lock: take over", "lock: store directory"]
    assert takeover[0].argv[:5] == ("grep", "-q", "-F", "-e", '"token":"beef"'), "only the dead owner's lock"
    assert LockOwner.from_json(remote.file_text(LAYOUT.lock_owner)) == ME
    [record] = _history(remote)
    assert (record["event"], record["outcome"], record["cause"], record["host"]) == \
        ("lock", "taken-over", lines[0], "gpu1")


def test_an_ownerless_lock_of_an_earlier_boot_is_removed_only_if_its_boot_id_is_still_that_one() -> None:
    remote = _held(owner=None)
    take_lock(remote, LAYOUT, ME, LockContext(where="gpu1", this_host="ci-runner"))
    assert remote.batches[-1][0].argv == ("grep", "-q", "-x", "-F", "-e", BOOT_THEN, "--",
                                          "/opt/sglang-deploy/sglang/lock/boot_id")


def test_a_lock_taken_over_by_another_command_first_is_held() -> None:
    """Two commands find the same dead owner's lock; the second's check of the owner fails: LockHeld, no removal."""
    remote = _held().reply(LOCK_STILL_THEIRS, exit_code=1)
    lines: list[str] = []
    with pytest.raises(LockHeld):
        take_lock(remote, LAYOUT, ME, LockContext(where="gpu1", this_host="ci-runner", note=lines.append))
    assert "lock: take over" not in remote.ran_names() and not _history(remote) and not lines


def test_a_live_owners_lock_is_not_taken_over() -> None:
    """Input tried: the same boot, the owner on another machine (its pid cannot be checked)."""
    remote = _held(now=BOOT_THEN)
    with pytest.raises(LockHeld, match="held by ops@laptop"):
        take_lock(remote, LAYOUT, ME, LockContext(where="gpu1", this_host="ci-runner"))
    assert "lock: take over" not in remote.ran_names()


def test_a_deploy_takes_a_dead_owners_lock_over_in_its_first_change() -> None:
    """The deploy's read carries the lock (`decided_from`): the takeover, the take, the digest's comparison and then
    the history line go first in the round trip of its first change."""
    remote, lines = FakeRemote(), []
    context = LockContext(where="gpu1", this_host="laptop", is_alive=lambda pid: False, note=lines.append)
    with lock_on_first_change(remote, LAYOUT, "deploy glm5-omp4", "gpu1", context) as locked:
        locked.decided_from(_info(now=BOOT_THEN), "digest")
        assert not remote.batches and not lines, "deciding sends and says nothing"
        locked.run([Step("the first change", ("true",))])
        assert lines and "pid 4242 on this machine (laptop), is no longer running" in lines[0]
    batch = remote.batches[0]
    names = [step.name for step in batch]
    assert names.index(LOCK_STILL_THEIRS) < names.index("lock: take") < \
        names.index("lock: store unchanged since it was read") < names.index("history: append")
    assert [r["event"] for r in _history(remote)] == ["lock"]


def test_a_lock_dir_left_empty_by_a_power_cut_is_taken_over_only_if_it_is_the_one_that_was_read() -> None:
    """Found by the crash-point test: the power went after `mkdir lock` reached the disk and before owner.json and
    boot_id did; after the boot, the lock is older than the host's uptime."""
    remote = (FakeRemote()
              .reply(LOCK_TAKE, exit_code=1, stderr="mkdir: cannot create directory: File exists", times=1)
              .reply(FACT_CLOCK, stdout="1764634200\n").reply(FACT_LOCK, stdout="1764634110\n")
              .reply(FACT_LOCK_OWNER, exit_code=1).reply(FACT_LOCK_BOOT, exit_code=1)
              .reply(FACT_BOOT_ID, stdout=f"{BOOT_NOW}\n").reply(FACT_UP, stdout="120.50 10050 100\n"))  # up 20 s
    take_lock(remote, LAYOUT, ME, LockContext(where="gpu1", this_host="ci-runner"))
    guard = remote.batches[-1][0]
    assert guard.name == LOCK_STILL_THEIRS and guard.argv[-2:] == ("/opt/sglang-deploy/sglang/lock", "1764634110")
    assert [r["event"] for r in _history(remote)] == ["lock"]
