"""An rsync source (`model.source.rsync`): this machine's directory pushed into a version directory on the host,
unchanged files hard-linked from the newest version there."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from deploy_lib.errors import ConfigError
from deploy_lib.facts.host import parse_free_bytes
from deploy_lib.models.facts import FACT_MODEL, ModelFacts, ModelFile, ReleaseModel
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK
from deploy_lib.store import STAGING_SUFFIX

FACT_MODEL_DISK = "host facts: model directory disk"


@dataclass(frozen=True)
class LocalFile:
    relpath: str
    size: int
    mtime: int  # whole seconds: rsync -a keeps them, so the host's copy shows the same


def read_local_dir(directory: Path) -> tuple[LocalFile, ...]:
    """Every file under `directory` (links followed as rsync -a copies them: as links), sorted."""
    if not directory.is_dir():
        raise ConfigError(f"model.source.rsync: {directory} is not a directory on this machine")
    if not (directory / "config.json").is_file():
        raise ConfigError(f"model.source.rsync: {directory} has no config.json", "point it at the model's directory")
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            stat = path.lstat()
            found.append(LocalFile(str(path.relative_to(directory)), stat.st_size, int(stat.st_mtime)))
    return tuple(sorted(found, key=lambda item: item.relpath))


@dataclass(frozen=True)
class PushedModel:
    """`model.source.rsync`: the local directory, pushed to <model.path>/<digest>/ (digest of names, sizes and
    times, as rsync's quick check compares them); unchanged files are hard-linked from the newest version there."""

    local_dir: Path
    base: PurePosixPath
    files: tuple[LocalFile, ...]
    verb = "push"

    @property
    def digest(self) -> str:
        manifest = json.dumps([[f.relpath, f.size, f.mtime] for f in self.files])
        return hashlib.sha256(manifest.encode()).hexdigest()[:16]

    @property
    def version_dir(self) -> PurePosixPath:
        return self.base / self.digest

    @property
    def label(self) -> str:
        return f"model directory {self.local_dir} pushed to {self.base}"

    def fact_steps(self, venv: str) -> list[Step]:
        listing = ("find", str(self.base), "-mindepth", "1", "-maxdepth", "2", "-printf", "%P\\t%y\\t%s\\t%T@\\n")
        parents = [str(p) for p in reversed([self.base, *self.base.parents]) if str(p) != "/"]
        return [Step(FACT_MODEL, listing, sudo=True, ok=ABSENT_OK),
                Step(FACT_MODEL_DISK, ("df", "-P", "-B1", "--", "/", *parents), ok=ABSENT_OK)]

    def parse(self, results: Sequence[StepResult]) -> ModelFacts:
        versions = parse_versions(results[0].stdout)
        newest = newest_version(versions, results[0].stdout)
        have = versions.get(newest, {}) if newest else {}
        to_send = [f for f in self.files if have.get(f.relpath) != (f.size, f.mtime)]
        complete = self.digest in versions
        return ModelFacts(commit=self.digest, files=tuple(ModelFile(f.relpath, f.size, "") for f in self.files),
                          missing=() if complete else tuple(f.relpath for f in to_send),
                          missing_bytes=0 if complete else sum(f.size for f in to_send),
                          free_bytes=parse_free_bytes(results[1].stdout), hf_home=str(self.base),
                          asked_hub=newest is not None)  # asked_hub here: an older version to link from exists

    def link_dest(self, listing: str) -> PurePosixPath | None:
        newest = newest_version(parse_versions(listing), listing)
        return self.base / newest if newest else None

    def release_model(self, facts: ModelFacts) -> ReleaseModel:
        return ReleaseModel(str(self.version_dir), pushed_from=str(self.local_dir))


def pushed_model(base: str, local_dir: Path) -> PushedModel:
    return PushedModel(local_dir, PurePosixPath(base), read_local_dir(local_dir))


def parse_versions(listing: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Complete version directories under the base and their top-level files: name -> {file: (size, mtime)}."""
    versions: dict[str, dict[str, tuple[int, int]]] = {}
    for line in listing.splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        relpath, kind, size, mtime = parts
        top, _, rest = relpath.partition("/")
        if top.endswith(STAGING_SUFFIX):
            continue
        if not rest and kind == "d":
            versions.setdefault(top, {})
        elif rest and kind == "f":
            versions.setdefault(top, {})[rest] = (int(size), int(float(mtime)))
    return versions


def newest_version(versions: Mapping[str, Mapping[str, tuple[int, int]]], listing: str) -> str | None:
    """The version directory modified last (the one unchanged files are hard-linked from)."""
    times = {}
    for line in listing.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0] in versions:
            times[parts[0]] = float(parts[3])
    return max(times, key=lambda name: times[name]) if times else None
