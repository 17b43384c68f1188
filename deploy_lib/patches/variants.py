"""Choosing, per target, the variant for the installed versions of its package."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deploy_lib.errors import ConfigError
from deploy_lib.patches.spec import PatchSet, VariantSpec


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


def select_variants(patch_set: PatchSet, versions: Mapping[str, str]) -> dict[str, Variant]:
    """Per target the variant for the installed versions (distribution -> version); ConfigError listing the known
    ranges of any target that has none."""
    selected: dict[str, Variant] = {}
    problems: list[str] = []
    for name, target in patch_set.targets.items():
        version = versions.get(target.package)
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


def files_needed(patch_set: PatchSet, versions: Mapping[str, str]) -> tuple[str, ...]:
    """Paths (relative to site-packages) that check/enable/disable read for these versions."""
    variants = select_variants(patch_set, versions)
    return tuple(dict.fromkeys(v.file for v in variants.values() if v.file is not None))
