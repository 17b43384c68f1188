"""A throw-away project for driving deploys on a sandbox guest: the repo's profiles plus a test's own, and an
inventory naming the guest."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from deploy_lib.deploy.project import Project
from sandbox import manage

REPO = Path(__file__).resolve().parents[2]


def project_for_guest(root: Path, guest: manage.Guest, profiles: Mapping[str, str]) -> tuple[Project, str]:
    """The project at `root` and the path of its inventory (the guest alone)."""
    shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
    for name, text in profiles.items():
        (root / "inventory" / "profiles" / f"{name}.yaml").write_text(text)
    inventory = root / "inventory" / "sandbox.yaml"
    inventory.write_text(manage.inventory_text([guest]))
    return Project(root), str(inventory)
