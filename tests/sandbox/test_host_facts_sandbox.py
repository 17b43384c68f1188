"""The facts' round trip on a real guest: a no-op redeploy reads SGLang's options from the verified cache and checks
the working directory with the shell, without starting the venv's python for either."""

from __future__ import annotations

import pytest
from rig import Rig

from deploy_lib import deploy as engine
from sandbox.names import GUEST_VENV

pytestmark = pytest.mark.sandbox
VENV = str(GUEST_VENV)  # the inventory's `venv` on the guest
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
    caches = rig.root("ls /opt/sglang-deploy/sglang/facts/*/sglang-*.facts").split()
    assert len(caches) == 1
    assert rig.root("ls -A /root | grep -c '^sglang' || true").strip() == "0"  # nothing to shadow the venv's SGLang
    again, starts = deploy_counting_python(rig, "glm5-nvfp4")
    assert again.action == "unchanged" and again.release_id == first.release_id
    assert "-I|-" not in starts and "-I|-c" in starts  # SGLang's options from the cache; the model plan still ran
    assert not [start for start in starts if start.startswith("-c|")]  # the import check answered in the shell

