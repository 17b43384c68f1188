"""Patch sets as data: pick the variant for the installed versions, tell the states apart, apply, revert, audit.

A patch set is a directory (roles/<name>/): meta.yaml plus targets/<target>.yaml, each target with variants per
version range that give the file, the exact upstream (gated) text and our (patched) text. Everything here is a pure
function over file texts, so the same code runs on wheels unpacked by the tests and on files read from a host.
A record (JSON) of which targets we changed, with the file's sha256 before and after each, is what tells
`applied` (by us) apart from text someone else put there, and what makes `revert` byte-exact.
"""

from __future__ import annotations

import ast
import base64
import binascii
import difflib
import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.profile import format_validation_error
from deploy_lib.remote import Put, Step, StepResult
from deploy_lib.sglang_options import version_key
from deploy_lib.yaml_io import load_yaml_mapping

SGLANG = "sglang"
FLASHINFER = "flashinfer-python"
Dist = Literal["sglang", "flashinfer-python"]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$")]
Arch = Annotated[str, StringConstraints(pattern=r"^sm[0-9]{2,3}[a-z]?$")]
INSTALLED = "*"  # a warning condition meaning "this distribution is installed, any version"


class PatchConflict(PreflightError):
    """A target file is neither upstream's nor exactly what we wrote (or changed since); nothing was written."""


# ---------------------------------------------------------------------------------------------------------------
# Version ranges: ">=0.5.8.post1,<0.5.16" (one lower and one upper bound at most, or "==V"), compared by version_key.
# ---------------------------------------------------------------------------------------------------------------

_CLAUSE_RE = re.compile(r"^\s*(>=|<=|==|>|<)\s*([0-9][0-9A-Za-z.]*)\s*$")
Bound = tuple[tuple, bool]  # (version key, inclusive)


@dataclass(frozen=True)
class VersionRange:
    text: str
    lower: Bound | None
    upper: Bound | None

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        lower: Bound | None = None
        upper: Bound | None = None
        for clause in text.split(","):
            match = _CLAUSE_RE.match(clause)
            if match is None:
                raise ValueError(f"{clause.strip()!r} in {text!r} is not a bound; write e.g. '>=0.5.8.post1,<0.5.16'")
            operator, version = match.groups()
            key = version_key(version)
            if operator in (">=", ">", "=="):
                if lower is not None:
                    raise ValueError(f"{text!r} has two lower bounds")
                lower = (key, operator != ">")
            if operator in ("<=", "<", "=="):
                if upper is not None:
                    raise ValueError(f"{text!r} has two upper bounds")
                upper = (key, operator != "<")
        if _empty(lower, upper):
            raise ValueError(f"{text!r} contains no version")
        return cls(text, lower, upper)

    def contains(self, version: str) -> bool:
        key = version_key(version)
        above = self.lower is None or key > self.lower[0] or (key == self.lower[0] and self.lower[1])
        below = self.upper is None or key < self.upper[0] or (key == self.upper[0] and self.upper[1])
        if below and self.upper is not None and not self.upper[1] and key[0] == self.upper[0][0]:
            below = not _is_prerelease(key)  # PEP 440: "<0.5.16" admits no 0.5.16rc1
        return above and below

    def overlaps(self, other: VersionRange) -> bool:
        lowers = [b for b in (self.lower, other.lower) if b is not None]
        uppers = [b for b in (self.upper, other.upper) if b is not None]
        # the tighter bound wins; at equal keys an exclusive bound is the tighter one
        lower = max(lowers, key=lambda b: (b[0], not b[1])) if lowers else None
        upper = min(uppers, key=lambda b: (b[0], b[1])) if uppers else None
        return not _empty(lower, upper)


def _is_prerelease(key: tuple) -> bool:
    final = version_key("0")
    return key[1] != final[1] or key[3] != final[3]


def _empty(lower: Bound | None, upper: Bound | None) -> bool:
    if lower is None or upper is None:
        return False
    return lower[0] > upper[0] or (lower[0] == upper[0] and not (lower[1] and upper[1]))


def _ranges(versions: str | list[str]) -> tuple[VersionRange, ...]:
    return tuple(VersionRange.parse(text) for text in ([versions] if isinstance(versions, str) else versions))


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or str(path) != value or not value:
        raise ValueError(f"{value!r} must be a normalised path relative to site-packages, e.g. sglang/srt/x.py")
    return value


