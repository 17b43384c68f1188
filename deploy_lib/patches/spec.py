"""The patch-set files as pydantic models: roles/<name>/meta.yaml and targets/<target>.yaml, loaded and validated
with errors that name the file and the key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.patches.versions import VersionRange, parse_ranges
from deploy_lib.profile import FeatureSpec, format_validation_error
from deploy_lib.yaml_io import load_yaml_mapping

FLASHINFER = "flashinfer-python"  # its JIT cache (flashinfer/jit/env.py) is the one JIT cache layout known here
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$")]
Dist = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]  # a distribution, e.g. sglang
Arch = Annotated[str, StringConstraints(pattern=r"^sm[0-9]{2,3}[a-z]?$")]
INSTALLED = "*"  # a warning condition meaning "this distribution is installed, any version"


def _relative_path(value: str) -> str:
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or str(path) != value or not value:
        raise ValueError(f"{value!r} must be a normalised path relative to site-packages, e.g. sglang/srt/x.py")
    return value


class FrozenModel(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


class Edit(FrozenModel):
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


class VariantSpec(FrozenModel):
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
        parse_ranges(value)
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
        return parse_ranges(self.versions)


class TargetSpec(FrozenModel):
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


class WarningSpec(FrozenModel):
    when: dict[str, str] = Field(description=f"distribution -> version range or {INSTALLED!r}; empty: always")
    text: str = Field(description="{distribution} is replaced by its installed version")

    @field_validator("when")
    @classmethod
    def _conditions(cls, value: dict[str, str]) -> dict[str, str]:
        for spec in value.values():
            if spec != INSTALLED:
                VersionRange.parse(spec)
        return value


class JitCacheSpec(FrozenModel):
    dist: Literal["flashinfer-python"]  # FLASHINFER
    modules: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+$")]] = Field(min_length=1)


class AuditFile(FrozenModel):
    path: str
    functions: list[str] = Field(default_factory=list, description="scan only these functions (Python)")
    guards_of: list[str] = Field(default_factory=list,
                                 description="scan only the `if` conditions around lines containing these (Python)")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _relative_path(value)


def _twice(values: list[str]) -> list[str]:
    twice = sorted({value for value in values if values.count(value) > 1})
    if twice:
        raise ValueError(f"listed twice: {', '.join(twice)}")
    return values


class MetaSpec(FrozenModel):
    name: Name
    description: str
    packages: list[Dist] = Field(min_length=1, description="distributions whose installed versions select the "
                                                           "targets' variants (each target names one)")
    applies_to: list[Arch] = Field(default_factory=list, description="GPU architectures; empty: every GPU")
    other_gpus: str | None = Field(None, description="the hint when the GPUs are not in applies_to")
    single_node_only: str | None = Field(None, description="why the patched code runs on one node only")
    targets: list[Name] = Field(min_length=1)
    warnings: list[WarningSpec] = Field(default_factory=list)
    jit_cache: JitCacheSpec | None = Field(None, description="JIT-built modules the patch invalidates; FlashInfer "
                                                             "must then be able to build them for the GPU")
    audit: list[AuditFile] = Field(default_factory=list, description="files whose architecture bounds `audit` "
                                                                     "evaluates for applies_to")
    enables_feature: str | None = Field(None, description="the profile feature a release on the patched venv "
                                                          "turns on (`features.<name>: true`)")

    _unique = field_validator("targets", "packages", "applies_to")(_twice)

    @field_validator("enables_feature")
    @classmethod
    def _feature(cls, value: str | None) -> str | None:
        switches = [name for name, field in FeatureSpec.model_fields.items() if field.annotation is bool]
        if value is not None and value not in switches:
            raise ValueError(f"{value!r} is not a profile feature; features: {', '.join(switches)}")
        return value

    @model_validator(mode="after")
    def _audited_arch(self) -> MetaSpec:
        if self.audit and not self.applies_to:
            raise ValueError("audit evaluates architecture bounds for applies_to: name the architectures")
        return self


class Origin(StrEnum):
    """Where a patch set comes from: the tool's own (roles/, in the package) or the user's project (patches/)."""

    BUNDLED = "bundled"
    PROJECT = "project"


@dataclass(frozen=True)
class PatchSet:
    meta: MetaSpec
    targets: Mapping[str, TargetSpec]  # in the order of meta.targets
    directory: Path
    origin: Origin = Origin.BUNDLED

    @property
    def name(self) -> str:
        return self.meta.name


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], path: Path) -> _M:
    try:
        return model.model_validate(load_yaml_mapping(path))
    except ValidationError as err:
        raise ConfigError(format_validation_error(str(path), err, model)) from None


def load_patch_set(path: Path, origin: Origin = Origin.BUNDLED) -> PatchSet:
    """Load roles/<name>/ (or its meta.yaml) and every targets/<target>.yaml; ConfigError names file and key."""
    meta_path = path / "meta.yaml" if path.is_dir() else path
    meta = _validated(MetaSpec, meta_path)
    targets: dict[str, TargetSpec] = {}
    for name in meta.targets:
        target_path = meta_path.parent / "targets" / f"{name}.yaml"
        if not target_path.is_file():
            raise ConfigError(f"{meta_path}: targets: {name!r} has no file {target_path}")
        targets[name] = _validated(TargetSpec, target_path)
        if targets[name].package not in meta.packages:
            raise ConfigError(f"{target_path}: package: {targets[name].package!r} is not one of the packages in "
                              f"{meta_path} ({', '.join(meta.packages)})")
    return PatchSet(meta=meta, targets=targets, directory=meta_path.parent, origin=origin)


def _project_sets(project_dir: Path) -> list[PatchSet]:
    """The project's patch sets: every folder of project_dir is one (a folder without meta.yaml is refused)."""
    if not project_dir.is_dir():
        return []
    folders = sorted(path for path in project_dir.iterdir() if path.is_dir() and not path.name.startswith("."))
    for folder in folders:
        if not (folder / "meta.yaml").is_file():
            raise ConfigError(f"{folder}: a folder of the project's patch sets without a meta.yaml",
                              "each folder there is one patch set, laid out as the bundled ones "
                              "(`invoke docs patch-sets`); move anything else out of it")
    found = [load_patch_set(folder, Origin.PROJECT) for folder in folders]
    for patch_set in found:  # `patch --name` looks for the name: a folder of another name would hide it
        if patch_set.name != patch_set.directory.name:
            raise ConfigError(f"{patch_set.directory / 'meta.yaml'}: name: {patch_set.name!r} is not its folder's "
                              f"name {patch_set.directory.name!r}", "give the folder and `name:` the same name")
    return found


