"""The CUDA toolkit at CUDA_HOME read on a real host: the guest carries a toolkit stand-in (its version.json) at
/usr/local/cuda-12.8, as the reference profile names, and the guest's venv has FlashInfer 0.7.2 (SM120 needs 12.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.projects import project_for_guest
from helpers.recording_progress import RecordingProgress

from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import deploy as engine
from deploy_lib.commands import patches as on_host
from deploy_lib.deploy.project import load_for_host
from deploy_lib.errors import PreflightError
from deploy_lib.patches import find_patch_set
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = pytest.mark.sandbox
OLD_TOOLKIT = "/usr/local/cuda-12.6"
PROFILES = {
    "fusion-cuda126": f"extends: glm5-nvfp4-fusion\nenv:\n  CUDA_HOME: {OLD_TOOLKIT}\n",
    "fusion-cuda126-arch": f"extends: glm5-nvfp4-fusion\nenv:\n  CUDA_HOME: {OLD_TOOLKIT}\n"
                           "  FLASHINFER_CUDA_ARCH_LIST: '12.0a'\n",
}


def test_a_toolkit_flashinfer_refuses_stops_the_fusion_release_at_preflight(sandbox_venv: manage.Guest,
                                                                           tmp_path: Path) -> None:
    guest = sandbox_venv
    manage.put_text(guest, f"{OLD_TOOLKIT}/version.json", json.dumps({"cuda": {"version": "12.6.3"}}))
    project, inventory = project_for_guest(tmp_path, guest, PROFILES)
    patch_set = find_patch_set(ROLES_DIR, "fusion-sm120")
    base, target = load_for_host(project, "glm5-nvfp4", inventory, None)
    releases = "ls /opt/sglang-deploy/sglang/releases 2>/dev/null || true"
    with FabricRemote(target.ssh) as remote:
        report = on_host.check(remote, patch_set, base, target)
        assert report.toolkit == ("CUDA toolkit: CUDA 12.8 at /usr/local/cuda-12.8 (/usr/local/cuda-12.8/version.json)"
                                  ": FlashInfer 0.7.2 accepts it for sm120")
        before = manage.run_on(guest, releases, user="root")
        old, target = load_for_host(project, "fusion-cuda126", inventory, None)
        with pytest.raises(PreflightError) as caught:
            engine.deploy(old, target, remote, RecordingProgress(), engine.Options())
        assert caught.value.exit_code == 3
        assert "FlashInfer 0.7.2 needs CUDA >= 12.8" in caught.value.message
        assert f"CUDA_HOME={OLD_TOOLKIT} is CUDA 12.6" in caught.value.message
        assert "FLASHINFER_CUDA_ARCH_LIST" in (caught.value.hint or "")
        assert manage.run_on(guest, releases, user="root") == before, "nothing staged"
        given, target = load_for_host(project, "fusion-cuda126-arch", inventory, None)
        planned = engine.deploy(given, target, remote, RecordingProgress(), engine.Options(dry_run=True))
        assert planned.action == "planned", "the arch list given with its suffix is accepted"
