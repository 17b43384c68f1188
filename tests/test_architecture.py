"""The import graph of deploy_lib: each module's layer follows from its folder, each module uses only its own layer
or those below, no import cycle, and the pure layers never reach a connection (docs/architecture.md).

Two graphs are read from the source, with every import counted (top level, inside a function, under
TYPE_CHECKING: a lazy import is still a dependency, and a type names what the code holds):

- the import graph, as Python runs it: `from deploy_lib.store import StoreLayout` imports the package `store`, whose
  `__init__` imports all of store's modules. No cycle may run through it (a cycle makes the import order decide
  which names exist yet). Importing a submodule also runs its package's `__init__` first; that implicit edge is not
  counted, or every package that re-exports its modules would be a cycle.
- the use graph, where each imported name is defined: the same import uses `store.layout`, because store's
  `__init__` re-exports StoreLayout from there. Layers and purity are judged on it.

A new module takes the layer of the folder it is put in; a new folder of deploy_lib is named in FOLDER_LAYERS.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deploy_lib"

# Bottom to top.
LAYERS = ("base", "host scripts", "transport", "schema", "planning", "host actions", "commands", "ops")
# The top-level modules of deploy_lib are the base: the exception tree, YAML and JSON-lines reading, digests, progress
# callbacks, what each SGLang release spells. Each folder is one layer:
FOLDER_LAYERS: dict[str, str] = {
    # scripts shipped whole to a host's python: they import nothing of deploy_lib
    "host_scripts": "host scripts",
    # Step / StepResult as data, the one connection that runs them, a batch of reads
    "remote": "transport",
    # pydantic models of what the user writes
    "profile": "schema", "inventory": "schema",
    # pure, one folder per concern: profile + host facts -> release -> Steps, and parsers of StepResults
    **dict.fromkeys(("facts", "release", "deploy", "gpu_check", "health", "models", "patches", "store", "throughput",
                     "metrics", "venvs", "tune", "report"), "planning"),
    # read or change one host through a Remote: the facts read, the lock, the switch, the ladder, a venv build
    "host": "host actions",
    # one user-visible operation on one host, under the host lock
    "commands": "commands",
    # many hosts: a group, a multi-node release, replicas behind a router
    "ops": "ops",
}
# Layers docs/architecture.md calls pure: computed without SSH, unit-tested without a host.
PURE = frozenset({"base", "schema", "planning"})
# What a module needs to reach a host: the Remote protocol (a parameter typed with it) or the SSH connection; or a
# call of `.run` on something named remote. (remote.concurrently only marks Steps: data.)
REACHING_THE_HOST = frozenset({"Remote", "FabricRemote"})


def layer_of(module: str, package: Path = PACKAGE) -> str | None:
    """The layer of a module, from its folder: a top-level module of deploy_lib is base; None for a folder named in
    no layer, or a module that is not there."""
    folder, _, rest = module.partition(".")
    if folder in FOLDER_LAYERS:
        return FOLDER_LAYERS[folder]
    if not rest and (module == "__init__" or (package / f"{module}.py").is_file()):
        return "base"
    return None


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """deploy_lib/errors.py -> "errors"; a subpackage's modules are dotted: deploy_lib/patches/spec.py ->
    "patches.spec", deploy_lib/patches/__init__.py -> "patches"."""
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _module(dotted: str, package: Path) -> str:
    """The module of deploy_lib that `dotted` (without the deploy_lib. prefix) names or lies in."""
    parts = dotted.split(".")
    while len(parts) > 1 and not (package.joinpath(*parts).with_suffix(".py").is_file()
                                  or (package.joinpath(*parts) / "__init__.py").is_file()):
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterable[tuple[str, str | None]]:
    """(module imported from, name or None) for every deploy_lib import of a file, without the deploy_lib prefix."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("deploy_lib."):
            inner = node.module.removeprefix("deploy_lib").lstrip(".")
            yield from ((inner, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name.removeprefix("deploy_lib."), None) for alias in node.names
                        if alias.name.startswith("deploy_lib."))


def imported_modules(path: Path, package: Path = PACKAGE) -> set[str]:
    """deploy_lib modules a file imports anywhere (top level, inside functions, under TYPE_CHECKING), as Python runs
    the import: a name from a package is an import of that package."""
    return {_module(f"{inner}.{name}".strip(".") if name else inner, package) for inner, name in _imports(path)}


