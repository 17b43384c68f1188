"""nsa-aliases on a guest of its own: a profile with a hand-written `--nsa-decode-backend` (extra_args, as a launch
command written for SGLang 0.5.15 has it) is refused by preflight on the guest's SGLang 0.5.23; the patch set's
enable makes the patched venv, where the same profile starts (the simulated server parses its command with the
installed SGLang's own argparse and exits 2 on a flag it does not know); a second set on that venv is refused;
disable returns to the unpatched venv."""

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
from deploy_lib.patches import State, find_patch_set
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = pytest.mark.sandbox
STORE = "/opt/sglang-deploy/sglang"
# the typed backend off: given both ways, the one setting would be refused as set twice
PROFILES = {"glm5-nsa": 'extends: glm5-nvfp4\nbackends: {dsa_decode: null}\n'
                        'extra_args: ["--nsa-decode-backend", "flashmla_kv"]\n'}


def root(guest: manage.Guest, command: str) -> str:
    return manage.run_on(guest, command, user="root")


def states(report) -> set[State]:
    return {t.state for t in report.targets}


def test_a_hand_written_nsa_flag_starts_on_the_patched_venv_only(sandbox_venv: manage.Guest, tmp_path: Path) -> None:
    guest = sandbox_venv
    project, inventory = project_for_guest(tmp_path, guest, PROFILES)
    hand_written, target = load_for_host(project, "glm5-nsa", inventory, None)
    plain, _ = load_for_host(project, "glm5-nvfp4", inventory, None)
    nsa_aliases = find_patch_set(ROLES_DIR, "nsa-aliases")
    with FabricRemote(target.ssh) as remote:
        with pytest.raises(PreflightError) as refused:
            engine.deploy(hand_written, target, remote, RecordingProgress(), engine.Options())
        assert "unrecognized arguments: --nsa-decode-backend flashmla_kv" in refused.value.message
        assert root(guest, f"ls {STORE}/releases 2>/dev/null | wc -l").strip() == "0", "nothing staged"
        assert states(on_host.check(remote, nsa_aliases, hand_written, target)) == {State.ABSENT}

        report, outcome = on_host.enable(remote, nsa_aliases, hand_written,
                                         on_host.patched_profile(hand_written, nsa_aliases), target,
                                         RecordingProgress(), engine.Options())
        assert states(report) == {State.ABSENT} and outcome.action == "deployed"
        release = json.loads(root(guest, f"cat {STORE}/releases/{outcome.release_id}/release.json"))
        assert release["profile_name"] == "glm5-nsa+nsa-aliases" and release["patches"] == ["nsa-aliases"]
        pid = root(guest, "systemctl show -p MainPID --value sglang.service").strip()
        argv = root(guest, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
        assert argv[-2:] == ["--nsa-decode-backend", "flashmla_kv"] and argv[0].startswith(release["venv"])
        assert states(on_host.check(remote, nsa_aliases, hand_written, target)) == {State.APPLIED}
        assert root(guest, "grep -c -e '--nsa-decode-backend' /opt/ml-env/lib/python3*/site-packages/sglang/srt/"
                           "server_args.py || true").strip() == "0", "the base venv is not written"

        fusion = find_patch_set(ROLES_DIR, "fusion-sm120")
        with pytest.raises(PreflightError, match="the venv is patched by nsa-aliases, not fusion-sm120"):
            on_host.enable(remote, fusion, plain, on_host.patched_profile(plain, fusion), target,
                           RecordingProgress(), engine.Options())

        back = on_host.disable(remote, nsa_aliases, plain, target, RecordingProgress(), engine.Options())
        assert back.action == "deployed"
        assert states(on_host.check(remote, nsa_aliases, plain, target)) == {State.ABSENT}
