"""The import graph of deploy_lib: every module in a named layer, each using only its own layer or those below, no
import cycle, and the pure layers never reaching a connection (docs/architecture.md).

Two graphs are read from the source, with every import counted (top level, inside a function, under
TYPE_CHECKING: a lazy import is still a dependency, and a type names what the code holds):

- the import graph, as Python runs it: `from deploy_lib.store import StoreLayout` imports the package `store`, whose
  `__init__` imports all of store's modules. No cycle may run through it (a cycle makes the import order decide
  which names exist yet). Importing a submodule also runs its package's `__init__` first; that implicit edge is not
  counted, or every package that re-exports its modules would be a cycle.
- the use graph, where each imported name is defined: the same import uses `store.layout`, because store's
  `__init__` re-exports StoreLayout from there. Layers and purity are judged on it, so a planning module may take a
  pure name from a package whose `__init__` also re-exports a host action, but not the host action.

A new module goes into one of LAYERS by name (a module named nowhere fails the test); a module of the ops layer
(many hosts) is any `ops.*`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deploy_lib"

# Modules shipped to the host whole (run there by the host's python): they import nothing of deploy_lib.
HOST_SCRIPTS = frozenset({"host_scripts.sglang_options", "host_scripts.probe",
                          "host_scripts.gpu_check", "host_scripts.model_stage", "router_script",
                          "gpu_check.p2p.measure_script"}) | \
    frozenset(f"venvs.{name}_script" for name in ("python_facts", "installed", "relocate", "inspect", "verify",
                                                  "extract_uv", "fetch_uv", "tree", "imported_from"))
OPS_PREFIX = "ops."
# Bottom to top. The folders follow the layers (docs/architecture.md): base at the top of deploy_lib, host_scripts/,
# remote/ and facts/readings, profile/ and inventory, facts/ and release/ for planning, commands/, ops/; a concern's
# own package (deploy/, store/, models/, venvs/, health/, throughput/, patches/, gpu_check/) holds its planning and
# its host actions side by side, each module named below.
LAYERS: dict[str, frozenset[str]] = {
    # what every layer uses: the exception tree, YAML and JSON-lines reading, digests, progress callbacks, what each
    # SGLang release spells
    "base": frozenset({"__init__", "host_scripts", "errors", "outcomes", "yaml_io", "bundled", "progress",
                       "interrupts", "digests", "versions", "json_lines", "host_paths"}),
    "host scripts": HOST_SCRIPTS,
    # Step / StepResult as data, the one connection that runs them, a batch of reads (facts.readings)
    "transport": frozenset({"remote", "remote.steps", "remote.batch", "remote.ssh", "remote.ssh_config", "remote.sftp",
                            "remote.connection", "remote.forward", "remote.webhook", "remote.runner",
                            "facts.readings"}),
    # pydantic models of what the user writes
    "schema": frozenset({"profile", "profile.fields", "profile.choices", "profile.sections", "profile.settings",
                        "profile.model", "profile.loading", "profile.stored", "profile.overrides", "inventory",
                        "inventory_formats"}),
    # pure: profile + host facts -> release -> Steps, and parsers of StepResults; never a Remote
    "planning": frozenset({
        "project",
        "facts", "facts.host", "facts.cuda_toolkit", "facts.diagnose", "facts.hand_process", "facts.sglang_config",
        "release", "release.model", "release.render", "release.server_args", "release.argv_check",
        "deploy.plan", "deploy.preflight",
        "gpu_check", "gpu_check.allreduce", "gpu_check.subject", "gpu_check.topology",
        "health.probe", "health.snapshot", "health.verdict",
        "models.facts", "models.hub", "models.pushed", "models.script", "models.sources", "models.transfer",
        "patches", "patches.audit", "patches.engine", "patches.host_files", "patches.spec", "patches.text",
        "patches.variants", "patches.versions",
        "store.facts", "store.history", "store.layout", "store.lock", "store.releases",
        "throughput.gate", "throughput.history", "throughput.results",
        "venvs.caches", "venvs.host_scripts", "venvs.installed", "venvs.interpreter", "venvs.lock", "venvs.paths",
        "venvs.wheels",
        "gpu_check.p2p", "gpu_check.p2p.links", "gpu_check.p2p.measure", "gpu_check.p2p.node",
        "gpu_check.p2p.verdict", "gpu_check.p2p.vm",
        "health.startup", "patches.profiles",
        "tune.decide", "tune.estimate", "tune.record", "tune.spec", "tune.sweep",
        "report.charts", "report.data", "report.page", "report.sweep",
    }),
    # read or change one host through a Remote: the facts batch read, the readiness ladder, a venv build
    "host actions": frozenset({
        "facts.read", "facts.crashes",
        "deploy.prune", "deploy.restore", "deploy.switch", "tune.request",
        "store", "store.on_host", "store.first_change",
        "health", "health.ladder", "health.live",
        "models", "models.staging", "models.stored",
        "throughput", "throughput.benchmark",
        "venvs", "venvs.adopted", "venvs.build", "venvs.derived", "venvs.lifecycle", "venvs.publish",
        "venvs.store_facts",
        "gpu_check.p2p.reading", "report",
        "hooks",  # runs the project's hook executables on this machine
    }),
    # one user-visible operation on one host, under the host lock
    "commands": frozenset({"deploy", "deploy.engine", "commands", "commands.adopt", "commands.status",
                           "commands.uninstall", "commands.gpu_check", "commands.patches", "tune", "tune.loop",
                           "tune.candidate"}),
    # many hosts: a group, a multi-node release, replicas behind a router (any ops.* module, and these until they
    # move there)
    "ops": frozenset(),
}
ORDER = list(LAYERS)
# Layers the README calls pure: computed without SSH, unit-tested without a host.
PURE = frozenset({"base", "schema", "planning"})
# What a module needs to reach a host: the Remote protocol (a parameter typed with it) or the SSH connection; or a
# call of `.run` on something named remote. (remote.concurrently only marks Steps: data.)
REACHING_THE_HOST = frozenset({"Remote", "FabricRemote"})
# Modules of a pure layer that still hold one function reaching the host, each with the split that removes it; a
# module goes from here when it no longer reaches the host (the test fails until it does).
SPLIT_PENDING: dict[str, str] = {}
MAX_LINES = 400  # bench/'s modules; deploy_lib's have no line cap (issue 38: a module doing one job stays whole)


def layer_of(module: str) -> str | None:
    """The layer that names `module`; None for a module named nowhere."""
    if module == OPS_PREFIX.rstrip(".") or module.startswith(OPS_PREFIX):
        return "ops"
    return next((name for name, members in LAYERS.items() if module in members), None)


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
        return ORDER.index(layer) if layer else len(ORDER)  # unnamed: above everything, so never imported
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


def impure(reaching: Mapping[str, set[str]], pending: Mapping[str, str] = SPLIT_PENDING) -> list[str]:
    return sorted(f"{module} ({layer_of(module)}) reaches the host: {', '.join(sorted(what))}"
                  for module, what in reaching.items() if what and layer_of(module) in PURE and module not in pending)


def test_every_module_is_in_a_named_layer() -> None:
    assert unnamed(_files()) == [], "name each new module in one of LAYERS (the docstring says which)"


def test_every_named_module_exists() -> None:
    """A renamed or removed module leaves no stale name behind that would hide a new module's layer."""
    named = set().union(*LAYERS.values())
    assert named - set(_files()) == set()


