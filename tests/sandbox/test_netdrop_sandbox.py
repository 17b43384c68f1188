"""The network between the operator and the host drops mid-deploy (issue 31, point 5): the sandbox guest's link is
taken down and up again at a point of a deploy, and the guest's end of the connection is dropped meanwhile, so the
client meets a dead connection when the link returns (netcut.py). Also during the automatic rollback of a release
that failed its verification: a short partition is ridden out (the switch back is sent again on a new connection),
a long one ends the deploy with what it knows and the command that finishes the rollback."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.netcut import CutDuring
from helpers.recording_progress import RecordingProgress
from helpers.rig import REFERENCE, TEST_PROFILES, Rig
from tenacity import stop_after_attempt

from deploy_lib.commands import deploy as engine
from deploy_lib.errors import ConnectionLost, DeployError, ReadinessFailed
from deploy_lib.remote import FabricRemote
from deploy_lib.remote.ssh import SSH_RECONNECT

pytestmark = pytest.mark.sandbox
SWITCH_STEP = "switch: temp link"  # in the deploy's switch-and-restart round trip, then in its rollback's
# one new connection tried after a drop, where the default policy tries for up to 60 s: a link still down fails it
RECONNECT_ONCE = SSH_RECONNECT.copy(stop=stop_after_attempt(1))
PROFILES = {**TEST_PROFILES,
            "glm5-omp5": f"extends: {REFERENCE}\nenv:\n  OMP_NUM_THREADS: '5'\n",
            "glm5-omp6": f"extends: {REFERENCE}\nenv:\n  OMP_NUM_THREADS: '6'\n"}


@pytest.fixture(scope="module")
def rig(sandbox_venv, tmp_path_factory) -> Rig:  # type: ignore[no-untyped-def]
    return Rig.on(sandbox_venv, tmp_path_factory, PROFILES)


@pytest.fixture
def healthy(rig: Rig) -> str:
    return rig.healthy_release()


def _deploy_with_cut(rig: Rig, profile: str, when: str) -> tuple[engine.Outcome | ConnectionLost, CutDuring]:
    loaded, target = rig.target(profile)
    with FabricRemote(target.ssh) as inner:
        cut = CutDuring(inner, rig.guest, when)
        try:
            return engine.deploy(loaded, target, cut, RecordingProgress(), engine.Options()), cut
        except ConnectionLost as lost:
            return lost, cut
        finally:
            cut.restore()


def test_a_partition_during_the_readiness_wait_does_not_fail_the_deploy(rig: Rig, healthy: str) -> None:
    outcome, cut = _deploy_with_cut(rig, "glm5-omp5", "readiness probe (generate)")  # the ladder's, not the facts'
    assert cut.aborted, "the cut dropped the guest's end of the connection"
    assert isinstance(outcome, engine.Outcome), f"the deploy failed: {outcome}"
    assert outcome.action == "deployed" and rig.current() == outcome.release_id and rig.unit_state() == "active"
    assert rig.history()[-1]["outcome"] == "healthy"


def test_a_connection_lost_during_the_stage_says_what_it_knows_and_the_next_deploy_converges(rig: Rig,
                                                                                           healthy: str) -> None:
    lost, cut = _deploy_with_cut(rig, "glm5-omp6", "stage:")
    assert cut.aborted and isinstance(lost, ConnectionLost), f"expected a lost connection, got {lost!r}"
    assert lost.exit_code == 11
    message = lost.message
    assert "lost during step" in message and f"current is {healthy}" in message and "NOT verified" in message
    assert "invoke status" in (lost.hint or "") and "deploy --profile glm5-omp6" in (lost.hint or "")
    assert rig.current() == healthy and rig.unit_state() == "active", "the round trip never reached the host"
    outcome = rig.deploy("glm5-omp6")
    assert outcome.action == "deployed" and rig.current() == outcome.release_id


def _failed_deploy_with_cut_in_its_rollback(rig: Rig, cut_for: Callable[[FabricRemote], CutDuring]
                                            ) -> tuple[DeployError, CutDuring]:
    """A deploy of glm5-faulty with its release out of memory while loading (it fails its verification at once),
    the link cut (`cut_for`) when the rollback sends its switch back."""
    loaded, target = rig.target("glm5-faulty")
    rig.fault("oom")
    try:
        with FabricRemote(target.ssh, reconnect_policy=RECONNECT_ONCE) as inner:
            cut = cut_for(inner)
            try:
                with pytest.raises(DeployError) as ended:
                    engine.deploy(loaded, target, cut, RecordingProgress(), engine.Options())
                return ended.value, cut
            finally:
                cut.restore()
    finally:
        rig.fault(None)


def test_a_partition_during_the_rollback_is_ridden_out_on_a_new_connection(rig: Rig, healthy: str) -> None:
    """Input tried: the link down for 3 s from the rollback's switch-and-restart round trip on, the guest's end of
    the connection dropped: that round trip is sent again on a new connection and the rollback is verified."""
    ended, cut = _failed_deploy_with_cut_in_its_rollback(
        rig, lambda inner: CutDuring(inner, rig.guest, SWITCH_STEP, after=1))  # the deploy's own switch goes through
    assert cut.aborted, "the cut dropped the guest's end of the connection"
    assert isinstance(ended, ReadinessFailed) and f"rolled back, release {healthy} is serving" in ended.message, \
        f"the rollback did not finish: {ended!r}"
    assert rig.current() == healthy and rig.unit_state() == "active"
    assert [(h["event"], h["outcome"]) for h in rig.history()[-2:]] == [("deploy", "failed"), ("rollback", "healthy")]


def test_a_rollback_cut_off_for_good_says_what_it_knows_and_the_next_commands_see_the_truth(rig: Rig,
                                                                                            healthy: str) -> None:
    """Input tried: the link down from the rollback's switch-and-restart round trip on until the tool gave up (it
    comes back just after: the lock's release reaches the host, so the next command needs no unlock)."""
    ended, cut = _failed_deploy_with_cut_in_its_rollback(
        rig, lambda inner: CutDuring(inner, rig.guest, SWITCH_STEP, down_s=600, after=1, back_when_lost=True))
    assert cut.aborted and isinstance(ended, ConnectionLost), f"expected a lost connection, got {ended!r}"
    failed, message, hint = ended.release_id, ended.message, ended.hint or ""
    assert ended.exit_code == 11 and failed not in (None, healthy)
    assert f"release {failed} failed (" in message and f"the rollback to {healthy} did not finish" in message
    assert f"current is {failed}, or {healthy} if the host ran on" in message and "NOT verified" in message
    assert f"`invoke rollback --to {healthy}`" in hint
    assert rig.current() == failed, "the switch back never reached the host (its end of the connection was gone)"
    report = rig.status()
    assert (report.current, report.verified, report.lock_holder) == (failed, False, None)
    assert rig.history()[-1]["outcome"] == "failed", "history's last word is the failed deploy, nothing false after"
    outcome = rig.rollback(healthy)  # what the hint says to run
    assert (outcome.action, rig.current()) == ("rolled back", healthy)
    report = rig.status()
    assert report.verified and report.advice is None and rig.unit_state() == "active"