def list_patch_sets(roles_dir: Path, project_dir: Path | None = None) -> list[PatchSet]:
    """Every patch set: the bundled ones under roles_dir (a role with a meta.yaml) and, given project_dir (the
    project's patches/, which may not exist), the project's own; by name. Two sets of one name are refused naming
    both places: which one a name means must never depend on the order they are read in."""
    bundled = [load_patch_set(meta.parent) for meta in roles_dir.glob("*/meta.yaml")]
    found: dict[str, PatchSet] = {}
    for patch_set in [*bundled, *(_project_sets(project_dir) if project_dir is not None else [])]:
        other = found.setdefault(patch_set.name, patch_set)
        if other is not patch_set:  # a bundled one and the project's (a project's are named by their folders)
            raise ConfigError(f"two patch sets are named {patch_set.name!r}: {_place(other)} and {_place(patch_set)}",
                              "rename the project's one (`name:` in its meta.yaml, and its folder)")
    return sorted(found.values(), key=lambda p: p.name)


def _place(patch_set: PatchSet) -> str:
    return f"{patch_set.origin} {patch_set.directory / 'meta.yaml'}"


def find_patch_set(roles_dir: Path, name: str, project_dir: Path | None = None) -> PatchSet:
    known = list_patch_sets(roles_dir, project_dir)
    found = next((patch_set for patch_set in known if patch_set.name == name), None)
    if found is None:
        where = f"under {roles_dir}" + (f" or {project_dir}" if project_dir is not None else "")
        raise ConfigError(f"no patch set named {name!r} {where}{did_you_mean(name, [p.name for p in known])}",
                          hint=f"patch sets: {', '.join(p.name for p in known) or 'none'} (`invoke patches.list`)")
    return found
