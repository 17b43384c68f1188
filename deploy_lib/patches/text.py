"""One target's text: which state it is in, apply, revert, and the record of what we changed.

A record (JSON) of which targets we changed, with the file's sha256 before and after each, is what tells `applied`
(by us) apart from text someone else put there, and what makes `revert` byte-exact.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import Field, ValidationError

from deploy_lib.digests import sha256_text
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.patches.spec import FrozenModel
from deploy_lib.patches.variants import Variant
from deploy_lib.profile import format_validation_error


class PatchConflict(PreflightError):
    """A target file is neither upstream's nor exactly what we wrote (or changed since); nothing was written."""


class State(StrEnum):
    ABSENT = "absent"                   # the upstream gated text is there
    APPLIED = "applied"                 # our text is there and the record says we put it there
    NATIVE = "native"                   # upstream already supports it: nothing to do, ever
    CONFLICT = "conflict"               # neither: refuse
    NOT_IN_VERSION = "not-in-version"   # this version has no such gate


class RecordStep(FrozenModel):
    target: str
    file: str
    sha256_before: str
    sha256_after: str


class PatchRecord(FrozenModel):
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

