"""The import graph of deploy_lib has the schema at the bottom and operations above it (README, "Architecture").

A module imports only modules of its own layer or of a layer below it. A new module of deploy_lib is a planning
module unless it is named in one of the other layers here; a command module (one that runs a whole user-visible
operation under the host lock) goes in COMMANDS, a profile or inventory model in SCHEMA.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deploy_lib"

# Modules shipped to the host whole (run there by the host's python): they import nothing of deploy_lib.
HOST_SCRIPTS = frozenset({"sglang_options", "probe_script", "gpu_check_script"})
# Bottom to top; a module not named here is "planning".
LAYERS: dict[str, frozenset[str]] = {
    "base": frozenset({"__init__", "errors", "yaml_io", "bundled", "progress", "interrupts", "systemd_syntax",
                       "model_stage"}) | HOST_SCRIPTS,
    "transport": frozenset({"remote"}),
    "schema": frozenset({"settings", "profile", "inventory"}),
    "planning": frozenset(),
    "commands": frozenset({"deploy", "adopt", "gpu_check", "patching", "status", "uninstall"}),
}
ORDER = list(LAYERS)


def layer_of(module: str) -> str:
    return next((name for name, members in LAYERS.items() if module in members), "planning")


def imported_modules(path: Path) -> set[str]:
    """deploy_lib modules a file imports anywhere (top level, inside functions, under TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "deploy_lib":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("deploy_lib."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("deploy_lib."))
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})"
                  for module, deps in graph.items() for dep in deps
                  if ORDER.index(layer_of(dep)) > ORDER.index(layer_of(module)))


def package_graph() -> dict[str, set[str]]:
    return {path.stem: imported_modules(path) for path in PACKAGE.glob("*.py")}


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(package_graph()) == [], (
        "move the imported code down (a profile model into deploy_lib/settings.py, a version fact into "
        "deploy_lib/versions.py) instead of importing upward")


def test_host_scripts_import_nothing_of_deploy_lib() -> None:
    graph = package_graph()
    assert {script: graph[script] for script in HOST_SCRIPTS} == {script: set() for script in HOST_SCRIPTS}


def test_every_named_module_exists() -> None:
    """A renamed or removed module leaves no stale name behind that would hide a new module's layer."""
    named = set().union(*LAYERS.values())
    assert named - {path.stem for path in PACKAGE.glob("*.py")} == set()


@pytest.mark.parametrize(("graph", "expected"), [
    ({"profile": {"bench"}}, ["profile (schema) imports bench (planning)"]),
    ({"settings": {"venvs"}}, ["settings (schema) imports venvs (planning)"]),
    ({"store": {"deploy"}}, ["store (planning) imports deploy (commands)"]),
    ({"remote": {"profile"}}, ["remote (transport) imports profile (schema)"]),
    ({"deploy": {"profile", "store", "remote", "errors"}}, []),
])
def test_the_check_catches_an_upward_import(graph: dict[str, set[str]], expected: list[str]) -> None:
    assert upward_imports(graph) == expected


def test_the_reader_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport deploy_lib.store\nfrom deploy_lib import remote\n"
                      "if TYPE_CHECKING:\n    from deploy_lib.profile import Profile\n"
                      "def f():\n    from deploy_lib.deploy import deploy\n")
    assert imported_modules(source) == {"store", "remote", "profile", "deploy"}
