"""SGLang's launch options, read out of its source with `ast` (never importing sglang or torch).

Standard library only and no deploy_lib imports: preflight ships this file to the host and runs it with the target
venv's interpreter, `VENV/bin/python3 -I - < sglang_options.py`, which finds the sglang that interpreter would import
(importlib's finders, so editable installs work too; nothing is imported) and prints one JSON object on stdout:

    {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2", "torch_version": "2.11.0", "nccl_version": "2.28.9",
     "options": {"--tp-size": {"option_strings": ["--tp-size", "--tensor-parallel-size"], "dest": "tp_size",
                               "action": "store", "nargs": null, "choices": null, "type": "int",
                               "required": false, "deprecated": false, "error": null}, ...},
     "unresolved_choices": ["--kv-canary-real-data"], "warnings": []}

or, when sglang is not installed there, {"error": "..."} with exit code 1. `python3 - DIR` reads DIR/sglang and
DIR/*.dist-info instead (an unpacked wheel, as the tests do).

Where the options come from: `ServerArgs.add_cli_args()` in sglang/srt/server_args.py. Up to 0.5.9 it is a list of
`parser.add_argument(...)` calls; from 0.5.15 on most options are fields annotated `A[T, "help"]` or
`A[T, Arg(...)]` that `add_cli_args_from_dataclass()` (sglang/srt/arg_groups/arg_utils.py) turns into arguments, and
from 0.5.20 those fields live in the namespace classes passed to `collect_input_fields()` (arg_groups/fields/*.py).
Choices given by name are followed through the module's imports into sibling sglang files; what cannot be resolved
statically (a comprehension over an enum, a runtime registry) is reported as `choices: null`, meaning unchecked.

deploy_lib/release/argv_check.py checks an argv against these options locally; this file alone is what the host
runs, and the host's cache of its result is keyed by its text (facts.host.SGLANG_FACTS_FILE), so an edit to the
local checker leaves every host's cache valid. Runs on Python >= 3.9.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------------------------
# Static evaluation of the few expression shapes SGLang uses for choice lists.
# ---------------------------------------------------------------------------------------------------------------


class _Unresolved(Exception):
    """The expression cannot be evaluated without running SGLang."""


@dataclass(frozen=True)
class _ClassRef:
    module: _Module
    node: ast.ClassDef


@dataclass(frozen=True)
class _FuncRef:
    module: _Module
    node: ast.FunctionDef


@dataclass(frozen=True)
class _ModuleRef:
    name: str


_CONTAINERS: dict[str, Any] = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset, "sorted": sorted}
_OPAQUE = object()  # a dict value that cannot be evaluated (choices only need the keys)
_MAX_DEPTH = 25


def _imports_of(statements: list[ast.stmt], package: str) -> dict[str, tuple[str, str | None]]:
    """Name bound by each import statement -> (absolute module, attribute or None for the module itself)."""
    bound: dict[str, tuple[str, str | None]] = {}
    for stmt in statements:
        if isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                parent = package.split(".")[: len(package.split(".")) - (stmt.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            for alias in stmt.names:
                bound[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = (top, None)
    return bound


def _assignments_of(statements: list[ast.stmt]) -> dict[str, ast.expr]:
    """The last plain assignment of each name among these statements (not inside if/for/try)."""
    assigned: dict[str, ast.expr] = {}
    for stmt in statements:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            assigned[stmt.target.id] = stmt.value
    return assigned


class _Module:
    """One parsed source file of the sglang tree."""

    def __init__(self, tree: _Tree, name: str, path: Path) -> None:
        self.tree = tree
        self.name = name
        self.path = path
        self.ast = ast.parse(tree.read(path).decode("utf-8"), filename=str(path))
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.imports = _imports_of(self.ast.body, self.package)
        self.assignments = _assignments_of(self.ast.body)
        self.classes = {n.name: n for n in self.ast.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in self.ast.body if isinstance(n, ast.FunctionDef)}

    def lookup(self, name: str, depth: int) -> Any:
        """The value a module-level name is bound to."""
        if name in self.classes:
            return _ClassRef(self, self.classes[name])
        if name in self.functions:
            return _FuncRef(self, self.functions[name])
        if name in self.assignments:
            return self.tree.evaluate(self, self.assignments[name], {}, depth + 1)
        if name in self.imports:
            module_name, attr = self.imports[name]
            return self.tree.import_value(module_name, attr, depth + 1)
        raise _Unresolved(f"{self.name}: name {name} is not bound at module level")


class _Tree:
    """The installed sglang package under a site-packages directory, parsed on demand."""

    def __init__(self, site_packages: Path) -> None:
        self.root = site_packages
        self._modules: dict[str, _Module | None] = {}
        self.inputs: dict[str, str] = {}  # path -> sha256 of every file the result was read from

    def read(self, path: Path) -> bytes:
        data = path.read_bytes()
        self.inputs[str(path)] = hashlib.sha256(data).hexdigest()
        return data

    def module(self, dotted: str) -> _Module | None:
        if dotted not in self._modules:
            base = self.root.joinpath(*dotted.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            self._modules[dotted] = _Module(self, dotted, path) if path else None
        return self._modules[dotted]

    def import_value(self, module_name: str, attr: str | None, depth: int) -> Any:
        if module_name.split(".")[0] != "sglang":
            raise _Unresolved(f"{module_name} is outside sglang")
        if attr is None:
            return _ModuleRef(module_name)
        module = self.module(module_name)
        if module is None:
            if self.module(f"{module_name}.{attr}") is not None:
                return _ModuleRef(f"{module_name}.{attr}")
            raise _Unresolved(f"module {module_name} not found")
        try:
            return module.lookup(attr, depth)
        except _Unresolved:
            if self.module(f"{module_name}.{attr}") is not None:
                return _ModuleRef(f"{module_name}.{attr}")
            raise

    def evaluate(self, module: _Module, node: ast.expr, scope: dict[str, Any], depth: int) -> Any:
        """Evaluate a literal-ish expression; `scope` holds names local to a function or class body."""
        if depth > _MAX_DEPTH:
            raise _Unresolved("too deep")

        def ev(child: ast.expr) -> Any:
            return self.evaluate(module, child, scope, depth + 1)

        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list[Any] = []
            for element in node.elts:
                items.extend(_iterate(ev(element.value)) if isinstance(element, ast.Starred) else [ev(element)])
            return set(items) if isinstance(node, ast.Set) else tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Dict):
            if any(key is None for key in node.keys):
                raise _Unresolved("dict unpacking")
            values = [self._maybe(module, value, scope, depth) for value in node.values]
            return {ev(key): values[n] for n, key in enumerate(node.keys) if key is not None}
        if isinstance(node, ast.Name):
            if node.id in scope:
                bound = scope[node.id]
                return ev(bound) if isinstance(bound, ast.expr) else bound
            return module.lookup(node.id, depth)
        if isinstance(node, ast.Attribute):
            return self._attribute(ev(node.value), node.attr, depth)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, (list, tuple)):
                return left + right
            if isinstance(node.op, ast.BitOr) and isinstance(left, (set, frozenset, dict)):
                return left | right
            raise _Unresolved(f"operator {type(node.op).__name__}")
        if isinstance(node, ast.Call):
            return self._call(module, node, scope, depth)
        raise _Unresolved(f"{type(node).__name__} expression")

    def _maybe(self, module: _Module, node: ast.expr, scope: dict[str, Any], depth: int) -> Any:
        try:
            return self.evaluate(module, node, scope, depth + 1)
        except _Unresolved:
            return _OPAQUE

    def _attribute(self, value: Any, attr: str, depth: int) -> Any:
        if isinstance(value, _ClassRef):
            class_scope = _assignments_of(value.node.body)
            if attr not in class_scope:
                raise _Unresolved(f"{value.node.name}.{attr} is not a class-level assignment")
            return self.evaluate(value.module, class_scope[attr], dict(class_scope), depth + 1)
        if isinstance(value, _ModuleRef):
            return self.import_value(value.name, attr, depth + 1)
        raise _Unresolved(f"attribute {attr} of a value")

    def _call(self, module: _Module, node: ast.Call, scope: dict[str, Any], depth: int) -> Any:
        if node.keywords:
            raise _Unresolved("call with keywords")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "keys" and not node.args:
            return list(_iterate(self.evaluate(module, func.value, scope, depth + 1)))
        if isinstance(func, ast.Name) and func.id in _CONTAINERS and len(node.args) == 1:
            return _CONTAINERS[func.id](_iterate(self.evaluate(module, node.args[0], scope, depth + 1)))
        target = self.evaluate(module, func, scope, depth + 1)
        if isinstance(target, _FuncRef) and not node.args:
            return self._return_value(target, depth)
        raise _Unresolved("call of an unknown function")

    def _return_value(self, func: _FuncRef, depth: int) -> Any:
        """A no-argument helper's value: its last top-level `return`, the path taken when no plugin is loaded."""
        returns = [stmt.value for stmt in func.node.body if isinstance(stmt, ast.Return) and stmt.value is not None]
        if not returns:
            raise _Unresolved(f"{func.node.name}() has no top-level return")
        scope: dict[str, Any] = dict(_assignments_of(func.node.body))
        for name, (module_name, attr) in _imports_of(func.node.body, func.module.package).items():
            try:
                scope[name] = self.import_value(module_name, attr, depth + 1)
            except _Unresolved:
                continue  # e.g. `import sys`: only fails the evaluation if the return value needs it
        return self.evaluate(func.module, returns[-1], scope, depth + 1)


