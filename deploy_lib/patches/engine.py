"""A whole patch set over file texts: refusals, warnings, check (the dry run), enable and disable.

Pure functions: the same code runs on wheels unpacked by the tests and on files read from a host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.patches.spec import INSTALLED, PatchSet
from deploy_lib.patches.text import (
    PatchConflict,
    PatchRecord,
    RecordStep,
    State,
    TargetReport,
    apply,
    revert,
    sha256_text,
    target_state,
)
from deploy_lib.patches.variants import Variant, select_variants
from deploy_lib.patches.versions import VersionRange


def refuse_unless_applicable(patch_set: PatchSet, gpu_arch: str, nnodes: int) -> None:
    """ConfigError for a multi-node profile of a single-node patch set; PreflightError for another GPU."""
    meta = patch_set.meta
    if meta.single_node_only and nnodes > 1:
        raise ConfigError(f"{patch_set.name} is single-node only ({meta.single_node_only}) but the profile runs on "
                          f"{nnodes} nodes", hint=f"deploy multi-node profiles without {patch_set.name}")
    if meta.applies_to and gpu_arch not in meta.applies_to:
        raise PreflightError(f"the GPUs are {gpu_arch}: {patch_set.name} is for {', '.join(meta.applies_to)}, so "
                             "there is nothing to patch", hint=meta.other_gpus)


def refuse_another_sets_record(patch_set: PatchSet, record: PatchRecord | None) -> None:
    """PreflightError when the venv was patched by another patch set: one patch set per venv, since the patched venv
    derives from the unpatched one, and disabling one set must not take another's patches away."""
    if record is not None and record.patch_set != patch_set.name:
        raise PreflightError(f"the venv is patched by {record.patch_set}, not {patch_set.name}; a venv carries one "
                             "patch set", hint=f"`invoke patches.disable {record.patch_set}` first")


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


@dataclass(frozen=True)
class CheckReport:
    patch_set: str
    versions: Mapping[str, str]
    variants: Mapping[str, Variant]
    targets: tuple[TargetReport, ...]
    warnings: tuple[str, ...]
    toolkit: str | None = None  # the CUDA toolkit and FlashInfer's verdict on it (deploy_lib/facts/cuda_toolkit.py)
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


def check(patch_set: PatchSet, files: Mapping[str, str], versions: Mapping[str, str], *, gpu_arch: str,
          nnodes: int = 1, record: PatchRecord | None = None) -> CheckReport:
    """Dry run: every target's state with file and line, and the warnings; nothing is changed.

    files maps paths relative to site-packages to their text; versions maps distribution names (sglang,
    flashinfer-python, flashinfer-jit-cache, ...) to the installed versions.
    """
    refuse_unless_applicable(patch_set, gpu_arch, nnodes)
    refuse_another_sets_record(patch_set, record)
    variants = select_variants(patch_set, versions)
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
    variants = select_variants(patch_set, record.versions)
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
