"""When the host goes away: a clean reboot and a power loss of the guest, on a guest whose writable layer is a disk
of its own (`manage.up(disk=True)`), so a power loss loses what was not synced. After either, the current release
serves by itself (its unit enabled, systemd starts it at boot); a release switched to by a deploy that never
finished is started at boot too, and status says it was never verified until the next deploy verifies it; a lock
left by a command of the boot before is taken over by the next command."""

from __future__ import annotations

import os

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import REFERENCE, Rig

from deploy_lib.errors import LockHeld
from deploy_lib.remote import FabricRemote
from deploy_lib.store import LockOwner, acquire_lock
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.own_disk]

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


class HostWentDown(BaseException):
    """The operator's command ends with its host: nothing of it runs after the host went down."""


class DownDuringReadiness(RecordingProgress):
    """Takes the guest down (`went_down`: reboot or crash) when the deploy starts waiting for readiness, i.e. right
    after the round trip that switched `current` and restarted the unit, and ends the deploy there."""

    def __init__(self, went_down: object) -> None:
        super().__init__()
        self.went_down = went_down

    def phase_started(self, name: str) -> None:
        super().phase_started(name)
        if name == "readiness":
            self.went_down()  # type: ignore[operator]
            raise HostWentDown


def test_a_power_loss_keeps_what_was_synced_and_loses_what_was_not(rig: Rig) -> None:
    """Input tried: one file fsynced, one written after the last fsync, then the power cut; a clean reboot keeps a
    file written without fsync (its shutdown writes everything out)."""
    boot = rig.root(BOOT_ID)
    rig.root("echo kept > /root/synced && sync /root/synced && echo lost > /root/unsynced")
    manage.crash(rig.guest.name)
    assert rig.root(BOOT_ID) != boot, "the guest booted again"
    assert rig.root("cat /root/synced") == "kept\n"
    assert rig.root("ls /root/unsynced 2>/dev/null || echo gone").strip() == "gone"
    rig.root("echo clean > /root/unsynced")
    manage.reboot(rig.guest.name)
    assert rig.root("cat /root/unsynced /root/synced") == "clean\nkept\n"


@pytest.mark.parametrize("went_down", ["reboot", "crash"])
def test_after_the_host_went_down_the_current_release_serves_by_itself(rig: Rig, went_down: str) -> None:
    """The healthy release of the reference profile, then a clean reboot or a power loss (the deploy's writes
    have reached the disk: a reboot wrote them out before the power-loss case)."""
    healthy = rig.healthy_release()
    manage.reboot(rig.guest.name)  # what the deploy wrote is on the disk: the crash case tests the boot, not the store
    rig.wait_ready()
    history = rig.history()
    getattr(manage, went_down)(rig.guest.name)
    rig.wait_ready()  # nobody started it: systemd did, at boot
    report = rig.status()
    assert (report.current, report.readiness, report.verified, report.advice) == \
        (healthy, "ready (health 200)", True, None)
    assert report.unit_state == "active/running"
    assert rig.deploy(REFERENCE).action == "unchanged", "a redeploy of the same profile is a no-op"
    assert rig.history() == history, "nothing was recorded: no crash, no start"


def test_a_release_switched_but_never_verified_starts_at_boot_and_the_next_deploy_verifies_it(rig: Rig) -> None:
    """Input tried: a deploy of glm5-omp4 whose host rebooted right after the switch and restart, before the
    readiness ladder ended; the deploy died with it."""
    before = rig.healthy_release()
    with pytest.raises(HostWentDown):
        rig.deploy("glm5-omp4", DownDuringReadiness(lambda: manage.reboot(rig.guest.name)))
    switched = rig.current()
    assert switched != before
    rig.wait_ready()
    report = rig.status()
    assert report.current == switched and report.readiness == "ready (health 200)"
    assert not report.verified and report.advice is not None
    assert f"release {switched} was switched to but never verified" in report.advice
    progress = RecordingProgress()
    outcome = rig.deploy("glm5-omp4", progress)
    assert (outcome.action, outcome.release_id) == ("deployed", switched)
    assert any("history does not record it as verified" in str(note) for note in progress.of_kind("note"))
    assert rig.history()[-1]["release"] == switched and rig.history()[-1]["outcome"] == "healthy"
    report = rig.status()
    assert report.verified and report.advice is None


def test_a_lock_left_by_a_command_of_the_boot_before_is_taken_over_by_the_next_one(rig: Rig) -> None:
    """Input tried: the lock taken by a live owner on another machine (this pytest's pid, a foreign machine name):
    held before the reboot, taken over after it, with one line and a history record."""
    rig.healthy_release()
    owner = LockOwner("ops", "elsewhere", os.getpid(), "2026-12-02T00:00:00+00:00", "deploy glm5-omp4", "dead")
    _, target = rig.target()
    with FabricRemote(target.ssh) as remote:
        remote.run(acquire_lock(target.layout(rig.service), owner))
    with pytest.raises(LockHeld, match="held by ops@elsewhere"):
        rig.deploy("glm5-omp4")
    manage.reboot(rig.guest.name)
    progress = RecordingProgress()
    rig.deploy("glm5-omp4", progress)
    [line] = [note for note in progress.of_kind("note") if "took over the deploy lock" in str(note)]
    assert "from ops@elsewhere" in str(line) and "the host has rebooted since it was taken" in str(line)
    [record] = [h for h in rig.history() if h["event"] == "lock"]
    assert (record["outcome"], record["cause"]) == ("taken-over", line)
    assert rig.root(f"ls {rig.store}/lock 2>/dev/null || echo none").strip() == "none", "the deploy released it"
