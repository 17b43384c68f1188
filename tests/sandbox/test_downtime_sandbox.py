"""A switch's downtime on a sandbox guest (issue 41): a changed deploy and a rollback, each measured from the old
server's stop to the new one's first generation, split into the simulator's logged start phases and the tool's part;
history keeps it and `status` shows it."""

from __future__ import annotations

import pytest
from helpers.rig import TEST_PROFILES, Rig

from deploy_lib.health.downtime import Downtime
from sandbox import manage

pytestmark = pytest.mark.sandbox
# the simulator's start without CUDA graphs (the reference profile's): no capture, so no warm-up after it either
LOGGED = {"init", "weights", "kv_cache", "first_generation"}


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return Rig.on(sandbox_venv, tmp_path_factory, TEST_PROFILES)


def test_a_changed_deploy_and_a_rollback_report_their_downtime_and_status_shows_the_last(rig: Rig) -> None:
    rig.healthy_release()
    changed = rig.deploy("glm5-omp4")
    downtime = changed.downtime
    assert changed.action == "deployed" and downtime is not None, "the reference release was serving"
    assert set(downtime.phases) >= LOGGED, downtime
    assert 0 < downtime.server_s <= downtime.total_s and downtime.tool_s >= 0
    [line] = [h for h in rig.history() if h["event"] == "deploy" and h["release"] == changed.release_id][-1:]
    assert Downtime.from_timings(line["timings"]) == downtime  # type: ignore[arg-type]
    assert rig.status().last_downtime == downtime
    back = rig.rollback()
    assert back.action == "rolled back" and back.downtime is not None and set(back.downtime.phases) >= LOGGED
    assert rig.status().last_downtime == back.downtime
