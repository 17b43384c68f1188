"""What the host holds (`invoke model.list`), and pruning what no kept release uses."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.models.script import RESULT_PREFIX, script_step
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK


@dataclass(frozen=True)
class StoredModel:
    """One revision in a host HF cache, or one pushed version directory, and the releases that run it."""

    kind: str                 # hub | pushed
    location: str             # the HF_HOME, or the pushed versions' base directory
    name: str                 # repo id, or the base directory
    version: str              # commit, or digest
    size_bytes: int
    files: int
    staged: bool              # put there by this tool (only those are ever pruned)
    releases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelLocations:
    """Where the releases of a store keep their weights: HF caches (with a venv and user to read them) and bases."""

    caches: Mapping[str, tuple[str, str]]  # hf_home -> (venv, user)
    bases: tuple[str, ...]


def release_uses(metadata: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(location, name, version) of the weights a release runs, from its release.json; None for a plain path."""
    model = metadata.get("model") or {}
    if model.get("hf_home") and model.get("commit"):
        return str(model["hf_home"]), str(model["path"]), str(model["commit"])
    if model.get("pushed_from"):
        version = PurePosixPath(str(model["path"]))
        return str(version.parent), str(version.parent), version.name
    return None


def model_locations(releases: Sequence[Any]) -> ModelLocations:
    caches: dict[str, tuple[str, str]] = {}
    bases: list[str] = []
    for record in releases:
        model = record.metadata.get("model") or {}
        uses = release_uses(record.metadata)
        if uses is None:
            continue
        if model.get("hf_home"):
            user = str((record.metadata.get("profile") or {}).get("service", {}).get("user", "root"))
            caches.setdefault(uses[0], (str(record.metadata.get("venv", "")), user))
        elif uses[0] not in bases:
            bases.append(uses[0])
    return ModelLocations(caches, tuple(bases))


_DIGEST = re.compile(r"[0-9a-f]{16}")
FACT_CACHE = "model cache: "
FACT_BASE = "model versions: "


def listing_steps(locations: ModelLocations) -> list[Step]:
    steps = [script_step(FACT_CACHE + hf_home, venv, user, {"action": "list", "hf_home": hf_home, "user": user})
             for hf_home, (venv, user) in locations.caches.items()]
    steps += [Step(FACT_BASE + base, ("find", base, "-mindepth", "2", "-type", "f", "-printf", "%P\\t%s\\n"),
                   sudo=True, ok=ABSENT_OK) for base in locations.bases]
    return steps


def parse_stored(results: Sequence[StepResult], releases: Sequence[Any]) -> list[StoredModel]:
    users: dict[tuple[str, str, str], list[str]] = {}
    for record in releases:
        uses = release_uses(record.metadata)
        if uses is not None:
            users.setdefault(uses, []).append(record.id)
    stored = []
    for result in results:
        name = result.step.name
        if name.startswith(FACT_CACHE):
            stored += _cache_revisions(name.removeprefix(FACT_CACHE), result.stdout, users)
        elif name.startswith(FACT_BASE):
            base = name.removeprefix(FACT_BASE)
            sizes: dict[str, list[int]] = {}
            for line in result.stdout.splitlines():
                relpath, _, size = line.partition("\t")
                version = relpath.split("/", 1)[0]
                if size.isdigit() and _DIGEST.fullmatch(version):  # ours: named by their digest
                    sizes.setdefault(version, []).append(int(size))
            stored += [StoredModel("pushed", base, base, version, sum(found), len(found), True,
                                   tuple(users.get((base, base, version), ()))) for version, found in sizes.items()]
    return stored


def _cache_revisions(hf_home: str, stdout: str, users: Mapping[tuple[str, str, str], list[str]]
                     ) -> list[StoredModel]:
    """The revisions a cache's listing names; none from a listing that did not complete (a failed or cut-off python):
    what is not listed is never pruned."""
    line = next((line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)), None)
    try:
        items = json.loads(line[len(RESULT_PREFIX):])["revisions"] if line else []
        return [StoredModel("hub", hf_home, item["repo"], item["commit"], int(item["bytes"]), int(item["files"]),
                            bool(item["staged"]), tuple(users.get((hf_home, item["repo"], item["commit"]), ())))
                for item in items]
    except (ValueError, KeyError, TypeError):
        return []


def read_stored(remote: Remote, releases: Sequence[Any]) -> list[StoredModel]:
    """Every revision and version in the places the releases keep weights: one round trip."""
    steps = listing_steps(model_locations(releases))
    return parse_stored(remote.run(steps), releases) if steps else []


def doomed_models(stored: Sequence[StoredModel], kept: set[str]) -> list[StoredModel]:
    """What this tool staged and no kept release runs (current and last healthy are always kept)."""
    return [item for item in stored if item.staged and not set(item.releases) & kept]


def prune_models(stored: Sequence[StoredModel], kept: set[str], locations: ModelLocations) -> list[Step]:
    """Steps deleting doomed_models: hub revisions with huggingface_hub's own deletion, pushed versions by rm."""
    doomed = doomed_models(stored, kept)
    steps = []
    for hf_home, (venv, user) in locations.caches.items():
        commits = [item.version for item in doomed if item.kind == "hub" and item.location == hf_home]
        if commits:
            steps.append(script_step(f"prune model revisions in {hf_home}", venv, user,
                                     {"action": "prune", "hf_home": hf_home, "user": user, "commits": commits}, 600))
    dirs = [str(PurePosixPath(item.location) / item.version) for item in doomed if item.kind == "pushed"]
    if dirs:
        steps.append(Step("prune pushed model versions", ("rm", "-rf", "--", *dirs), sudo=True, timeout_s=600))
    return steps