# ---------------------------------------------------------------------------------------------------------------
# The patch-set files, as pydantic models.
# ---------------------------------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Edit(_Model):
    gated: str = Field(description="exact upstream text, whole lines, with enough context to be unique")
    patched: str = Field(description="exact text that replaces it")
    count: int = Field(1, ge=1, description="how many times the gated text occurs (all are replaced)")

    @field_validator("gated", "patched")
    @classmethod
    def _whole_lines(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty")
        if not value.endswith("\n"):
            raise ValueError("text must be whole lines ending in a newline (a YAML `|` block)")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> Edit:
        if self.gated in self.patched or self.patched in self.gated:
            raise ValueError("gated and patched text contain one another, so the states cannot be told apart: "
                             "include an unchanged line after the change in both")
        return self


class VariantSpec(_Model):
    versions: str | list[str] = Field(description="version range(s) of the target's package, e.g. '>=0.5.20,<0.5.21'")
    file: str | None = Field(None, description="path relative to site-packages")
    edits: list[Edit] = Field(default_factory=list)
    native_when: str | None = Field(None, description="text whose presence means upstream already supports it")
    not_in_version: str | None = Field(None, description="why this target does not exist in these versions")

    @field_validator("versions")
    @classmethod
    def _parse_versions(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("give at least one version range")
        _ranges(value)
        return value

    @field_validator("file")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        return None if value is None else _relative_path(value)

    @field_validator("native_when", "not_in_version")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("text is empty")
        return value

    @model_validator(mode="after")
    def _shape(self) -> VariantSpec:
        if self.not_in_version is not None:
            if self.file or self.edits or self.native_when:
                raise ValueError("not_in_version excludes file, edits and native_when")
        elif self.file is None:
            raise ValueError("file is required (or not_in_version, saying why the target does not exist)")
        elif not self.edits and self.native_when is None:
            raise ValueError("give edits, native_when, or both")
        return self

    @property
    def ranges(self) -> tuple[VersionRange, ...]:
        return _ranges(self.versions)


class TargetSpec(_Model):
    description: str
    package: Dist
    variants: list[VariantSpec] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _no_overlap(cls, variants: list[VariantSpec]) -> list[VariantSpec]:
        owned = [(i, r) for i, variant in enumerate(variants) for r in variant.ranges]
        for pos, (i, first) in enumerate(owned):
            for j, second in owned[pos + 1:]:
                if first.overlaps(second):
                    raise ValueError(f"versions of variants {i} ({first.text!r}) and {j} ({second.text!r}) overlap")
        return variants


class WarningSpec(_Model):
    when: dict[str, str] = Field(description=f"distribution -> version range or {INSTALLED!r}; empty: always")
    text: str = Field(description="{distribution} is replaced by its installed version")

    @field_validator("when")
    @classmethod
    def _conditions(cls, value: dict[str, str]) -> dict[str, str]:
        for spec in value.values():
            if spec != INSTALLED:
                VersionRange.parse(spec)
        return value


class JitCacheSpec(_Model):
    dist: Dist
    modules: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+$")]] = Field(min_length=1)


class AuditFile(_Model):
    path: str
    functions: list[str] = Field(default_factory=list, description="scan only these functions (Python)")
    guards_of: list[str] = Field(default_factory=list,
                                 description="scan only the `if` conditions around lines containing these (Python)")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _relative_path(value)


class MetaSpec(_Model):
    name: Name
    description: str
    applies_to: list[Arch] = Field(min_length=1)
    single_node_only: bool
    targets: list[Name] = Field(min_length=1)
    warnings: list[WarningSpec] = Field(default_factory=list)
    jit_cache: JitCacheSpec | None = None
    audit: list[AuditFile] = Field(default_factory=list)
    # the profile feature a release on the patched venv turns on (`features.<name>: true`)
    enables_feature: Literal["allreduce_fusion"] | None = None

    @field_validator("targets")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"listed twice: {', '.join(twice)}")
        return value


@dataclass(frozen=True)
class PatchSet:
    meta: MetaSpec
    targets: Mapping[str, TargetSpec]  # in the order of meta.targets
    directory: Path

    @property
    def name(self) -> str:
        return self.meta.name


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], path: Path) -> _M:
    try:
        return model.model_validate(load_yaml_mapping(path))
    except ValidationError as err:
        raise ConfigError(format_validation_error(str(path), err)) from None


