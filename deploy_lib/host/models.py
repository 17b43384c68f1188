"""Model weights on the host, through a Remote: staged or pushed, listed, pruned.

Moving a release's weights onto the host (host actions, through a Remote): a hub model staged into the HF cache
by the venv's huggingface_hub, an rsync source pushed into a new version directory; progress every few seconds.

What the host holds (`invoke model.list`), and pruning what no kept release uses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import RemoteError
from deploy_lib.models.facts import FACT_MODEL, ModelFacts
from deploy_lib.models.hub import HubModel
from deploy_lib.models.pushed import FACT_MODEL_DISK, PushedModel
from deploy_lib.models.script import PROGRESS_PREFIX, RESULT_PREFIX, parse_model_result, script_step
from deploy_lib.models.transfer import TransferMeter, show_end
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK
from deploy_lib.store import STAGING_SUFFIX


def stage_model(remote: Remote, model: HubModel, venv: str, commit: str, progress: Progress,
                clock: Callable[[], float]) -> ModelFacts:
    """Download what the cache lacks of `commit`; progress every few seconds; RemoteError if it fails."""
    meter = TransferMeter(clock())

    def on_line(line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            done, total = (int(part) for part in line[len(PROGRESS_PREFIX):].split())
            shown = meter.sample(done, total, clock())
            if shown is not None:
                progress.transfer(f"model {model.repo}: {shown}")

    result = remote.run([model.step(venv, "stage", commit)], on_output=on_line)[0]
    facts = parse_model_result(result)
    show_end(meter, progress, f"model {model.repo}", clock())
    if facts.error is not None:
        raise RemoteError(f"staging model {model.repo} at {commit} from {model.hub} failed: {facts.message}; "
                          "nothing was switched, the current release keeps serving",
                          "rerun the deploy: files already downloaded are kept and a partial file is resumed")
    return facts


def _rsync_done_bytes(line: str) -> int | None:
    """Bytes done from an rsync --info=progress2 line: `   1,234,567  12%   10.00MB/s    0:00:10 ...`."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    digits = first.replace(",", "")
    return int(digits) if digits.isdigit() and "%" in line else None


def push_model(remote: Remote, model: PushedModel, listing: str, progress: Progress,
               clock: Callable[[], float]) -> ModelFacts:
    """rsync the local directory into <base>/<digest>.tmp (unchanged files hard-linked from the newest version,
    a partial earlier push resumed), then rename it to <base>/<digest>: a version directory is complete or absent."""
    facts = model.parse([StepResult(Step(FACT_MODEL, ("true",)), 0, listing, "", 0.0),
                         StepResult(Step(FACT_MODEL_DISK, ("true",)), 0, "", "", 0.0)])
    staging = model.base / (model.digest + STAGING_SUFFIX)
    meter = TransferMeter(clock())

    def on_line(line: str) -> None:
        done = _rsync_done_bytes(line)
        shown = meter.sample(done, facts.missing_bytes, clock()) if done is not None else None
        if shown is not None:
            progress.transfer(f"push {model.local_dir}: {shown}")

    remote.run([Step("model: version directory", ("mkdir", "-p", "--", str(staging)), sudo=True)])
    remote.push_directory(model.local_dir, staging, model.link_dest(listing), on_output=on_line)
    show_end(meter, progress, f"push {model.local_dir}", clock())
    remote.run([Step("model: publish version", ("mv", "-T", "--", str(staging), str(model.version_dir)), sudo=True)])
    return facts


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
