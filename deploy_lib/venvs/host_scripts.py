"""The venv scripts that run on the host, as the source text sent to `python3 -I -c` there.

Each is a file of deploy_lib/host_scripts/ (`venv_*.py`: standard library only, no deploy_lib imports), so it is
linted and unit-tested like the rest of the code and travels whole.
"""

from __future__ import annotations

from importlib import resources


def script_source(name: str) -> str:
    """The text of deploy_lib/host_scripts/venv_<name>.py."""
    return resources.files("deploy_lib.host_scripts").joinpath(f"venv_{name}.py").read_text(encoding="utf-8")


PYTHON_FACTS_SCRIPT = script_source("python_facts")
INSTALLED_FACTS_SCRIPT = script_source("installed")
RELOCATE_SCRIPT = script_source("relocate")
INSPECT_SCRIPT = script_source("inspect")
VERIFY_SCRIPT = script_source("verify")
EXTRACT_UV_SCRIPT = script_source("extract_uv")
FETCH_UV_SCRIPT = script_source("fetch_uv")
TREE_SCRIPT = script_source("tree")
IMPORTED_FROM_SCRIPT = script_source("imported_from")