def _iterate(value: Any) -> list[Any]:
    """What `for x in value` yields (a dict's keys)."""
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        return list(value)
    raise _Unresolved(f"cannot iterate {type(value).__name__}")


# ---------------------------------------------------------------------------------------------------------------
# Option extraction
# ---------------------------------------------------------------------------------------------------------------

_ZERO_ARG_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
_NOT_GIVEN = object()  # `nargs=` absent, as opposed to `nargs=None`
_DEPRECATED_HELP = re.compile(r"^\W*(?:note:\s*)?deprecated\b", re.IGNORECASE)


def _text(node: ast.expr | None) -> str:
    """The literal text of a help string (f-string placeholders dropped)."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(part) for part in node.values if isinstance(part, ast.Constant))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return ""


def _is_text(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)) or (
        isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_text(node.left) and _is_text(node.right)
    )


def _type_name(node: ast.expr | None) -> str | None:
    """`int` for `type=int`, `human_readable_int` for `type=human_readable_int`; None when not a plain name."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _dotted(node).rpartition(".")[2]
    return None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ast.dump(node)


class _Extractor:
    """Collects the option records of one ServerArgs.add_cli_args(), as argparse would register them."""

    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.options: dict[str, dict[str, Any]] = {}
        self.unresolved: list[str] = []
        self.warnings: list[str] = []

    # -- recording -----------------------------------------------------------------------------------------------

    def _add(self, record: dict[str, Any], choices_node: ast.expr | None, module: _Module,
             scope: dict[str, Any]) -> None:
        strings: list[str] = record["option_strings"]
        if choices_node is not None and record.get("choices") is None:
            try:
                record["choices"] = sorted(_iterate(self.tree.evaluate(module, choices_node, scope, 0)), key=str)
            except _Unresolved:
                self.unresolved.append(strings[0])
        known = {s for existing in self.options.values() for s in existing["option_strings"]}
        clash = [s for s in strings if s in known]
        if clash:
            self.warnings.append(f"{', '.join(clash)} registered twice (argparse would refuse to start); "
                                 "kept the first")
            return
        self.options[strings[0]] = record

    def _action(self, node: ast.expr | None, module: _Module, nargs: Any) -> tuple[str, Any]:
        """(action name, nargs) for an `action=` value (an argparse name or an Action subclass) and `nargs=`."""
        name = "store" if node is None else node.value if isinstance(node, ast.Constant) else _dotted(node)
        name = str(name).rpartition(".")[2]
        if name in _ZERO_ARG_ACTIONS or name == "BooleanOptionalAction":
            return name, 0
        if nargs is not _NOT_GIVEN:
            return name, nargs
        if node is None or isinstance(node, ast.Constant):
            return name, None
        return name, self._action_default_nargs(node, module)

    def _action_default_nargs(self, node: ast.expr, module: _Module) -> Any:
        """The `nargs` default of a custom Action's __init__ (0 for a switch, None for one value)."""
        try:
            ref = self.tree.evaluate(module, node, {}, 0)
        except _Unresolved:
            return None
        if not isinstance(ref, _ClassRef):
            return None
        init = next((n for n in ref.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return None
        args = init.args
        positional = args.posonlyargs + args.args
        defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))  # noqa: B905
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})  # noqa: B905
        default = defaults.get("nargs")
        return default.value if isinstance(default, ast.Constant) else None

    @staticmethod
    def _deprecated(action: str, help_text: str, strings: list[str]) -> bool:
        return (
            "Deprecated" in action
            or bool(_DEPRECATED_HELP.match(help_text))
            or any(f"{s} is deprecated" in help_text or f"'{s}' is deprecated" in help_text for s in strings)
        )

    # -- parser.add_argument(...) --------------------------------------------------------------------------------

    def add_argument_call(self, call: ast.Call, module: _Module, scope: dict[str, Any]) -> None:
        strings = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not strings or len(strings) != len(call.args):
            self.warnings.append(f"line {call.lineno}: add_argument with computed option strings skipped")
            return
        kw = {k.arg: k.value for k in call.keywords if k.arg is not None}
        nargs = self.literal(kw["nargs"], module, scope) if "nargs" in kw else _NOT_GIVEN
        action, nargs = self._action(kw.get("action"), module, nargs)
        help_text = _text(kw.get("help"))
        error = (_text(kw["error_message"]) or "refused by SGLang") if "error_message" in kw else None
        first_long = next((s for s in strings if s.startswith("--")), strings[0])
        dest = self.literal(kw.get("dest"), module, scope) or first_long.lstrip("-").replace("-", "_")
        record = self._record(
            strings, dest, action, nargs, kw.get("type"), self.literal(kw.get("required"), module, scope) is True,
            help_text, error,
        )
        self._add(record, kw.get("choices"), module, scope)

    def literal(self, node: ast.expr | None, module: _Module, scope: dict[str, Any]) -> Any:
        if node is None:
            return None
        try:
            value = self.tree.evaluate(module, node, scope, 0)
        except _Unresolved:
            return None
        return None if value is _OPAQUE else value

    def _record(self, strings: list[str], dest: str, action: str, nargs: Any, type_node: ast.expr | None,
                required: bool, help_text: str, error: str | None) -> dict[str, Any]:
        if action == "BooleanOptionalAction":
            strings = strings + [f"--no-{s[2:]}" for s in strings if s.startswith("--")]
        return {
            "option_strings": strings,
            "dest": dest,
            "action": action,
            "nargs": nargs,
            "choices": None,
            "type": _type_name(type_node),
            "required": required,
            "deprecated": self._deprecated(action, help_text, strings),
            "error": error,
        }

    # -- A[T, Arg(...)] fields -----------------------------------------------------------------------------------

    def dataclass_fields(self, cls: _ClassRef, only: set[str] | None) -> None:
        fields: dict[str, ast.AnnAssign] = {}  # a name annotated twice is one field: the later annotation wins
        for stmt in cls.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields[stmt.target.id] = stmt
        for name, stmt in fields.items():
            if only is None or name in only:
                self._field(name, stmt.annotation, stmt.value is not None, cls.module)

    def _field(self, name: str, annotation: ast.expr, has_default: bool, module: _Module) -> None:
        """Mirror of add_cli_args_from_dataclass() for one field (sglang/srt/arg_groups/arg_utils.py)."""
        if not (isinstance(annotation, ast.Subscript) and _dotted(annotation.value).rpartition(".")[2] in
                ("A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
            return
        inner, *metadata = annotation.slice.elts
        meta = next((m for m in metadata if _is_text(m) or (isinstance(m, ast.Call) and _dotted(m.func) == "Arg")),
                    None)
        if meta is None:
            return
        kw = {k.arg: k.value for k in meta.keywords if k.arg} if isinstance(meta, ast.Call) else {"help": meta}

        def lit(key: str) -> Any:
            return self.literal(kw.get(key), module, {})

        if lit("no_cli") is True:
            return
        cli_name = lit("cli_name") or "--" + name.replace("_", "-")
        strings = [cli_name, *(lit("aliases") or [])]
        help_text = _text(kw.get("help"))
        choices_node = kw.get("choices")
        type_parser = kw.get("type_parser")
        if kw.get("action") is not None:
            extra = kw.get("action_kwargs")
            extra_kw = {k.value: v for k, v in zip(extra.keys, extra.values)  # noqa: B905
                        if isinstance(k, ast.Constant)} if isinstance(extra, ast.Dict) else {}
            nargs = self.literal(extra_kw["nargs"], module, {}) if "nargs" in extra_kw else _NOT_GIVEN
            action, nargs = self._action(kw["action"], module, nargs)
            record = self._record(strings, name, action, nargs, extra_kw.get("type"), False, help_text, None)
            self._add(record, extra_kw.get("choices"), module, {})
            return
        inner = _unwrap_optional(inner)
        literal_values = _literal_values(inner, self, module)
        if literal_values is not None:
            record = self._record(strings, name, "store", None, type_parser, False, help_text, None)
            record["type"] = record["type"] or _python_type_name(literal_values)
            if choices_node is None:
                record["choices"] = sorted(literal_values, key=str)
            self._add(record, choices_node, module, {})
            return
        origin = _dotted(inner.value) if isinstance(inner, ast.Subscript) else None
        if origin in ("List", "list", "typing.List") and type_parser is None:
            element = inner.slice if isinstance(inner, ast.Subscript) else None
            record = self._record(strings, name, "store", lit("nargs") or "+", element, False, help_text, None)
            self._add(record, choices_node, module, {})
            return
        if isinstance(inner, ast.Name) and inner.id == "bool":
            self._add(self._record(strings, name, "store_true", 0, None, False, help_text, None), None, module, {})
            return
        required = lit("required") is True or (lit("required") is None and not has_default)
        type_node = type_parser if type_parser is not None else inner
        record = self._record(strings, name, "store", lit("nargs"), type_node, required, help_text, None)
        if record["type"] not in ("int", "float", "str") and type_parser is None:
            record["type"] = "str"  # _infer_type_func(): anything else parses as str
        self._add(record, choices_node, module, {})


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """X for Optional[X], X | None and Union[X, None]; the node itself otherwise."""
    if isinstance(node, ast.Subscript) and _dotted(node.value).rpartition(".")[2] == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.Subscript) and _dotted(node.value).rpartition(".")[2] == "Union" and isinstance(
            node.slice, ast.Tuple):
        rest = [s for s in node.slice.elts if not (isinstance(s, ast.Constant) and s.value is None)]
        if len(rest) == 1:
            return rest[0]
    return node


def _literal_values(node: ast.expr, extractor: _Extractor, module: _Module) -> list[Any] | None:
    if not (isinstance(node, ast.Subscript) and _dotted(node.value).rpartition(".")[2] == "Literal"):
        return None
    elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return [extractor.literal(e, module, {}) for e in elements]


def _python_type_name(values: list[Any]) -> str:
    first = values[0] if values else ""
    return {int: "int", float: "float"}.get(type(first), "str")


# the versions the facts report, by the distributions that carry them (torch's NCCL comes as nvidia-nccl-cuXX)
DISTRIBUTIONS = {"sglang_version": ("sglang",), "flashinfer_version": ("flashinfer-python", "flashinfer"),
                 "torch_version": ("torch",),
                 "nccl_version": ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")}


def _dist_versions(site_packages: Path, inputs: dict[str, str], warnings: list[str]) -> dict[str, str | None]:
    """DISTRIBUTIONS' versions from the METADATA of the distributions installed under site_packages (one scan);
    the METADATA files they came from go into `inputs`. Two versions of one distribution there (a dist-info left
    behind) give the first in name order, and a warning naming both (no version ordering here: standard library
    only)."""
    found: dict[str, list[str]] = {key: [] for key in DISTRIBUTIONS}
    for metadata in sorted(site_packages.glob("*.dist-info/METADATA")):
        headers: dict[str, str] = {}
        data = metadata.read_bytes()
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            headers.setdefault(key.strip().lower(), value.strip())
        name = re.sub(r"[-_.]+", "-", headers.get("name", "")).lower()
        for key, names in DISTRIBUTIONS.items():
            if name in names and "version" in headers:
                found[key].append(headers["version"])
                inputs[str(metadata)] = hashlib.sha256(data).hexdigest()
    for key, versions in found.items():
        if len(set(versions)) > 1:
            warnings.append(f"{site_packages} holds {' and '.join(versions)} as {key}: reporting {versions[0]}")
    return {key: versions[0] if versions else None for key, versions in found.items()}


def extract(site_packages: Path, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """Every launch option of the sglang installed under site_packages, plus the sglang and flashinfer versions;
    `inputs` receives the sha256 of every file read (path -> digest)."""
    tree = _Tree(site_packages)
    server_args = tree.module("sglang.srt.server_args")
    if server_args is None:
        raise FileNotFoundError(f"{site_packages}/sglang/srt/server_args.py not found: is sglang installed there?")
    cls = server_args.classes.get("ServerArgs")
    add_cli_args = next((n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef)
                         and n.name == "add_cli_args"), None)
    if cls is None or add_cli_args is None:
        raise ValueError(f"{server_args.path}: no ServerArgs.add_cli_args()")
    extractor = _Extractor(tree)
    scope: dict[str, Any] = dict(_assignments_of(add_cli_args.body))
    for node in ast.walk(add_cli_args):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            extractor.add_argument_call(node, server_args, scope)
        elif _dotted(node.func).rpartition(".")[2] == "add_cli_args_from_dataclass" and len(node.args) >= 2:
            only = {k.arg: extractor.literal(k.value, server_args, scope) for k in node.keywords}.get("fields")
            for source in _field_sources(server_args, cls, node.args[1]):
                extractor.dataclass_fields(source, set(only) if only else None)
    versions = _dist_versions(site_packages, tree.inputs, extractor.warnings)
    if inputs is not None:
        inputs.update(tree.inputs)
    return {
        **versions,
        "options": extractor.options,
        "unresolved_choices": sorted(set(extractor.unresolved)),
        "warnings": extractor.warnings,
    }


def _field_sources(server_args: _Module, cls: ast.ClassDef, arg: ast.expr) -> list[_ClassRef]:
    """The classes whose annotated fields make up ServerArgs: itself, plus (0.5.20+) every namespace class passed
    to `collect_input_fields()` at module level of server_args.py."""
    sources = [_ClassRef(server_args, cls)] if _dotted(arg) == cls.name else []
    for stmt in server_args.ast.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and _dotted(node.func).rpartition(".")[2] == "collect_input_fields" \
                    and node.args:
                try:
                    namespaces = server_args.tree.evaluate(server_args, node.args[0], {}, 0)
                except _Unresolved as err:
                    raise ValueError(f"{server_args.path}: cannot resolve collect_input_fields(): {err}") from None
                sources.extend(ns for ns in _iterate(namespaces) if isinstance(ns, _ClassRef))
    return sources

def extract_installed(inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """extract() for the sglang this interpreter would import, located without importing it; `inputs` receives the
    sha256 of every file the result depends on (path -> digest), or stays empty when it cannot name them all."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"sglang is not installed for {sys.executable}")
    read: dict[str, str] = {}
    locations = list(spec.submodule_search_locations)
    result = extract(Path(locations[0]).parent, read)
    package = Path(locations[0]) / "__init__.py"  # a namespace package (several portions): not cached
    complete = len(locations) == 1 and package.is_file()
    if complete:
        read[str(package)] = hashlib.sha256(package.read_bytes()).hexdigest()
    for key, names in DISTRIBUTIONS.items():
        for name in names:
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            result[key] = dist.version
            metadata = getattr(dist, "_path", None)  # the .dist-info directory of an installed distribution
            if metadata is None or not (Path(metadata) / "METADATA").is_file():
                complete = False
            else:
                read[str(Path(metadata) / "METADATA")] = hashlib.sha256(
                    (Path(metadata) / "METADATA").read_bytes()).hexdigest()
            break
    if inputs is not None and complete:
        inputs.update(read)
    return result


# ---------------------------------------------------------------------------------------------------------------
# The cache of the result beside the venv (facts.py's SGLANG_CHECK reads it with sh and coreutils, no Python, and
# names its first line, the header)
# ---------------------------------------------------------------------------------------------------------------


def path_listing() -> tuple[list[str], str] | None:
    """The directories on sys.path and the sha256 of their entries' names, as SGLANG_CHECK lists them
    (`find DIR -mindepth 1 -maxdepth 1 ! -name __pycache__ -printf '%f\\n' | LC_ALL=C sort` after the directory's
    own line); None when a name cannot be listed that way (a newline, bytes that are not UTF-8)."""
    dirs = [entry for entry in sys.path if entry.startswith("/") and Path(entry).is_dir()]
    text = []
    for directory in dirs:
        names = sorted(name for name in os.listdir(directory) if name != "__pycache__")  # bytecode, never imported
        if any("\n" in name for name in [directory, *names]):
            return None
        text += [directory, *names]
    try:
        listing = "".join(line + "\n" for line in text).encode("utf-8")
    except UnicodeEncodeError:  # an undecodable name (surrogate escapes)
        return None
    return dirs, hashlib.sha256(listing).hexdigest()


def startup_inputs(dirs: list[str]) -> dict[str, str]:
    """The files that steer where a name is imported from at startup: each .pth and editable finder on sys.path."""
    found = {}
    for directory in dirs:
        for name in os.listdir(directory):
            path = Path(directory) / name
            if (name.endswith(".pth") or name.startswith("__editable__")) and path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def write_cache(path: Path, header: str, result: dict[str, Any], dirs: list[str], listing: str,
                inputs: dict[str, str]) -> None:
    """`header`, then the result and what verifies it (its own sha256, the listing's, each input's as `sha256sum -c`
    reads it), written to a temporary file and renamed over `path`; older caches of the same venv (another tool
    version) go."""
    if any("\\" in name or "\n" in name for name in [*dirs, *inputs]):
        return
    payload = json.dumps(result, sort_keys=True)
    lines = [header, f"P {hashlib.sha256((payload + chr(10)).encode()).hexdigest()}", f"L {listing}",
             *(f"D {d}" for d in dirs), *(f"S {digest}  {name}" for name, digest in sorted(inputs.items())),
             f"J {payload}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(temp, path)
    for other in path.parent.glob("sglang-*.facts"):
        if other != path:
            other.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    cache = Path(argv[2]) if len(argv) == 4 and argv[1] == "--cache" else None
    if len(argv) > 2 and cache is None:
        print(json.dumps({"error": "usage: python3 sglang_options.py [SITE_PACKAGES_DIR | --cache FILE HEADER]"}))
        return 1
    before = path_listing() if cache is not None else None
    inputs: dict[str, str] = {}
    try:
        result = extract(Path(argv[1])) if len(argv) == 2 else extract_installed(inputs)
    except (OSError, ValueError, SyntaxError) as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return 1
    if cache is not None and before is not None and inputs and path_listing() == before:
        try:
            write_cache(cache, argv[3], result, before[0], before[1], {**inputs, **startup_inputs(before[0])})
        except OSError:
            pass  # no cache: the next read runs this script again
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