def load_patch_set(path: Path) -> PatchSet:
    """Load roles/<name>/ (or its meta.yaml) and every targets/<target>.yaml; ConfigError names file and key."""
    meta_path = path / "meta.yaml" if path.is_dir() else path
    meta = _validated(MetaSpec, meta_path)
    targets: dict[str, TargetSpec] = {}
    for name in meta.targets:
        target_path = meta_path.parent / "targets" / f"{name}.yaml"
        if not target_path.is_file():
            raise ConfigError(f"{meta_path}: targets: {name!r} has no file {target_path}")
        targets[name] = _validated(TargetSpec, target_path)
    return PatchSet(meta=meta, targets=targets, directory=meta_path.parent)


def list_patch_sets(roles_dir: Path) -> list[PatchSet]:
    """Every patch set under roles/ (a role with a meta.yaml), by name."""
    return sorted((load_patch_set(meta.parent) for meta in roles_dir.glob("*/meta.yaml")), key=lambda p: p.name)


def find_patch_set(roles_dir: Path, name: str) -> PatchSet:
    known = list_patch_sets(roles_dir)
    found = next((patch_set for patch_set in known if patch_set.name == name), None)
    if found is None:
        raise ConfigError(f"no patch set named {name!r} under {roles_dir}",
                          hint=f"patch sets: {', '.join(p.name for p in known) or 'none'}")
    return found


# ---------------------------------------------------------------------------------------------------------------
# Selecting the variant for the installed versions; refusals.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """The variant of one target that the installed version of its package selected."""

    target: str
    package: str
    version: str
    spec: VariantSpec

    @property
    def file(self) -> str | None:
        return self.spec.file


def select_variants(patch_set: PatchSet, sglang_version: str | None,
                    flashinfer_version: str | None) -> dict[str, Variant]:
    """Per target the variant for these versions; ConfigError listing the known ranges of any that has none."""
    installed = {SGLANG: sglang_version, FLASHINFER: flashinfer_version}
    selected: dict[str, Variant] = {}
    problems: list[str] = []
    for name, target in patch_set.targets.items():
        version = installed[target.package]
        if version is None:
            problems.append(f"{name}: {target.package} is not installed")
            continue
        match = next((v for v in target.variants if any(r.contains(version) for r in v.ranges)), None)
        if match is None:
            known = "; ".join(r.text for v in target.variants for r in v.ranges)
            problems.append(f"{name}: no variant for {target.package} {version} (known: {known})")
            continue
        selected[name] = Variant(target=name, package=target.package, version=version, spec=match)
    if problems:
        raise ConfigError(f"patch set {patch_set.name} does not cover these versions:\n  " + "\n  ".join(problems),
                          hint="read the gates in the new version's files (each target names its file) and add "
                               f"a variant under {patch_set.directory / 'targets'}")
    return selected


def refuse_unless_applicable(patch_set: PatchSet, gpu_arch: str, nnodes: int) -> None:
    """ConfigError for a multi-node profile of a single-node patch set; PreflightError for another GPU."""
    if patch_set.meta.single_node_only and nnodes > 1:
        raise ConfigError(f"{patch_set.name} is single-node only (the TRT-LLM fusion exchanges buffers over CUDA "
                          f"IPC) but the profile runs on {nnodes} nodes",
                          hint="deploy multi-node profiles without allreduce fusion")
    if gpu_arch not in patch_set.meta.applies_to:
        raise PreflightError(f"the GPUs are {gpu_arch}: {patch_set.name} is for {', '.join(patch_set.meta.applies_to)}"
                             ", so there is nothing to patch",
                             hint="SM90/SM100 run the fusion upstream: enable it in the profile without patches")


def active_warnings(patch_set: PatchSet, versions: Mapping[str, str]) -> tuple[str, ...]:
    """The patch set's warnings whose conditions the installed distributions meet, versions filled in."""
    def holds(dist: str, spec: str) -> bool:
        return dist in versions and (spec == INSTALLED or VersionRange.parse(spec).contains(versions[dist]))

    texts = []
    for warning in patch_set.meta.warnings:
        if all(holds(dist, spec) for dist, spec in warning.when.items()):
            text = warning.text
            for dist, version in versions.items():
                text = text.replace(f"{{{dist}}}", version)
            texts.append(text)
    return tuple(texts)


