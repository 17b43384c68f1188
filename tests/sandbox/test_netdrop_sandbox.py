"""The network between the operator and the host drops mid-deploy (issue 31, point 5): the sandbox guest's link is
taken down and up again at a point of a deploy, and the guest's end of the connection is dropped meanwhile, so the
client meets a dead connection when the link returns (netcut.py)."""

from __future__ import annotations

import pytest
from netcut import CutDuring
from recording_progress import RecordingProgress
from rig import REFERENCE, TEST_PROFILES, Rig

from deploy_lib import deploy as engine
from deploy_lib.errors import ConnectionLost
from deploy_lib.remote import FabricRemote

pytestmark = pytest.mark.sandbox
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
