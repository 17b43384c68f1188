"""Audit: every architecture bound on a patch set's code path, with what it evaluates to on SM120."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deploy_lib.patches.spec import AuditFile, PatchSet

SM120_CUDA_ARCH = 1200
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
        "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_CUDA_ARCH_RE = re.compile(r"__CUDA_ARCH__\s*(>=|<=|==|!=|>|<)\s*(\d+)")
_SM_RE = re.compile(r"\bSM\s*(>=|<=|==|!=|>|<)\s*(\d+)")              # launchers: SM = major * 10 + minor
_MAJORS_RE = re.compile(r"supported_major_versions\s*=\s*\[([^\]]*)\]")
_PY_ARCH_RE = re.compile(r"\b_?is_(?:sm\d+\w*|blackwell\w*|hopper\w*)")
_CAPABILITY_RE = re.compile(r"\bget_device_capability\b")


@dataclass(frozen=True)
class ArchBound:
    file: str
    line: int
    text: str
    on_sm120: bool | None   # what the comparison evaluates to on SM120 (None: depends on more than the arch)

    @property
    def verdict(self) -> str:
        return {True: "true on sm120", False: "FALSE on sm120", None: "depends"}[self.on_sm120]


@dataclass(frozen=True)
class AuditReport:
    scanned: tuple[str, ...]
    missing: tuple[str, ...]
    bounds: tuple[ArchBound, ...]
    toolkit: str | None = None  # as CheckReport.toolkit
    sources: Mapping[str, str] = field(default_factory=dict)  # as CheckReport.sources

    def summary_lines(self) -> list[str]:
        lines = [f"{name} {where}" for name, where in self.sources.items()]
        lines += [f"{b.file}:{b.line}: [{b.verdict}] {b.text.strip()}" for b in self.bounds]
        lines.append(f"scanned: {', '.join(self.scanned)}")
        if self.missing:
            lines.append(f"not in this install: {', '.join(self.missing)}")
        if self.toolkit:
            lines.append(self.toolkit)
        return lines


def _bound_values(line: str, is_python: bool) -> tuple[list[bool | None], bool]:
    """Each architecture comparison on the line evaluated for SM120, and whether the line joins them with `or`."""
    if is_python:
        values: list[bool | None] = [
            "12" in [v.strip() for v in m.group(1).split(",")] for m in _MAJORS_RE.finditer(line)]
        values += ["sm12" in m.group(0) or "blackwell" in m.group(0) for m in _PY_ARCH_RE.finditer(line)]
        values += [None for _ in _CAPABILITY_RE.finditer(line)]
        return values, " or " in line
    values = [_OPS[m.group(1)](SM120_CUDA_ARCH, int(m.group(2))) for m in _CUDA_ARCH_RE.finditer(line)]
    values += [_OPS[m.group(1)](SM120_CUDA_ARCH // 10, int(m.group(2))) for m in _SM_RE.finditer(line)]
    return values, "||" in line


def _python_lines(text: str, spec: AuditFile) -> tuple[set[int] | None, set[int]]:
    """Lines of a Python file to scan (None: all) and lines to skip (imports name checks, they do not run them)."""
    try:
        nodes = list(ast.walk(ast.parse(text)))
    except SyntaxError:
        return None, set()
    imports = {n for node in nodes if isinstance(node, ast.Import | ast.ImportFrom)
               for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    if not spec.functions and not spec.guards_of:
        return None, imports
    wanted: set[int] = set()
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in spec.functions:
            wanted.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    guarded = {n for n, line in enumerate(text.split("\n"), start=1) if any(g in line for g in spec.guards_of)}
    for node in nodes:
        if isinstance(node, ast.If) and any(node.body[0].lineno <= n <= (node.end_lineno or 0) for n in guarded):
            wanted.update(range(node.test.lineno, (node.test.end_lineno or node.test.lineno) + 1))
    return wanted, imports


def audit(files: Mapping[str, str], scope: Sequence[AuditFile]) -> AuditReport:
    """Every architecture bound in the scoped files: `__CUDA_ARCH__` and SM comparisons, supported_major_versions
    lists, is_sm*/is_blackwell*/is_hopper* checks, with file:line, text and its value on SM120."""
    bounds: list[ArchBound] = []
    scanned, missing = [], []
    for spec in scope:
        text = files.get(spec.path)
        if text is None:
            missing.append(spec.path)
            continue
        scanned.append(spec.path)
        is_python = spec.path.endswith(".py")
        wanted, skipped = _python_lines(text, spec) if is_python else (None, set())
        for number, line in enumerate(text.split("\n"), start=1):
            if (wanted is not None and number not in wanted) or number in skipped:
                continue
            values, either = _bound_values(line, is_python)
            if values:
                value = None if None in values else (any(values) if either else all(values))
                bounds.append(ArchBound(spec.path, number, line, value))
    return AuditReport(tuple(scanned), tuple(missing), tuple(bounds))


def audit_paths(patch_set: PatchSet) -> tuple[str, ...]:
    return tuple(spec.path for spec in patch_set.meta.audit)