# ---------------------------------------------------------------------------------------------------------------
# States, apply and revert of one target.
# ---------------------------------------------------------------------------------------------------------------


class State(StrEnum):
    ABSENT = "absent"                   # the upstream gated text is there
    APPLIED = "applied"                 # our text is there and the record says we put it there
    NATIVE = "native"                   # upstream already supports it: nothing to do, ever
    CONFLICT = "conflict"               # neither: refuse
    NOT_IN_VERSION = "not-in-version"   # this version has no such gate


class RecordStep(_Model):
    target: str
    file: str
    sha256_before: str
    sha256_after: str


class PatchRecord(_Model):
    """What we changed: per target, the file's sha256 before and after, in the order applied."""

    format: Literal[1] = 1
    patch_set: str
    versions: dict[str, str]
    steps: list[RecordStep] = Field(default_factory=list)
    base_venv: str | None = None  # the managed venv this patched venv was derived from

    def step_for(self, target: str) -> RecordStep | None:
        return next((s for s in self.steps if s.target == target), None)

    def final_sha256(self, file: str) -> str | None:
        return next((s.sha256_after for s in reversed(self.steps) if s.file == file), None)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.file for s in self.steps))

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> PatchRecord:
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            raise ConfigError(format_validation_error(source, err)) from None


@dataclass(frozen=True)
class TargetReport:
    target: str
    state: State
    file: str | None
    lines: tuple[int, ...] = ()   # 1-based: the gate (absent), our text (applied), upstream's text (native)
    detail: str = ""              # for a conflict: why, and the lines found where the gate should be

    @property
    def location(self) -> str:
        if self.file is None:
            return "-"
        return f"{self.file}:{_runs(self.lines)}" if self.lines else self.file


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _starts(text: str, block: str) -> list[int]:
    """Offsets where block occurs starting at the beginning of a line (occurrences do not overlap)."""
    found, at = [], text.find(block)
    while at >= 0:
        if at == 0 or text[at - 1] == "\n":
            found.append(at)
            at = text.find(block, at + len(block))
        else:
            at = text.find(block, at + 1)
    return found


def _replace(text: str, old: str, new: str) -> str:
    pieces, last = [], 0
    for at in _starts(text, old):
        pieces += [text[last:at], new]
        last = at + len(old)
    return "".join(pieces) + text[last:]


def _changed_offsets(block: str, other: str) -> list[int]:
    """0-based lines of block that turning it into other replaces or deletes; for an insertion, the line before."""
    offsets: list[int] = []
    matcher = difflib.SequenceMatcher(None, block.split("\n"), other.split("\n"), autojunk=False)
    for operation, first, last, _, _ in matcher.get_opcodes():
        if operation in ("replace", "delete"):
            offsets += range(first, last)
        elif operation == "insert":
            offsets.append(max(first - 1, 0))
    return offsets


def _lines_at(text: str, block: str, other: str) -> list[int]:
    """1-based lines of the file, at every occurrence of block, that differ from other."""
    offsets = _changed_offsets(block, other)
    return [text.count("\n", 0, at) + 1 + offset for at in _starts(text, block) for offset in offsets]


