"""The candidates of a sweep: the grid's product over the base profile, each validated by the profile's schema, and
the ones a rule the tool already knows refuses (a flag the host's SGLang lacks, fusion on several nodes, a patch set
for other versions or GPUs) set aside with the reason before anything runs. Pure: the host is what was read."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploy_lib.errors import ConfigError, PreflightError, did_you_mean
from deploy_lib.models.facts import ReleaseModel
from deploy_lib.patches import FLASHINFER, PatchSet, refuse_unless_applicable, select_variants
from deploy_lib.patches.profiles import patched_profile
from deploy_lib.profile import LoadedProfile
from deploy_lib.profile.overrides import with_overrides
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.release.argv_check import check_argv
from deploy_lib.release.model import Change, build_release, diff_releases, placeholder_secrets
from deploy_lib.store import StoreLayout
from deploy_lib.tune.spec import NO_PATCHES, PATCHES_KEY, TuneSpec, Value, setting_text


@dataclass(frozen=True)
class HostView:
    """What a sweep's rules read of the host: its SGLang (version, options), FlashInfer, GPU architecture."""

    layout: StoreLayout
    sglang_version: str
    flashinfer_version: str | None
    options: Mapping[str, dict[str, Any]]
    gpu_arch: str

    @property
    def versions(self) -> dict[str, str]:
        return {"sglang": self.sglang_version, **({FLASHINFER: self.flashinfer_version}
                                                  if self.flashinfer_version else {})}


@dataclass(frozen=True)
class Candidate:
    label: str                                # `memory.max_running_requests=1024 patches=none`: its identity
    settings: tuple[tuple[str, Value], ...]
    loaded: LoadedProfile
    patch_set: PatchSet | None = None


    @property
    def environment(self) -> tuple[str, str]:
        """What a switch between two candidates rebuilds or starts cold when it differs: the venv (built from a lock,
        or the one named) and the patch set (its own venv, derived from that one)."""
        service = self.loaded.profile.service
        venv = service.venv_build.model_dump_json() if service.venv_build is not None else service.venv
        return venv, self.patch_set.name if self.patch_set is not None else ""


def environment_switches(candidates: Sequence[Candidate]) -> int:
    """How many times running `candidates` in this order changes the venv or the patch set."""
    return sum(a.environment != b.environment for a, b in itertools.pairwise(candidates))


def grouped_by_environment(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The candidates on one venv and patch set together, so each switch of either happens once (its caches warm
    for the rest); the groups in the order their first candidate comes in the grid, the grid's order within each."""
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.environment, []).append(candidate)
    return tuple(candidate for group in groups.values() for candidate in group)


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


@dataclass(frozen=True)
class Sweep:
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skipped, ...]
    bench: BenchSettings                      # the benchmark of every run, its concurrency the clipped ladder
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def level(self) -> int:
        return max(self.bench.concurrency)


def _patch_set(name: Value, known: Sequence[PatchSet], source: str) -> PatchSet | None:
    if name == NO_PATCHES:
        return None
    found = next((patch_set for patch_set in known if patch_set.name == name), None)
    if found is None:
        names = [NO_PATCHES, *(patch_set.name for patch_set in known)]
        raise ConfigError(f"{source}: patches: {name!r} is not a patch set{did_you_mean(str(name), names)}",
                          f"patch sets: {', '.join(names)}")
    return found


def check_values(base: LoadedProfile, spec: TuneSpec, sources: Mapping[str, str], known: Sequence[PatchSet]) -> None:
    """Each value alone on the base profile: an unknown key or a bad value is the user's error, not a skip."""
    for key, values in spec.vary.items():
        for value in values:
            if key == PATCHES_KEY:
                _patch_set(value, known, sources[key])
            else:
                with_overrides(base, {key: value}, sources[key])


def clip_ladder(ladder: Sequence[int], prompts: int, caps: Sequence[int | None]) -> tuple[list[int], list[str]]:
    """The levels a benchmark can run: at most its prompts, and at most the largest max_running_requests any
    candidate allows (when all set one: a level above it only measures the queue); the dropped ones, said why."""
    notes = []
    levels = [level for level in ladder if level <= prompts]
    if len(levels) < len(ladder):
        notes.append(f"levels {', '.join(str(c) for c in ladder if c > prompts)} left out: the benchmark sends "
                     f"{prompts} prompts per level")
    if caps and all(cap is not None for cap in caps):
        cap = max(c for c in caps if c is not None)
        if any(level > cap for level in levels):
            notes.append(f"levels {', '.join(str(c) for c in levels if c > cap)} left out: no candidate runs more "
                         f"than {cap} requests at once (memory.max_running_requests)")
            levels = [level for level in levels if level <= cap]
    if not levels:
        raise ConfigError(f"no level of the ladder {list(ladder)} can run: {'; '.join(notes)}",
                          "give levels at most bench.prompts and the candidates' max_running_requests")
    return levels, notes


