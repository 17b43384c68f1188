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
HOST_SCRIPTS = frozenset({"sglang_options", "probe_script", "gpu_check_script", "router_script"}) | frozenset(
    f"venvs.{name}_script" for name in ("python_facts", "installed", "relocate", "inspect", "verify", "extract_uv",
                                        "fetch_uv", "tree", "imported_from"))
# Bottom to top; a module not named here is "planning".
LAYERS: dict[str, frozenset[str]] = {
    "base": frozenset({"__init__", "errors", "yaml_io", "bundled", "progress", "interrupts", "digests",
                       "model_stage", "versions", "json_lines", "host_paths"}) | HOST_SCRIPTS,
    "transport": frozenset({"remote", "remote.steps", "remote.batch", "remote.ssh", "remote.ssh_config", "remote.sftp",
                            "remote.connection", "remote.webhook", "readings"}),
    "schema": frozenset({"settings", "profile", "profile.fields", "profile.choices", "profile.sections",
                        "profile.model", "profile.loading", "profile.stored", "profile.overrides", "inventory",
                        "inventory_formats"}),
    "planning": frozenset(),
    "commands": frozenset({"deploy", "deploy.plan", "deploy.preflight", "deploy.switch", "deploy.engine", "adopt",
                           "gpu_check", "gpu_check.on_host", "patches.on_host", "status", "uninstall",
                           "multinode_deploy", "multinode_switch", "router_deploy", "tune", "tune.loop"}),
}
ORDER = list(LAYERS)
MAX_LINES = 400
# Modules over MAX_LINES whose split is under way (issue 14); the name goes when the split lands.
BEING_SPLIT: frozenset[str] = frozenset()


def layer_of(module: str) -> str:
    return next((name for name, members in LAYERS.items() if module in members), "planning")


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """deploy_lib/facts.py -> "facts"; a subpackage's modules are dotted: deploy_lib/patches/spec.py -> "patches.spec",
    deploy_lib/patches/__init__.py -> "patches"."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _module(dotted: str, package: Path) -> str:
    """The module of deploy_lib that `dotted` (without the deploy_lib. prefix) names or lies in."""
    parts = dotted.split(".")
    while len(parts) > 1 and not (package.joinpath(*parts).with_suffix(".py").is_file()
                                  or (package.joinpath(*parts) / "__init__.py").is_file()):
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, package: Path = PACKAGE) -> set[str]:
    """deploy_lib modules a file imports anywhere (top level, inside functions, under TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("deploy_lib."):
            inner = node.module.removeprefix("deploy_lib").lstrip(".")
            found.update(_module(f"{inner}.{alias.name}".lstrip("."), package) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(_module(alias.name.removeprefix("deploy_lib."), package) for alias in node.names
                         if alias.name.startswith("deploy_lib."))
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})"
                  for module, deps in graph.items() for dep in deps
                  if ORDER.index(layer_of(dep)) > ORDER.index(layer_of(module)))


def package_graph() -> dict[str, set[str]]:
    graph = {module_name(path): imported_modules(path) for path in PACKAGE.rglob("*.py")}
    return {module: deps - {module} for module, deps in graph.items()}


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
    assert named - set(package_graph()) == set()


def test_no_module_is_over_about_400_lines() -> None:
    """One concern per module: a module past the limit becomes a package of smaller ones (README, "Architecture");
    a host script shipped whole is exempt."""
    lengths = {module_name(path): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    over = {module: lines for module, lines in lengths.items() if lines > MAX_LINES and module not in HOST_SCRIPTS}
    assert set(over) - BEING_SPLIT == set(), f"split these into packages of smaller modules: {over}"
    assert BEING_SPLIT - set(over) == set(), "these are split now: remove them from BEING_SPLIT"


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


def test_the_reader_names_a_subpackage_module_by_its_dotted_name(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from deploy_lib.patches import PatchSet, on_host\nfrom deploy_lib.patches.spec import Name\n")
    assert imported_modules(source) == {"patches", "patches.on_host", "patches.spec"}
    assert module_name(PACKAGE / "patches" / "__init__.py") == "patches"