def test_no_module_uses_a_layer_above_its_own() -> None:
    assert upward_imports(use_graph()) == [], (
        "move the imported code down (a profile model into deploy_lib/profile/settings.py, a version fact into "
        "deploy_lib/versions.py) instead of importing upward")


def test_there_is_no_import_cycle() -> None:
    assert cycles(import_graph()) == [], "the dependency must point one way: import the half that is needed"


def test_no_module_of_a_pure_layer_reaches_the_host() -> None:
    reaching = {module: reaches_the_host(path) for module, path in _files().items()}
    assert impure(reaching) == [], "a module that runs steps belongs in host actions (or above)"
    assert {module for module in SPLIT_PENDING if not reaching[module]} == set(), "split: remove from SPLIT_PENDING"


def test_host_scripts_import_nothing_of_deploy_lib() -> None:
    graph = import_graph()
    assert {script: graph[script] for script in HOST_SCRIPTS} == {script: set() for script in HOST_SCRIPTS}


def test_no_bench_module_is_over_400_lines() -> None:
    """bench/ keeps the same limit (bench/run.py was 703 lines before its split, issue 30)."""
    bench = PACKAGE.parent / "bench"
    over = {path.name: n for path in bench.glob("*.py") if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not over, f"split these bench modules: {over}"


# --- each check shown failing on a bad input -------------------------------------------------------------------


def test_a_module_named_in_no_layer_is_reported_and_an_ops_module_is_named() -> None:
    assert unnamed(["errors", "brand_new", "ops.deploy", "deploy.brand_new"]) == ["brand_new", "deploy.brand_new"]


@pytest.mark.parametrize(("graph", "expected"), [
    ({"profile": {"release"}}, ["profile (schema) imports release (planning)"]),
    ({"profile.settings": {"venvs"}}, ["profile.settings (schema) imports venvs (host actions)"]),
    ({"store.layout": {"deploy"}}, ["store.layout (planning) imports deploy (commands)"]),
    ({"remote": {"profile"}}, ["remote (transport) imports profile (schema)"]),
    ({"commands.status": {"ops.fleet"}}, ["commands.status (commands) imports ops.fleet (ops)"]),
    ({"release": {"brand_new"}}, ["release (planning) imports brand_new (None)"]),
    ({"deploy": {"profile", "store", "remote", "errors"}, "ops.deploy": {"deploy", "ops.fleet"}}, []),
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
    # a module waiting for its split is left out only while it is named in SPLIT_PENDING
    assert impure({"store.lock": {"Remote"}}, pending={"store.lock": "host_lock moves out"}) == []
    assert impure({"store.lock": {"Remote"}}, pending={}) == ["store.lock (planning) reaches the host: Remote"]


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
    graph); `from deploy_lib.store import host_lock` uses store.on_host, a host action."""
    source = tmp_path / "m.py"
    source.write_text("from deploy_lib.store import StoreLayout, host_lock\nfrom deploy_lib import store\n")
    facades = {"store": reexports(PACKAGE / "store" / "__init__.py")}
    assert imported_modules(source) == {"store"}
    assert used_modules(source, facades) == {"store", "store.layout", "store.on_host"}