def _runs(numbers: Sequence[int]) -> str:
    """1,2,3,7 -> '1-3,7'."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _excerpt(text: str, block: str, context: int = 2) -> str:
    """The file's lines around where block should be: found by the longest of block's lines present in the file."""
    lines, wanted = text.split("\n"), block.rstrip("\n").split("\n")
    for index, line in sorted(enumerate(wanted), key=lambda pair: -len(pair[1].strip())):
        if len(line.strip()) < 8:
            break
        if line in lines:
            start = max(lines.index(line) - index - context, 0)
            stop = min(lines.index(line) - index + len(wanted) + context, len(lines))
            return "\n".join(f"  {n + 1:>6}  {lines[n]}" for n in range(start, stop))
    return "  (none of its lines is in the file)"


def target_state(variant: Variant, file_text: str | None, record: PatchRecord | None) -> TargetReport:
    """Which state the target is in, with the lines that show it."""
    spec, name = variant.spec, variant.target
    if spec.not_in_version is not None:
        return TargetReport(name, State.NOT_IN_VERSION, None, detail=spec.not_in_version)
    assert spec.file is not None
    if file_text is None:
        return TargetReport(name, State.CONFLICT, spec.file, detail=f"{spec.file} is not in this install")
    gated = [len(_starts(file_text, e.gated)) for e in spec.edits]
    patched = [len(_starts(file_text, e.patched)) for e in spec.edits]
    step = record.step_for(name) if record else None
    recorded_sha256 = record.final_sha256(spec.file) if record else None
    counts_right = [e.count for e in spec.edits]
    if spec.edits and step and patched == counts_right and not any(gated) and sha256_text(file_text) == recorded_sha256:
        lines = [n for e in spec.edits for n in _lines_at(file_text, e.patched, e.gated)]
        return TargetReport(name, State.APPLIED, spec.file, tuple(sorted(lines)))
    if spec.edits and gated == counts_right and not any(patched):
        lines = [n for e in spec.edits for n in _lines_at(file_text, e.gated, e.patched)]
        return TargetReport(name, State.ABSENT, spec.file, tuple(sorted(lines)))
    if spec.native_when is not None and _starts(file_text, spec.native_when):
        lines = [file_text.count("\n", 0, at) + 1 for at in _starts(file_text, spec.native_when)]
        return TargetReport(name, State.NATIVE, spec.file, tuple(lines))
    return TargetReport(name, State.CONFLICT, spec.file, detail=_why_conflict(variant, file_text, step, record))


def _why_conflict(variant: Variant, text: str, step: RecordStep | None, record: PatchRecord | None) -> str:
    spec = variant.spec
    if step is not None and record is not None:
        return (f"sglang-deploy patched {spec.file} (sha256 {record.final_sha256(step.file)}) but it has changed "
                f"since (sha256 {sha256_text(text)})")
    if spec.edits and all(len(_starts(text, e.patched)) == e.count for e in spec.edits):
        return (f"our patched text is in {spec.file} but no record says sglang-deploy wrote it (edited by hand?); "
                f"reinstall {variant.package} {variant.version} to get upstream's file back")
    parts = []
    for number, edit in enumerate(spec.edits, start=1):
        found = len(_starts(text, edit.gated))
        if found != edit.count:
            parts.append(f"edit {number}: expected the gated text {edit.count} time(s), found it {found} time(s); "
                         f"lines around where it should be:\n{_excerpt(text, edit.gated)}")
    if not parts and spec.native_when is not None:
        parts.append(f"neither the gated text nor upstream's SM120 text is there; lines around where upstream's "
                     f"should be:\n{_excerpt(text, spec.native_when)}")
    if not parts:
        parts.append("the gated and the patched text are both partly there")
    return "\n".join(parts)


def apply(variant: Variant, text: str) -> str:
    """The file text with the target patched; PatchConflict unless the target is absent."""
    report = target_state(variant, text, None)
    if report.state is not State.ABSENT:
        raise PatchConflict(f"{variant.file}: {variant.target} is {report.state.value}, not absent; nothing written"
                            + (f"\n{report.detail}" if report.detail else ""))
    for edit in variant.spec.edits:
        text = _replace(text, edit.gated, edit.patched)
    if any(len(_starts(text, e.patched)) != e.count for e in variant.spec.edits):
        raise ConfigError(f"{variant.target}: the edits of the variant for {variant.package} {variant.version} "
                          "overlap one another, so they could not be reverted exactly")
    return text


def revert(variant: Variant, text: str, original_sha256: str) -> str:
    """The file text as it was before `apply` (sha256 checked); a file upstream fixed is never given gated text."""
    if sha256_text(text) == original_sha256:
        return text
    edits = variant.spec.edits
    if not edits:
        raise PatchConflict(f"{variant.file}: {variant.target} is native upstream, there is nothing of ours to "
                            "revert, and the file differs from the recorded original; nothing written")
    for edit in reversed(edits):
        found = len(_starts(text, edit.patched))
        if found != edit.count:
            raise PatchConflict(f"{variant.file}: {variant.target}: our text is there {found} time(s), expected "
                                f"{edit.count}; nothing written")
        text = _replace(text, edit.patched, edit.gated)
    if sha256_text(text) != original_sha256:
        raise PatchConflict(f"{variant.file}: reverting {variant.target} would not restore the recorded original "
                            f"(sha256 {original_sha256}); nothing written")
    return text


# ---------------------------------------------------------------------------------------------------------------
# Whole patch set: check (dry run), enable, disable.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckReport:
    patch_set: str
    versions: Mapping[str, str]
    variants: Mapping[str, Variant]
    targets: tuple[TargetReport, ...]
    warnings: tuple[str, ...]
    toolkit: str | None = None  # the CUDA toolkit and FlashInfer's verdict on it (deploy_lib/cuda_toolkit.py)
    sources: Mapping[str, str] = field(default_factory=dict)  # distribution -> e.g. "editable: /root/sglang/python"

    @property
    def conflicts(self) -> tuple[TargetReport, ...]:
        return tuple(t for t in self.targets if t.state is State.CONFLICT)

    def summary_lines(self) -> list[str]:
        """One line per target (name, state, file:lines), conflicts followed by their detail."""
        lines = [f"{name} {where}" for name, where in self.sources.items()]
        for report in self.targets:
            lines.append(f"{report.target:<22} {report.state.value:<15} {report.location}")
            if report.state in (State.CONFLICT, State.NOT_IN_VERSION):
                lines += [f"    {line}" for line in report.detail.splitlines()]
        if self.toolkit:
            lines.append(self.toolkit)
        return lines


def files_needed(patch_set: PatchSet, sglang_version: str | None, flashinfer_version: str | None) -> tuple[str, ...]:
    """Paths (relative to site-packages) that check/enable/disable read for these versions."""
    variants = select_variants(patch_set, sglang_version, flashinfer_version)
    return tuple(dict.fromkeys(v.file for v in variants.values() if v.file is not None))


def check(patch_set: PatchSet, files: Mapping[str, str], versions: Mapping[str, str], *, gpu_arch: str,
          nnodes: int = 1, record: PatchRecord | None = None) -> CheckReport:
    """Dry run: every target's state with file and line, and the warnings; nothing is changed.

    files maps paths relative to site-packages to their text; versions maps distribution names (sglang,
    flashinfer-python, flashinfer-jit-cache, ...) to the installed versions.
    """
    refuse_unless_applicable(patch_set, gpu_arch, nnodes)
    variants = select_variants(patch_set, versions.get(SGLANG), versions.get(FLASHINFER))
    reports = tuple(target_state(v, files.get(v.file) if v.file else None, record) for v in variants.values())
    return CheckReport(patch_set.name, dict(versions), variants, reports, active_warnings(patch_set, versions))


@dataclass(frozen=True)
class Enabled:
    files: Mapping[str, str]   # only the files that change, with their patched text
    record: PatchRecord
    report: CheckReport        # the dry run it was computed from


def enable(patch_set: PatchSet, files: Mapping[str, str], versions: Mapping[str, str], *, gpu_arch: str,
           nnodes: int = 1) -> Enabled:
    """The patched text of every absent target's file and the record; PatchConflict (naming all) if any conflict."""
    report = check(patch_set, files, versions, gpu_arch=gpu_arch, nnodes=nnodes)
    if report.conflicts:
        raise PatchConflict("nothing written: these targets are in neither the upstream nor the patched state:\n"
                            + "\n".join(report.summary_lines()),
                            hint="reinstall the packages to get upstream's files back, then run the check again")
    changed: dict[str, str] = {}
    steps = []
    for target in report.targets:
        if target.state is State.ABSENT:
            variant = report.variants[target.target]
            path = variant.file
            assert path is not None
            before = changed.get(path, files[path])
            changed[path] = apply(variant, before)
            steps.append(RecordStep(target=target.target, file=path, sha256_before=sha256_text(before),
                                    sha256_after=sha256_text(changed[path])))
    record = PatchRecord(patch_set=patch_set.name, versions=dict(report.versions), steps=steps)
    return Enabled(files=changed, record=record, report=report)


