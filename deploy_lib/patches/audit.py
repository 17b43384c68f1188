"""Audit: every architecture bound on a patch set's code path, with what it evaluates to on the GPU architectures
the patch set applies to (its meta.yaml's applies_to)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from deploy_lib.patches.spec import AuditFile, PatchSet

_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
        "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_CUDA_ARCH_RE = re.compile(r"__CUDA_ARCH__\s*(>=|<=|==|!=|>|<)\s*(\d+)")
_SM_RE = re.compile(r"\bSM\s*(>=|<=|==|!=|>|<)\s*(\d+)")              # launchers: SM = major * 10 + minor
_MAJORS_RE = re.compile(r"supported_major_versions\s*=\s*\[([^\]]*)\]")
_PY_ARCH_RE = re.compile(r"\b_?is_(?:sm\d+\w*|blackwell\w*|hopper\w*)")
_PY_SM_RE = re.compile(r"sm(\d+)(x?)")                                   # sm90, sm100, sm120; sm12x: any 12.*
_CAPABILITY_RE = re.compile(r"\bget_device_capability\b")
FAMILY_MAJORS = {"hopper": (9,), "blackwell": (10, 11, 12)}               # is_hopper*, is_blackwell*


@dataclass(frozen=True)
class GpuArch:
    """An architecture as patch sets name it: sm120 is compute capability 12.0 (__CUDA_ARCH__ 1200, SM 120)."""

    name: str
    major: int
    minor: int

    @classmethod
    def parse(cls, name: str) -> GpuArch:
        digits = name.removeprefix("sm").rstrip("abcdefghijklmnopqrstuvwxyz")
        return cls(name, int(digits[:-1]), int(digits[-1]))

    def python_check(self, name: str) -> bool:
        """What an is_sm*/is_blackwell*/is_hopper* check evaluates to on this architecture."""
        majors = {int(n) if x else int(n) // 10 for n, x in _PY_SM_RE.findall(name)}
        majors.update(m for family, family_majors in FAMILY_MAJORS.items() if family in name for m in family_majors)
        return self.major in majors

    def line_values(self, line: str, is_python: bool) -> tuple[list[bool | None], bool]:
        """Each architecture comparison on the line evaluated here, and whether the line joins them with `or`."""
        if is_python:
            values: list[bool | None] = [
                str(self.major) in [v.strip() for v in m.group(1).split(",")] for m in _MAJORS_RE.finditer(line)]
            values += [self.python_check(m.group(0)) for m in _PY_ARCH_RE.finditer(line)]
            values += [None for _ in _CAPABILITY_RE.finditer(line)]
            return values, " or " in line
        cuda_arch, sm = self.major * 100 + self.minor * 10, self.major * 10 + self.minor
        values = [_OPS[m.group(1)](cuda_arch, int(m.group(2))) for m in _CUDA_ARCH_RE.finditer(line)]
        values += [_OPS[m.group(1)](sm, int(m.group(2))) for m in _SM_RE.finditer(line)]
        return values, "||" in line

    def evaluate(self, line: str, is_python: bool) -> tuple[bool, bool | None]:
        """(whether the line holds an architecture bound, its value here; None: depends on more than the arch)."""
        values, either = self.line_values(line, is_python)
        if not values:
            return False, None
        return True, None if None in values else (any(values) if either else all(values))


@dataclass(frozen=True)
class ArchBound:
    file: str
    line: int
    text: str
    on: Mapping[str, bool | None]   # architecture -> what the bound evaluates to there (None: depends)

    @property
    def verdict(self) -> str:
        words = {True: "true on {}", False: "FALSE on {}", None: "depends on {}"}
        if len(set(self.on.values())) == 1 and next(iter(self.on.values())) is None:
            return "depends"
        return ", ".join(words[value].format(arch) for arch, value in self.on.items())


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


def audit(patch_set: PatchSet, files: Mapping[str, str]) -> AuditReport:
    """Every architecture bound in the patch set's audited files: `__CUDA_ARCH__` and SM comparisons,
    supported_major_versions lists, is_sm*/is_blackwell*/is_hopper* checks, with file:line, text and its value on
    each architecture the set applies to."""
    gpus = [GpuArch.parse(arch) for arch in patch_set.meta.applies_to]
    bounds: list[ArchBound] = []
    scanned, missing = [], []
    for spec in patch_set.meta.audit:
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
            found = {gpu.name: gpu.evaluate(line, is_python) for gpu in gpus}
            if any(bound for bound, _ in found.values()):
                bounds.append(ArchBound(spec.path, number, line, {arch: value for arch, (_, value) in found.items()}))
    return AuditReport(tuple(scanned), tuple(missing), tuple(bounds))


def audit_paths(patch_set: PatchSet) -> tuple[str, ...]:
    return tuple(spec.path for spec in patch_set.meta.audit)

