"""A patch set of the user's own, written into a project's patches/ folder: one target, one edit, any GPU."""

from __future__ import annotations

from pathlib import Path

GATED_FILE = "sglang/srt/gate.py"
GATED = "def supported(major):\n    return major == 9\n\n\nLIMIT = 1\n"
PATCHED = "def supported(major):\n    return major in (9, 12)\n\n\nLIMIT = 1\n"
META = """\
name: {name}
description: our own gate, widened for SM120
packages: [sglang]
targets: [gate]
"""
TARGET = f"""\
description: the gate in {GATED_FILE}
package: sglang
variants:
  - versions: ">=0.5.0"
    file: {GATED_FILE}
    edits:
      - gated: |
          def supported(major):
              return major == 9
        patched: |
          def supported(major):
              return major in (9, 12)
"""


def write_project_patch_set(project: Path, name: str = "our-gate", folder: str | None = None) -> Path:
    """project/patches/<folder or name>/ with meta.yaml and targets/gate.yaml; an inventory/ beside it (one host,
    gpu1) makes `project` a project."""
    inventory = project / "inventory"
    inventory.mkdir(parents=True, exist_ok=True)
    (inventory / "hosts.yaml").write_text("all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.10\n")
    role = project / "patches" / (folder or name)
    (role / "targets").mkdir(parents=True)
    (role / "meta.yaml").write_text(META.format(name=name))
    (role / "targets" / "gate.yaml").write_text(TARGET)
    return role