def disable(patch_set: PatchSet, files: Mapping[str, str], record: PatchRecord) -> dict[str, str]:
    """The original text of every file the record says we changed (sha256-verified); other files are not touched."""
    variants = select_variants(patch_set, record.versions.get(SGLANG), record.versions.get(FLASHINFER))
    changed: dict[str, str] = {}
    for path in record.files:
        text = files.get(path)
        if text is None or sha256_text(text) != record.final_sha256(path):
            now = "missing" if text is None else f"sha256 {sha256_text(text)}"
            raise PatchConflict(f"{path} is not what sglang-deploy wrote (expected sha256 "
                                f"{record.final_sha256(path)}, found {now}); nothing written")
        changed[path] = text
    for step in reversed(record.steps):
        changed[step.file] = revert(variants[step.target], changed[step.file], step.sha256_before)
    return changed


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer JIT cache (flashinfer/jit/env.py): <base>/.cache/flashinfer/<version>/<archs>/cached_ops/<module>.
# ---------------------------------------------------------------------------------------------------------------


def jit_cache_dirs(patch_set: PatchSet, workspace_base: PurePosixPath, versions: Mapping[str, str]) -> tuple[str, ...]:
    """Glob patterns of the JIT-built modules the patch set invalidates ($FLASHINFER_WORKSPACE_BASE = base)."""
    spec = patch_set.meta.jit_cache
    if spec is None or spec.dist not in versions:
        return ()
    root = workspace_base / ".cache" / "flashinfer" / versions[spec.dist]
    return tuple(f"{root}/*/cached_ops/{module}" for module in spec.modules)