def reexports(path: Path) -> dict[str, str]:
    """The names a package's __init__ takes from its own modules: name -> module."""
    return {name: module for module, name in ((_module(inner, PACKAGE), name) for inner, name in _imports(path))
            if name is not None}


def used_modules(path: Path, facades: Mapping[str, Mapping[str, str]], package: Path = PACKAGE) -> set[str]:
    """deploy_lib modules whose names a file uses: a name a package's __init__ re-exports is used from the module that
    defines it."""
    used = set()
    for inner, name in _imports(path):
        module = _module(f"{inner}.{name}".strip(".") if name else inner, package)
        used.add(facades.get(module, {}).get(name or "", module))
    return used


def reaches_the_host(path: Path) -> set[str]:
    """What in a file can reach a host: REACHING_THE_HOST names it imports or refers to, `remote.run(...)` calls."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("deploy_lib"):
            found.update(alias.name for alias in node.names if alias.name in REACHING_THE_HOST)
        elif isinstance(node, ast.Attribute) and node.attr in REACHING_THE_HOST:
            found.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run":
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if "remote" in name.lower():
                found.add(f"{name}.run")
    return found


def _files() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    return {module: imported_modules(path) - {module} for module, path in _files().items()}


def use_graph() -> dict[str, set[str]]:
    files = _files()
    facades = {module: reexports(path) for module, path in files.items() if path.name == "__init__.py"}
    return {module: used_modules(path, facades) - {module} for module, path in files.items()}


def unnamed(modules: Iterable[str]) -> list[str]:
    return sorted(module for module in modules if layer_of(module) is None)


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    def rank(module: str) -> int:
        layer = layer_of(module)
        return LAYERS.index(layer) if layer else len(LAYERS)  # unnamed: above everything, so never imported
    return sorted(f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})"
                  for module, deps in graph.items() for dep in deps if rank(dep) > rank(module))


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles of a graph: its strongly connected components of more than one module (Tarjan), each
    sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for dep in graph.get(module, ()):
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            component = []
            while (member := stack.pop()) != module:
                component.append(member)
            if component:
                found.append(sorted([module, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def impure(reaching: Mapping[str, set[str]]) -> list[str]:
    return sorted(f"{module} ({layer_of(module)}) reaches the host: {', '.join(sorted(what))}"
                  for module, what in reaching.items() if what and layer_of(module) in PURE)


def test_every_module_is_in_a_layer() -> None:
    assert unnamed(_files()) == [], "name the new folder in FOLDER_LAYERS (the docstring says which)"


def test_every_folder_named_exists() -> None:
    """A renamed or removed folder leaves no stale name behind."""
    assert {folder for folder in FOLDER_LAYERS if not (PACKAGE / folder / "__init__.py").is_file()} == set()


def test_no_module_uses_a_layer_above_its_own() -> None:
    assert upward_imports(use_graph()) == [], (
        "move the imported code down (a profile model into deploy_lib/profile/settings.py, a version fact into "
        "deploy_lib/versions.py) instead of importing upward")


def test_there_is_no_import_cycle() -> None:
    assert cycles(import_graph()) == [], "the dependency must point one way: import the half that is needed"


def test_no_module_of_a_pure_layer_reaches_the_host() -> None:
    reaching = {module: reaches_the_host(path) for module, path in _files().items()}
    assert impure(reaching) == [], "a module that runs steps belongs in deploy_lib/host/ (or above)"


def test_host_scripts_import_nothing_of_deploy_lib() -> None:
    graph = import_graph()
    scripts = {module: graph[module] for module in graph if layer_of(module) == "host scripts"}
    assert len(scripts) > 10 and {script: deps for script, deps in scripts.items() if deps} == {}


# --- each check shown failing on a bad input -------------------------------------------------------------------


def test_a_module_takes_the_layer_of_its_folder(tmp_path: Path) -> None:
    assert [layer_of(m) for m in ("errors", "__init__", "host_scripts", "remote.readings", "inventory.model",
                                  "store.layout", "host.switch", "commands.deploy", "ops.deploy")] == [
        "base", "base", "host scripts", "transport", "schema", "planning", "host actions", "commands", "ops"]
    (tmp_path / "new_folder").mkdir()
    (tmp_path / "top.py").touch()
    assert [layer_of(m, tmp_path) for m in ("top", "new_folder.module", "absent")] == ["base", None, None]


@pytest.mark.parametrize(("graph", "expected"), [
    ({"profile": {"release"}}, ["profile (schema) imports release (planning)"]),
    ({"profile.settings": {"host.venv_build"}}, ["profile.settings (schema) imports host.venv_build (host actions)"]),
    ({"store.layout": {"commands.deploy"}}, ["store.layout (planning) imports commands.deploy (commands)"]),
    ({"remote": {"profile"}}, ["remote (transport) imports profile (schema)"]),
    ({"commands.status": {"ops.fleet"}}, ["commands.status (commands) imports ops.fleet (ops)"]),
    ({"release": {"brand_new"}}, ["release (planning) imports brand_new (None)"]),
    ({"commands.deploy": {"profile", "store", "remote", "host.switch", "errors"},
      "ops.deploy": {"commands.deploy", "ops.fleet"}}, []),
])
def test_the_check_catches_an_upward_import(graph: dict[str, set[str]], expected: list[str]) -> None:
    assert upward_imports(graph) == expected


@pytest.mark.parametrize(("graph", "expected"), [
    # the cycle this test missed: deploy.engine -> gpu_check -> gpu_check.on_host -> deploy -> deploy.engine
    ({"deploy": {"deploy.engine"}, "deploy.engine": {"gpu_check"}, "gpu_check": {"gpu_check.on_host"},
      "gpu_check.on_host": {"deploy", "errors"}, "errors": set()},
     [["deploy", "deploy.engine", "gpu_check", "gpu_check.on_host"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ({"deploy": {"deploy.engine"}, "deploy.engine": {"gpu_check"}, "gpu_check": set(),
      "gpu_check.on_host": {"deploy", "gpu_check"}}, []),
])
def test_the_check_finds_a_cycle_within_one_layer_too(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_the_check_catches_a_pure_module_that_runs_steps(tmp_path: Path) -> None:
    calling = tmp_path / "calling.py"
    calling.write_text("from deploy_lib.remote import Step\ndef read(host):\n"
                       "    return host.remote.run([Step('x', ())])\n")
    typed = tmp_path / "typed.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from deploy_lib.remote import Remote\n")
    dotted = tmp_path / "dotted.py"
    dotted.write_text("from deploy_lib import remote\ndef f(r: remote.FabricRemote) -> None: ...\n")
    data = tmp_path / "data.py"
    data.write_text("from deploy_lib.remote import Step, StepResult\ndef parse(result: StepResult) -> str: ...\n")
    reaching = {name: reaches_the_host(tmp_path / f"{path}.py") for name, path in
                (("release.render", "calling"), ("release", "typed"), ("store.lock", "typed"),
                 ("versions", "dotted"), ("facts.diagnose", "data"))}
    assert impure(reaching) == ["release (planning) reaches the host: Remote",
                                "release.render (planning) reaches the host: remote.run",
                                "store.lock (planning) reaches the host: Remote",
                                "versions (base) reaches the host: FabricRemote"]
    assert impure({"host.store": {"Remote"}, "commands.deploy": {"Remote"}}) == []


def test_the_reader_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nimport deploy_lib.store\nfrom deploy_lib import remote\n"
                      "if TYPE_CHECKING:\n    from deploy_lib.profile import Profile\n"
                      "def f():\n    from deploy_lib.deploy import deploy\n")
    assert imported_modules(source) == {"store", "remote", "profile", "deploy"}


def test_the_reader_names_a_subpackage_module_by_its_dotted_name(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from deploy_lib.gpu_check import advise, subject\nfrom deploy_lib.patches.spec import Name\n")
    assert imported_modules(source) == {"gpu_check", "gpu_check.subject", "patches.spec"}
    assert module_name(PACKAGE / "patches" / "__init__.py") == "patches"


def test_a_name_a_package_re_exports_is_used_from_the_module_that_defines_it(tmp_path: Path) -> None:
    """`from deploy_lib.store import StoreLayout` runs store's __init__ (import graph) but uses store.layout (use
    graph); `from deploy_lib.store import FACT_LOCK` uses store.lock."""
    source = tmp_path / "m.py"
    source.write_text("from deploy_lib.store import StoreLayout, FACT_LOCK\nfrom deploy_lib import store\n")
    facades = {"store": reexports(PACKAGE / "store" / "__init__.py")}
    assert imported_modules(source) == {"store"}
    assert used_modules(source, facades) == {"store", "store.layout", "store.lock"}
