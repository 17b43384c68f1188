"""The tool's own data files: the unit and env templates (templates/), the patch sets (roles/) and the starter
project `sglang-deploy init` writes (inventory/hosts.example.yaml and the reference profile).

In a source checkout they are the top-level templates/ and roles/ directories. A wheel (`pip install .`) carries
the same files inside the package as deploy_lib/templates/ and deploy_lib/roles/ (pyproject.toml maps them), so an
installed tool renders and patches without a checkout next to it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_dir(name: str, in_checkout: str | None = None) -> Path:
    """deploy_lib/<name> in an installed wheel, else <checkout>/<in_checkout or name>."""
    inside = PACKAGE_DIR / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / (in_checkout or name)


TEMPLATES_DIR = bundled_dir("templates")
ROLES_DIR = bundled_dir("roles")
STARTER_DIR = bundled_dir("starter", "inventory")  # the wheel carries only the starter's files of inventory/
