"""The server runs with its venv activated: the venv's bin/ first on PATH and VIRTUAL_ENV set, as a hand-run
`source <venv>/bin/activate` gave it. FlashInfer's JIT runs `ninja` by name (flashinfer/jit/cpp_ext.py run_ninja),
and the guest, like a fresh GPU host, has ninja only in the venv (the ninja wheel), not on systemd's default PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.projects import project_for_guest
from helpers.recording_progress import RecordingProgress
from helpers.systemd_syntax import parse_env_file

from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import deploy as engine
from deploy_lib.commands import patches as on_host
from deploy_lib.deploy.project import load_for_host
from deploy_lib.patches import find_patch_set
from deploy_lib.release.server_args import SYSTEMD_DEFAULT_PATH
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = pytest.mark.sandbox
STORE = "/opt/sglang-deploy/sglang"


def root(guest: manage.Guest, command: str) -> str:
    return manage.run_on(guest, command, user="root")


def test_the_fused_release_builds_flashinfers_jit_with_the_venvs_ninja(sandbox_venv: manage.Guest,
                                                                      tmp_path: Path) -> None:
    guest = sandbox_venv
    assert root(guest, f"PATH={SYSTEMD_DEFAULT_PATH} command -v ninja || echo none").strip() == "none"
    assert root(guest, "test -x /opt/ml-env/bin/ninja && echo yes || echo no").strip() == "yes"
    project, inventory = project_for_guest(tmp_path, guest, {})
    base, target = load_for_host(project, "glm5-nvfp4", inventory, None)
    patch_set = find_patch_set(ROLES_DIR, "fusion-sm120")
    with FabricRemote(target.ssh) as remote:
        engine.deploy(base, target, remote, RecordingProgress(), engine.Options())
        # enable clears the trtllm_comm JIT cache of the patched venv: the fused start builds it with ninja
        _, outcome = on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set), target,
                                     RecordingProgress(), engine.Options())
    assert outcome.action == "deployed"
    journal = root(guest, "journalctl -u sglang.service -n 300 -o cat")
    assert "Building JIT module trtllm_comm; this can take several minutes on first use." in journal

    release = json.loads(root(guest, f"cat {STORE}/releases/{outcome.release_id}/release.json"))
    venv = release["venv"]
    pid = root(guest, "systemctl show -p MainPID --value sglang.service").strip()
    environ = dict(line.split("=", 1) for line in root(guest, f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
                   if "=" in line)
    assert environ["PATH"] == f"{venv}/bin:{SYSTEMD_DEFAULT_PATH}"
    assert environ["VIRTUAL_ENV"] == venv
    rendered = parse_env_file(root(guest, f"cat {STORE}/releases/{outcome.release_id}/sglang.env"))
    assert {name: environ.get(name) for name in rendered} == rendered
    argv = root(guest, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    assert argv == release["argv"]
