"""The facts' round trip on a real guest: a no-op redeploy reads SGLang's options from the verified cache and checks
the working directory with the shell, without starting the venv's python for either."""

from __future__ import annotations

import pytest
from helpers.rig import Rig

from deploy_lib.commands import deploy as engine
from sandbox.names import GUEST_VENV

pytestmark = pytest.mark.sandbox
VENV = str(GUEST_VENV)  # the inventory's `venv` on the guest
HF_HOME = "/root/.cache/huggingface"  # the service user's (root's) default cache
REPO = "lukealonso--GLM-5-NVFP4"
STARTS = "/tmp/venv-python-starts"
# bin/python3 replaced by a script that notes its first two arguments, then runs the venv's python as before (moved
# to python3.orig: bin/python is a link to python3, the script itself)
WRAPPER = f'#!/bin/sh\nprintf "%s|%s\\n" "$1" "$2" | head -n 1 >> {STARTS}\nexec {VENV}/bin/python3.orig "$@"\n'


def deploy_counting_python(rig: Rig, profile: str) -> tuple[engine.Outcome, list[str]]:
    """A deploy while the venv's bin/python3 notes each start: (outcome, the starts' first two arguments)."""
    rig.root(f"mv {VENV}/bin/python3 {VENV}/bin/python3.orig && rm -f {STARTS}")
    try:
        rig.write(f"{VENV}/bin/python3", WRAPPER)
        rig.root(f"chmod 755 {VENV}/bin/python3")
        outcome = rig.deploy(profile)
        return outcome, rig.root(f"cat {STARTS} 2>/dev/null || true").splitlines()
    finally:
        rig.root(f"mv -f {VENV}/bin/python3.orig {VENV}/bin/python3")


def test_a_no_op_redeploy_starts_no_python_for_sglangs_options_or_import_origin(rig: Rig) -> None:
    rig.fault(None)
    first = rig.deploy("glm5-nvfp4")
    assert first.action in ("deployed", "unchanged")
    rig.deploy("glm5-nvfp4")  # the store exists now: the facts' python writes the cache (a first contact writes none)
    caches = rig.root("ls /opt/sglang-deploy/sglang/facts/*/sglang-*.facts").split()
    assert len(caches) == 1
    assert rig.root("ls -A /root | grep -c '^sglang' || true").strip() == "0"  # nothing to shadow the venv's SGLang
    again, starts = deploy_counting_python(rig, "glm5-nvfp4")
    assert again.action == "unchanged" and again.release_id == first.release_id
    assert "-I|-" not in starts and "-I|-S" in starts  # SGLang's options from the cache; the model plan still ran
    assert not [start for start in starts if start.startswith("-c|")]  # the import check answered in the shell


def test_a_no_op_redeploy_of_a_pinned_commit_starts_no_python_on_the_host(rig: Rig) -> None:
    """The model at a commit a stage completed is planned by the shell from the plan that stage kept: with SGLang's
    options cached and no shadow possible, the no-op's facts start no Python at all."""
    rig.fault(None)
    current = rig.deploy("glm5-nvfp4")
    assert current.plan is not None
    commit = current.plan.release.model["commit"]
    # one snapshot link lost: the pinned deploy stages it again, and that stage keeps its plan
    rig.root(f"rm -rf {HF_HOME}/sglang-deploy && rm {HF_HOME}/hub/models--{REPO}/snapshots/{commit}/config.json")
    (rig.project.root / "inventory" / "profiles" / "glm5-pinned.yaml").write_text(
        f"extends: glm5-nvfp4\nmodel:\n  revision: {commit}\n")
    pinned = rig.deploy("glm5-pinned")
    assert pinned.action == "deployed" and "model" in pinned.timings
    assert rig.root(f"ls {HF_HOME}/sglang-deploy/models--{REPO}/").split() != []
    again, starts = deploy_counting_python(rig, "glm5-pinned")
    assert again.action == "unchanged" and again.release_id == pinned.release_id
    assert starts == []


def test_a_no_op_redeploy_of_a_branch_resolves_it_without_importing_huggingface_hub(rig: Rig) -> None:
    """`main` still asks the hub which commit it names (one request, from the standard library), and that commit's
    record answers the rest: with huggingface_hub unimportable the no-op still plans the model."""
    rig.fault(None)
    current = rig.deploy("glm5-nvfp4")
    assert current.plan is not None and rig.root(
        f"ls {HF_HOME}/sglang-deploy/models--{REPO}/{current.plan.release.model['commit']}.json").strip()
    [package] = rig.root(f"ls -d {VENV}/lib/python3*/site-packages/huggingface_hub").split()
    rig.root(f"mv {package}/__init__.py {package}/__init__.py.off")
    try:
        again = rig.deploy("glm5-nvfp4")
    finally:
        rig.root(f"mv {package}/__init__.py.off {package}/__init__.py")
    assert again.action == "unchanged" and again.release_id == current.release_id