def clear_jit_cache_steps(patch_set: PatchSet, workspace_base: PurePosixPath, versions: Mapping[str, str],
                          sudo: bool = False) -> list[Step]:
    """Remote steps deleting those modules; a cache that was never built is not an error."""
    steps = []
    for pattern in jit_cache_dirs(patch_set, workspace_base, versions):
        root, _, tail = pattern.partition("/*/")
        steps.append(Step(
            name=f"clear FlashInfer JIT cache ({tail.rsplit('/', 1)[-1]})",
            argv=("find", root, "-mindepth", "3", "-maxdepth", "3", "-type", "d", "-path", f"{root}/*/{tail}",
                  "-prune", "-exec", "rm", "-rf", "--", "{}", "+"),
            sudo=sudo,
            ok=frozenset({0, 1}),  # find exits 1 when the version's cache directory does not exist yet
        ))
    return steps


# ---------------------------------------------------------------------------------------------------------------
# Audit: every architecture bound on the fusion path, with what it evaluates to on SM120.
# ---------------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------------
# Files on a host: read byte-exact (base64, so no transport can touch newlines) and written as new files.
# ---------------------------------------------------------------------------------------------------------------

RECORD_FILE = "sglang-deploy-patches.json"  # kept in the patched venv, beside bin/


def read_steps(locations: Mapping[str, PurePosixPath]) -> list[Step]:
    """One read-only step per path (relative to site-packages -> where it is on the host, e.g. in an editable
    install's checkout); a path that is not there is a fact (exit 1), not a failure."""
    return [Step(name=f"read {path}", argv=("base64", "-w", "0", "--", str(location)), sudo=True,
                 ok=frozenset({0, 1}), timeout_s=30) for path, location in locations.items()]


def top_level_packages(patch_set: PatchSet) -> tuple[str, ...]:
    """The import packages whose files the patch set reads (sglang, flashinfer): where each is gets looked up."""
    paths = [v.file for t in patch_set.targets.values() for v in t.variants if v.file] + list(audit_paths(patch_set))
    return tuple(sorted({path.split("/", 1)[0] for path in paths}))


def files_from_results(paths: Sequence[str], results: Sequence[StepResult]) -> dict[str, str]:
    """The texts that read_steps(paths) returned, keyed by path; missing files are left out."""
    files = {}
    for path, result in zip(paths, results, strict=True):
        if result.exit_code != 0:
            continue
        try:
            files[path] = base64.b64decode(result.stdout.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as err:
            raise PatchConflict(f"{path}: cannot read it as UTF-8 text ({err}); nothing written") from None
    return files


def write_puts(site_packages: PurePosixPath, enabled: Enabled, record_dir: PurePosixPath,
               sudo: bool = False) -> list[Put]:
    """The patched files, each written as a new file (never through a hard link), then the record."""
    puts = [Put(dest=site_packages / path, data=text.encode("utf-8"), mode=0o644, sudo=sudo)
            for path, text in enabled.files.items()]
    return [*puts, Put(dest=record_dir / RECORD_FILE, data=enabled.record.to_json().encode(), mode=0o644, sudo=sudo)]


def read_site_packages(site_packages: Path, paths: Collection[str]) -> dict[str, str]:
    """The text of those paths under a local site-packages directory (bytes kept exactly); absent ones left out."""
    return {p: (site_packages / p).read_bytes().decode("utf-8") for p in paths if (site_packages / p).is_file()}
