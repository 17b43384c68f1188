"""Our users' layout on a guest of its own: SGLang installed editable from a source checkout (/root/sglang/python,
the real 0.5.23 wheel laid out as the repository's python/ directory), venv /root/ml-env. The patch set is
checked, enabled, audited and disabled against the checkout's files; the checkout itself is never written."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers.projects import project_for_guest
from helpers.recording_progress import RecordingProgress

from deploy_lib import patches
from deploy_lib.commands import deploy as engine
from deploy_lib.commands import patches as on_host
from deploy_lib.commands.status import read_status
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.errors import PreflightError
from deploy_lib.host import venv_adopt
from deploy_lib.patches import find_patch_set
from deploy_lib.remote import FabricRemote
from sandbox import manage, wheelhouse

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
CHECKOUT = manage.GUEST_CHECKOUT
CHECKOUT_SUM = f"cd {CHECKOUT} && find . -type f -not -path '*/__pycache__/*' | sort | xargs sha256sum | sha256sum"
# Not /root: `python -m` puts the working directory first on sys.path, and /root/sglang (the checkout's parent) would
# be imported as a namespace package before setuptools' editable finder is asked: preflight refuses /root.
PROFILE = "glm5-src"
PROFILES = {PROFILE: f"extends: glm5-nvfp4\nservice:\n  working_directory: {CHECKOUT.parent}\n"}


@dataclass
class Rig:
    guest: manage.Guest
    project: Project
    inventory: str

    def root(self, command: str) -> str:
        return manage.run_on(self.guest, command, user="root")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, wheelhouse_default: wheelhouse.Wheelhouse) -> Iterator[Rig]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox VM needs root (netns, overlay mount, systemd-nspawn)")
    name = f"pe{os.getpid()}"[:12]
    try:
        guest = manage.up(name, record=False)
        manage.build_editable_venv(guest, wheelhouse_default)
        project, inventory = project_for_guest(tmp_path_factory.mktemp("project"), guest, PROFILES)
        hosts = yaml.safe_load(Path(inventory).read_text())
        # as our users: root, and their hand-made venv under /root (which the guest's `deploy` user cannot read)
        hosts["all"]["vars"] |= {"venv": str(manage.GUEST_EDITABLE_VENV), "ansible_user": "root"}
        Path(inventory).write_text(yaml.safe_dump(hosts))
        yield Rig(guest, project, inventory)
    finally:
        manage.down(name, record=False)


def test_patch_set_on_an_editable_sglang_reads_enables_and_disables_in_the_checkout(rig: Rig) -> None:
    patch_set = find_patch_set(REPO / "roles", "fusion-sm120")
    base, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
    checkout_before = rig.root(CHECKOUT_SUM)
    shadowed, shadowed_target = load_for_host(rig.project, "glm5-nvfp4", rig.inventory, None)
    with FabricRemote(shadowed_target.ssh) as remote, pytest.raises(PreflightError) as refused:
        engine.deploy(shadowed, shadowed_target, remote, RecordingProgress(), engine.Options())
    assert f"would import SGLang from {CHECKOUT.parent}, not from" in refused.value.message
    assert rig.root("ls /opt/sglang-deploy/sglang/releases 2>/dev/null | wc -l").strip() == "0", "nothing staged"
    with FabricRemote(target.ssh) as remote:
        first = engine.deploy(base, target, remote, RecordingProgress(), engine.Options())
        assert first.action == "deployed"
        assert read_status(target, "sglang", remote).venv_sources == {"sglang": f"editable: {CHECKOUT}"}

        check = on_host.check(remote, patch_set, base, target)
        assert not check.conflicts, check.summary_lines()
        assert {t.target: t.state.value for t in check.targets}["runtime-gate"] == "absent"
        assert f"sglang editable: {CHECKOUT}" in check.summary_lines()
        audit = on_host.audit(remote, patch_set, base, target)
        assert [path for path in audit.scanned if path.startswith("sglang/")] and audit.bounds

        progress = RecordingProgress()
        report, outcome = on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set),
                                          target, progress, engine.Options())
        assert not report.conflicts and outcome.action == "deployed"
        assert any(f"{CHECKOUT}/sglang is outside the venv" in str(note) for note in progress.of_kind("note"))
        applied = on_host.check(remote, patch_set, base, target)
        assert {t.target: t.state.value for t in applied.targets}["runtime-gate"] == "applied"
        assert f"sglang copy of {CHECKOUT}" in applied.summary_lines()
        context = on_host.read_context(remote, patch_set, base, target)
        adopted = venv_adopt.adopt(remote, context.layout, manage.GUEST_EDITABLE_VENV)
        assert adopted.reused and adopted.editable == {"sglang": str(CHECKOUT)}
    assert rig.root("systemctl is-active sglang.service").strip() == "active"

    # The patched venv has its own copy of the package: new files, none shared with the checkout.
    copy = context.installed.location("sglang")
    assert copy.is_relative_to(context.venv) and str(context.venv) != str(manage.GUEST_EDITABLE_VENV)
    assert rig.root(f"find {copy} -type f -links +1 | wc -l").strip() == "0"
    server = rig.root("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value sglang.service)/cmdline")
    assert server.startswith(f"{context.venv}/bin/python3 -m sglang.launch_server"), server
    assert rig.root(CHECKOUT_SUM) == checkout_before, "the checkout is never written"

    # Byte-exact: reverting the copy's patched files gives the checkout's bytes back.
    assert context.record is not None
    texts = {step.file: base64.b64decode(rig.root(f"base64 -w0 {copy.parent / step.file}")).decode()
             for step in context.record.steps}
    for path, text in patches.disable(patch_set, texts, context.record).items():
        original = rig.root(f"sha256sum {CHECKOUT / path}").split()[0]
        assert hashlib.sha256(text.encode()).hexdigest() == original

    with FabricRemote(target.ssh) as remote:
        back = on_host.disable(remote, patch_set, base, target, RecordingProgress(), engine.Options())
        assert back.action == "deployed"
        again = on_host.check(remote, patch_set, base, target)
        assert {t.target: t.state.value for t in again.targets}["runtime-gate"] == "absent"
        assert f"sglang editable: {CHECKOUT}" in again.summary_lines()
    assert rig.root("systemctl is-active sglang.service").strip() == "active"
    assert rig.root(CHECKOUT_SUM) == checkout_before
