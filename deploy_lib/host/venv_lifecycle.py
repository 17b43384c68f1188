"""The lifecycle of published venvs: list them (size, kind, the releases and derived venvs that use each) and prune
those no kept release needs, with the wheels no kept built venv was made from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import ConfigError
from deploy_lib.host.venv_publish import JIT_CACHE_DISTRIBUTION
from deploy_lib.host.venv_store import VenvStoreFacts, parse_store_facts, store_fact_steps
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.remote.readings import ABSENT_OK, Fact, read
from deploy_lib.store import STAGING_SUFFIX, StoreLayout
from deploy_lib.venvs.paths import (
    cache_path,
    canonical_name,
    staging_path,
    tool_store,
    venv_path,
    wheel_dir,
)

# What `invoke status` and `invoke venvs` show, in this order (the JIT cache: FlashInfer's prebuilt kernels)
STATUS_DISTRIBUTIONS = ("sglang", "flashinfer-python", JIT_CACHE_DISTRIBUTION, "torch")
FACT_SIZES = "venv facts: sizes"


@dataclass(frozen=True)
class VenvRecord:
    hash: str
    marker: Mapping[str, Any]
    size_bytes: int | None             # bytes not already counted for its base (hard links count once)
    releases: tuple[str, ...] = ()     # releases whose release.json names this venv
    derived: tuple[str, ...] = ()      # venvs derived from this one

    @property
    def kind(self) -> str:
        return str(self.marker.get("kind", ""))

    @property
    def base(self) -> str | None:
        base = self.marker.get("base")
        return str(base) if base else None

    def versions(self) -> dict[str, str]:
        """The versions of STATUS_DISTRIBUTIONS the venv was built with (those installed), from its marker."""
        installed = {canonical_name(str(k)): str(v) for k, v in dict(self.marker.get("distributions", {})).items()}
        return {name: installed[name] for name in STATUS_DISTRIBUTIONS if name in installed}


def _base_first(markers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    def depth(venv_hash: str, seen: frozenset[str] = frozenset()) -> int:
        base = markers.get(venv_hash, {}).get("base")
        return 1 + depth(base, seen | {venv_hash}) if isinstance(base, str) and base in markers and base not in seen \
            else 0
    return sorted(markers, key=lambda h: (depth(h), h))


def sizes_fact(layout: StoreLayout, facts: VenvStoreFacts) -> Fact[dict[str, int]] | None:
    """`du -sb` over the venvs, bases before their derived venvs: a hard-linked file counts for the first."""
    order = _base_first(facts.markers)
    if not order:
        return None
    return Fact(Step(FACT_SIZES, ("du", "-sb", "--", *(str(venv_path(layout, h)) for h in order)), ok=ABSENT_OK,
                     timeout_s=300), lambda result: parse_sizes(result.stdout))


def parse_sizes(du_out: str) -> dict[str, int]:
    sizes = {}
    for line in du_out.splitlines():
        size, _, path = line.partition("\t")
        if size.isdigit():
            sizes[PurePosixPath(path).name] = int(size)
    return sizes


def venv_records(facts: VenvStoreFacts, sizes: Mapping[str, int],
                 release_venvs: Mapping[str, str | None]) -> list[VenvRecord]:
    """Published venvs, base before derived, with the releases that use each (release id -> venv hash)."""
    users: dict[str, list[str]] = {}
    for release, venv in sorted(release_venvs.items()):
        if venv is not None:
            users.setdefault(venv, []).append(release)
    children: dict[str, list[str]] = {}
    for venv_hash, marker in facts.markers.items():
        if marker.get("base"):
            children.setdefault(str(marker["base"]), []).append(venv_hash)
    return [VenvRecord(h, facts.markers[h], sizes.get(h), tuple(users.get(h, ())), tuple(sorted(children.get(h, ()))))
            for h in _base_first(facts.markers)]


def list_venvs(remote: Remote, layout: StoreLayout, release_venvs: Mapping[str, str | None]) -> list[VenvRecord]:
    facts = parse_store_facts(layout, remote.run(store_fact_steps(layout)))
    sizes_read = sizes_fact(layout, facts)
    sizes = read(remote, [sizes_read]).value(sizes_read) if sizes_read is not None else {}
    return venv_records(facts, sizes, release_venvs)


@dataclass(frozen=True)
class PrunePlan:
    venvs: tuple[str, ...]          # published venvs no kept release needs
    leftovers: tuple[str, ...]      # interrupted builds (<hash>.tmp); strays are never pruned
    wheels: tuple[str, ...]         # sha256 of wheels no kept built venv was made from


def plan_prune(facts: VenvStoreFacts, kept_venvs: Iterable[str | None]) -> PrunePlan:
    """Remove a venv only when no kept release uses it and it is not the base (at any depth) of one that is.

    An adopted venv is the one a hand-run server used: it stays until `venv.remove` names it."""
    needed: set[str] = set()
    for venv_hash in kept_venvs:
        while venv_hash is not None and venv_hash not in needed:
            needed.add(venv_hash)
            base = facts.markers.get(venv_hash, {}).get("base")
            venv_hash = str(base) if base else None
    doomed = tuple(sorted(h for h in facts.markers if h not in needed and facts.markers[h].get("kind") != "adopted"))
    wanted_wheels = {sha for h in needed for sha in facts.markers.get(h, {}).get("wheels", [])}
    return PrunePlan(doomed, facts.leftovers, tuple(sorted(facts.wheels - wanted_wheels)))


def removal_plan(facts: VenvStoreFacts, venv_hash: str, release_venvs: Mapping[str, str | None]) -> PrunePlan:
    """`venv.remove HASH`: any managed venv (adopted ones included) that no release on the host and no derived
    venv needs; otherwise ConfigError naming what still needs it."""
    if venv_hash not in facts.markers:
        raise ConfigError(f"no managed venv {venv_hash!r} on the host",
                          f"managed venvs: {', '.join(sorted(facts.markers)) or 'none'} (`invoke venv.list`)")
    users = sorted(release for release, used in release_venvs.items() if used == venv_hash)
    derived = sorted(h for h, marker in facts.markers.items() if marker.get("base") == venv_hash)
    if users or derived:
        raise ConfigError(f"venv {venv_hash} is still needed: releases {', '.join(users) or 'none'}, derived venvs "
                          f"{', '.join(derived) or 'none'}", "roll forward past those releases (they are pruned "
                          "beyond service.keep_releases) or remove the derived venvs first")
    wanted = {sha for h, marker in facts.markers.items() if h != venv_hash for sha in marker.get("wheels", [])}
    return PrunePlan((venv_hash,), (), tuple(sorted(set(facts.markers[venv_hash].get("wheels", [])) - wanted)))


def describe_prune(plan: PrunePlan) -> list[str]:
    """One phrase per removed thing, for the user and history."""
    phrases = [f"venv {venv_hash}" for venv_hash in plan.venvs]
    phrases += [f"unfinished venv build {name}" for name in plan.leftovers]
    if plan.wheels:
        phrases.append(f"{len(plan.wheels)} wheel(s) no kept venv was built from")
    return phrases


def prune_steps(layout: StoreLayout, plan: PrunePlan) -> list[Step | Put]:
    doomed = [path for h in plan.venvs
              for path in (venv_path(layout, h), cache_path(layout, h), layout.sglang_facts_dir(venv_path(layout, h)))]
    doomed += [staging_path(layout, name.removesuffix(STAGING_SUFFIX)) for name in plan.leftovers]
    for sha in plan.wheels:
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"refusing to prune wheel {sha!r}: not a sha256")
        doomed += [wheel_dir(layout, sha), tool_store(layout) / sha]  # a uv wheel's binary goes with it
    if not doomed:
        return []
    return [Step("prune venvs", ("rm", "-rf", "--", *map(str, doomed)), sudo=True, timeout_s=900)]