def _release_args(loaded: LoadedProfile, host: HostView) -> tuple[str, ...]:
    return build_release(loaded, host.layout, host.sglang_version, placeholder_secrets(loaded.profile)).args


def _refusal(candidate: Candidate, host: HostView | None) -> str | None:
    """Why a rule the tool knows refuses the candidate on this host, or None."""
    profile = candidate.loaded.profile
    if candidate.patch_set is not None:
        try:
            refuse_unless_applicable(candidate.patch_set, host.gpu_arch if host else "", profile.parallel.nnodes)
            if host is not None:
                select_variants(candidate.patch_set, host.versions)
        except (ConfigError, PreflightError) as refused:
            return refused.message.replace("\n  ", "; ")
    if host is None or not host.options:
        return None
    problems = [p.message for p in check_argv(dict(host.options), list(_release_args(candidate.loaded, host)))
                if p.severity == "error"]
    if problems:
        return f"SGLang {host.sglang_version} on the host does not accept it: {'; '.join(problems)}"
    return None


def build_sweep(base: LoadedProfile, spec: TuneSpec, sources: Mapping[str, str], known: Sequence[PatchSet],
                host: HostView | None) -> Sweep:
    """The grid's candidates over `base` (in the order the keys and values were given, grouped by venv and patch
    set), those refused, the bench."""
    check_values(base, spec, sources, known)
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    keys = list(spec.vary)
    for combination in itertools.product(*(spec.vary[key] for key in keys)):
        settings = tuple(zip(keys, combination, strict=True))
        label = " ".join(setting_text(key, value) for key, value in settings)
        overrides = {key: value for key, value in settings if key != PATCHES_KEY}
        patches = [value for key, value in settings if key == PATCHES_KEY]
        try:
            loaded = with_overrides(base, overrides, label)
        except ConfigError as refused:  # each value is valid alone: the combination breaks a profile rule
            skipped.append(Skipped(label, refused.message.removeprefix(f"{label}: ")))
            continue
        patch_set = _patch_set(patches[0], known, sources[PATCHES_KEY]) if patches else None
        if patch_set is not None:
            loaded = patched_profile(loaded, patch_set)
        candidate = Candidate(label, settings, loaded, patch_set)
        reason = _refusal(candidate, host)
        if reason is None:
            candidates.append(candidate)
        else:
            skipped.append(Skipped(label, reason))
    bench = spec.bench or base.profile.bench
    caps = [c.loaded.profile.memory.max_running_requests for c in candidates]
    levels, notes = clip_ladder(spec.ladder, bench.prompts, caps)
    if spec.level is not None and spec.level not in levels:
        raise ConfigError(f"the objective's level {spec.level} cannot run: {'; '.join(notes)}",
                          f"name one of {levels}")
    grouped = grouped_by_environment(candidates)
    if (fewer := environment_switches(grouped)) < (given := environment_switches(candidates)):
        notes.append(f"candidates grouped by venv and patch set: {fewer} switch{'es' if fewer != 1 else ''} of either "
                     f"instead of {given}")
    return Sweep(grouped, tuple(skipped), bench.model_copy(update={"concurrency": levels}), tuple(notes))


def differences(base_metadata: Mapping[str, Any] | None, candidate: Candidate, host: HostView) -> list[Change]:
    """What differs from the release serving before the sweep, flag by flag (the diff `invoke plan` shows)."""
    placeholders = placeholder_secrets(candidate.loaded.profile)
    patches = (candidate.patch_set.name,) if candidate.patch_set else ()
    wanted = candidate.loaded.profile.model
    recorded = dict((base_metadata or {}).get("model") or {})
    # the same weights as the serving release: resolved as its deploy resolved them (commit, cache), not a change
    same = recorded.get("path") == wanted.path and wanted.revision in (None, recorded.get("revision"))
    release = build_release(candidate.loaded, host.layout, host.sglang_version, placeholders,
                            venv=str(base_metadata.get("venv")) if base_metadata and not patches else None,
                            patches=patches, flashinfer_version=host.flashinfer_version,
                            model=ReleaseModel(**recorded) if same else None)
    return diff_releases(base_metadata, release.metadata())
