"""One crash after a healthy deploy, on a guest of its own (the module's rollback target is the release it
switched to itself, whatever other deploy tests left on a shared guest)."""

from __future__ import annotations

import pytest
from helpers.rig import FAULT_OF_CRASHY, Rig

pytestmark = pytest.mark.sandbox


def test_a_crash_after_the_deploy_is_restarted_and_status_shows_its_cause_and_count(rig: Rig, healthy: str) -> None:
    # a switch recorded in history just before (the fixture's deploy may be a no-op that records nothing, and the
    # rollback goes to the newest healthy release there, whatever earlier tests deployed)
    before = rig.deploy("glm5-omp4").release_id
    crashy = rig.crashy_release()
    try:
        rig.serve_until_crash()
        rig.wait_ready()
        report = rig.status()
        assert report.current == crashy and report.restarts == 1 and report.readiness.startswith("ready")
        assert report.crashes is not None and not report.crashes.down and report.advice is None
        assert report.crashes.last is not None and report.crashes.last.diagnosis is not None
        assert report.crashes.last.diagnosis.signature == "cuda_runtime_error"
        assert "an illegal memory access was encountered" in report.crashes.last.cause
        assert report.crashes.verdict == "systemd restarted it after 1 crash(es)"
        crashes = [h for h in rig.history() if h["event"] == "crash"]
        assert [(c["release"], c["outcome"]) for c in crashes] == [(crashy, "restarted")]
        rig.status()
        assert len([h for h in rig.history() if h["event"] == "crash"]) == 1, "a crash is recorded once"
        rig.serve_until_crash()
        rig.wait_ready()
        assert rig.rollback().release_id == before
        crashes = [h for h in rig.history() if h["event"] == "crash"]
        assert [c["outcome"] for c in crashes] == ["restarted"] * 2, "rollback records the crash before restarting"
        assert "crash 2 since the deploy" in crashes[-1]["cause"]
    finally:
        rig.fault(None, FAULT_OF_CRASHY)
