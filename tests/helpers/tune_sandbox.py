"""The tune sandbox modules' rig, their sweeps through the tune library as the task calls it, and a tune's lines in a
sandbox host's history."""

from __future__ import annotations

import pytest

from deploy_lib import tune as tuning
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import tune as commands_tune
from deploy_lib.commands import tune_request
from deploy_lib.patches import list_patch_sets
from deploy_lib.remote import FabricRemote
from helpers.recording_progress import RecordingProgress
from helpers.rig import Rig
from sandbox import manage

PROFILE = "glm5-nvfp4-sandbox"
TOKENIZER = "/opt/sim-tokenizer"
# what served before a sweep: our reference user's cap of 64 running requests; a cap of 256 where the sweep is not
# about the cap (its base runs are four times shorter)
BEFORE_64, BEFORE_256 = "tune-before-64", "tune-before-256"
PROFILES = {name: f"extends: {PROFILE}\nmemory:\n  max_running_requests: {cap}\n"
            for name, cap in ((BEFORE_64, 64), (BEFORE_256, 256))}
LADDER = [1024]
MRR_64, MRR_256, MRR_512, MRR_1024 = (f"memory.max_running_requests={n} patches=none" for n in (64, 256, 512, 1024))


def tune_rig(guest: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    """A rig on the guest with the pre-sweep profiles and the simulator's tokenizer the benchmark reads."""
    rig = Rig.on(guest, tmp_path_factory, PROFILES)
    rig.root(f"/opt/ml-env/bin/python -m sglang_sim.tokenizer {TOKENIZER}")
    return rig


def serve(rig: Rig, profile: str) -> str:
    """The pre-sweep release deployed and serving (its own gate skipped: the sweep measures it twice)."""
    return rig.deploy(profile, skip_gate=True).release_id


def request(*vary: str, resume: str | None = None) -> tune_request.Request:
    if resume is not None:
        return tune_request.Request(None, {}, tuple(list_patch_sets(ROLES_DIR)), resume=resume)
    spec, sources = tuning.sweep_spec(None, vary, {"ladder": LADDER})
    return tune_request.Request(spec, sources, tuple(list_patch_sets(ROLES_DIR)))


def sweep(rig: Rig, req: tune_request.Request, progress: RecordingProgress | None = None) -> tuning.TuneReport:
    loaded, target = rig.target(PROFILE)
    with FabricRemote(target.ssh) as remote:
        report = commands_tune.tune(loaded, target, remote, progress or RecordingProgress(), req)
    assert isinstance(report, tuning.TuneReport)
    return report


def tune_lines(rig: Rig, tune_id: str) -> list[dict[str, object]]:
    return [h for h in rig.history() if h["event"] == "tune" and h["tune"]["id"] == tune_id]  # type: ignore[index]
