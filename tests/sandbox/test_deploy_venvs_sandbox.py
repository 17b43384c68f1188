"""Deploys that build or derive venvs on the sandbox VM, and the throughput gate in deploy: a module of its own (its
own guest), so the parallel run does not wait on one long module."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import Rig

from deploy_lib.commands import deploy as engine
from deploy_lib.commands import patches as on_host
from deploy_lib.errors import GateFailed
from deploy_lib.patches import find_patch_set
from deploy_lib.remote import FabricRemote
from sandbox import wheelhouse

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def test_patch_fusion_enable_deploys_a_patched_venv_and_disable_returns(rig: Rig, healthy: str) -> None:
    patch_set = find_patch_set(REPO / "roles", "fusion-sm120")
    base, target = rig.target()
    fingerprint = "find /opt/ml-env -name '*.py' -path '*sglang/srt/layers*' | sort | xargs sha256sum | sha256sum"
    before = rig.root(fingerprint)
    with FabricRemote(target.ssh) as remote:
        assert {t.state.value for t in on_host.check(remote, patch_set, base, target).targets} <= {
            "absent", "native"}
        report, outcome = on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set),
                                          target, RecordingProgress(), engine.Options())
        assert outcome.action == "deployed" and outcome.release_id != healthy
        assert not report.conflicts
        after = on_host.check(remote, patch_set, base, target)
        assert {t.state.value for t in after.targets} <= {"applied", "native"}
        assert "applied" in {t.state.value for t in after.targets}
    assert rig.unit_state() == "active" and rig.current() == outcome.release_id
    assert "fusion" in rig.root("journalctl -u sglang.service -n 200 -o cat").lower()
    assert rig.root(fingerprint) == before, "the hand-made venv the patched one came from is byte-identical"
    assert rig.rollback().release_id == healthy, "invoke rollback returns to the unpatched release"
    with FabricRemote(target.ssh) as remote:
        _, again = on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set), target,
                                   RecordingProgress(), engine.Options())
        assert again.release_id == outcome.release_id, "the same patched venv and release are reused"
        back = on_host.disable(remote, patch_set, base, target, RecordingProgress(), engine.Options())
        assert back.action == "deployed" and rig.unit_state() == "active"
        assert {t.state.value for t in on_host.check(remote, patch_set, base, target).targets} <= {
            "absent", "native"}


def test_locked_venvs_are_built_reused_and_rolled_back_with_the_release(rig: Rig, healthy: str) -> None:
    """Two locks (FlashInfer 0.7.2, then 0.6.12): two venvs, each release on its own; rollback returns to the first."""
    sandbox_wheels = wheelhouse.prepare()
    base_wheels = sandbox_wheels.wheels
    other = wheelhouse.download("flashinfer-python", "0.6.12")
    sandbox_wheels.link_into(rig.project.root / "wheelhouse", other)
    swapped = [other if w.name.startswith("flashinfer_python-") else w for w in base_wheels]
    for name, wheels in (("lock-a.txt", base_wheels), ("lock-b.txt", swapped)):
        wheelhouse.write_lock(rig.project.root / name, wheels)
    for profile, lock in (("glm5-lock-a", "lock-a.txt"), ("glm5-lock-b", "lock-b.txt")):
        (rig.project.profiles_dir / f"{profile}.yaml").write_text(
            f"extends: glm5-nvfp4\nservice:\n  venv_build:\n    lock: {lock}\n    wheelhouse: wheelhouse\n")
    first = rig.deploy("glm5-lock-a")
    venv_a = rig.root(f"sed -n 's/.*\"venv\": *\"\\([^\"]*\\)\".*/\\1/p' "
                      f"/opt/sglang-deploy/sglang/releases/{first.release_id}/release.json").strip()
    assert venv_a.startswith("/opt/sglang-deploy/sglang/venvs/")
    assert "FLASHINFER_WORKSPACE_BASE" in rig.root(f"cat /opt/sglang-deploy/sglang/releases/{first.release_id}/"
                                                   "sglang.env")
    assert rig.deploy("glm5-lock-a").action == "unchanged"
    second = rig.deploy("glm5-lock-b")
    assert second.action == "deployed"
    assert any(c.kind == "venv" for c in second.plan.changes) and any(
        c.kind == "version" and c.new == "0.6.12" for c in second.plan.changes)
    assert rig.root(f"test -d {venv_a} && echo kept").strip() == "kept"
    back = rig.rollback()
    assert back.release_id == first.release_id and rig.current() == first.release_id
    assert venv_a in rig.root("cat /proc/$(systemctl show -p MainPID --value sglang.service)/cmdline | tr '\\0' ' '")


GATED = ("extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '6'\n"
         "bench: {prompts: 128, input_len: 32, output_len: 32, concurrency: [64], tokenizer: /opt/sim-tokenizer, "
         "timeout_s: 300}\ngate: {}\n")


def test_the_gate_in_deploy_keeps_a_first_release_and_rolls_back_the_slow_patched_one(rig: Rig, healthy: str) -> None:
    """deploy with `gate:`: no baseline -> recorded and kept; patch-fusion --enable -> healthy but slow -> exit 7."""
    rig.root("/opt/ml-env/bin/python -m sglang_sim.tokenizer /opt/sim-tokenizer")
    (rig.project.profiles_dir / "glm5-gated.yaml").write_text(GATED)
    progress = RecordingProgress()
    first = rig.deploy("glm5-gated", progress)
    assert first.action == "deployed" and rig.current() == first.release_id
    assert any("no baseline" in str(note) for note in progress.of_kind("note"))
    patch_set = find_patch_set(REPO / "roles", "fusion-sm120")
    loaded, target = rig.target("glm5-gated")
    with FabricRemote(target.ssh) as remote, pytest.raises(GateFailed) as caught:
        on_host.enable(remote, patch_set, loaded, on_host.patched_profile(loaded, patch_set), target,
                        RecordingProgress(), engine.Options())
    message = str(caught.value)
    assert "tok/s" in message and f"release {first.release_id} is serving" in message
    assert caught.value.exit_code == 7
    assert rig.current() == first.release_id and rig.unit_state() == "active"
    benches = [h for h in rig.history() if h["event"] == "bench"]
    assert [b["outcome"] for b in benches[-2:]] == ["healthy", "failed"]
