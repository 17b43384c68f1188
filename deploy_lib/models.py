"""Model weights as part of a release: the revision resolved to a commit, the disk checked, the snapshot staged.

A hub model (`model.path` a repo id) is planned and staged on the host by the release's own venv: its python runs
`model_stage.py` (sent on stdin) with huggingface_hub, the library SGLang itself downloads with, into the host's HF
cache. The plan rides in the facts batch (one round trip: commit, files, what is missing, free disk); staging
happens under the lock before the switch, while the old release serves; the unit then runs with HF_HUB_OFFLINE=1 and
`--revision <commit>`, so a release never downloads at startup. Nothing here opens a connection.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from deploy_lib.errors import ConfigError, PreflightError, RemoteError
from deploy_lib.facts import parse_free_bytes
from deploy_lib.progress import Progress
from deploy_lib.readings import ABSENT_OK
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.store import STAGING_SUFFIX

if TYPE_CHECKING:  # facts.py reads model facts and sits below the profile schema (profile -> bench -> facts)
    from deploy_lib.inventory import HostVars
    from deploy_lib.profile import Profile

FACT_MODEL = "host facts: model weights"
STAGE_MODEL = "model: stage"
STAGE_TIMEOUT_S = 48 * 3600  # several hundred GB over a slow link; Ctrl-C or a dropped connection stops it sooner
PROGRESS_EVERY_S = 5.0       # the host reports every second; the user sees a line this often
MIN_FREE_AFTER_BYTES = 1024 ** 3  # what must stay free in the cache's filesystem once the weights are in
STAGE_SOURCE = resources.files("deploy_lib").joinpath("model_stage.py").read_text(encoding="utf-8")
# Reads the request (first stdin line), then runs the rest of stdin (model_stage.py) and its main().
BOOTSTRAP = ('import json,sys;r=json.loads(sys.stdin.readline());g={"__name__":"model_stage"};'
             'exec(compile(sys.stdin.read(),"model_stage.py","exec"),g);sys.exit(g["main"](r))')
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
DEFAULT_HUB = "https://huggingface.co"


@dataclass(frozen=True)
class HubModel:
    """A hub model to plan or stage on one host: what the profile and the host's vars say, plus the token."""

    repo: str
    revision: str
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    hf_home: str | None        # None: the service user's ~/.cache/huggingface, resolved on the host
    endpoint: str | None       # None: huggingface_hub's default hub
    user: str
    token: str | None = field(default=None, repr=False)

    verb = "download"

    @property
    def hub(self) -> str:
        return self.endpoint or DEFAULT_HUB

    @property
    def label(self) -> str:
        return f"model {self.repo} at {self.revision} from {self.hub}"

    def fact_steps(self, venv: str) -> list[Step]:
        return [self.step(venv, "plan")]

    def parse(self, results: Sequence[StepResult]) -> ModelFacts:
        return parse_model_result(results[0])

    def release_model(self, facts: ModelFacts) -> ReleaseModel:
        return ReleaseModel(self.repo, self.revision, facts.commit, facts.hf_home)

    def step(self, venv: str, action: str, revision: str | None = None) -> Step:
        """The venv's python, as the service user, running model_stage.py; the token only ever on stdin."""
        request = {"action": action, "repo": self.repo, "revision": revision or self.revision,
                   "allow": list(self.allow), "ignore": list(self.ignore), "hf_home": self.hf_home,
                   "endpoint": self.endpoint, "user": self.user, "token": self.token}
        return script_step(FACT_MODEL if action == "plan" else STAGE_MODEL, venv, self.user, request,
                           120 if action == "plan" else STAGE_TIMEOUT_S)


class Weights(Protocol):
    """Where a release's weights come from: a hub (HubModel), this machine (PushedModel), the host (HostPathModel)."""

    verb: str  # what staging does: download, push

    @property
    def label(self) -> str: ...

    def fact_steps(self, venv: str) -> list[Step]: ...

    def parse(self, results: Sequence[StepResult]) -> ModelFacts: ...

    def release_model(self, facts: ModelFacts) -> ReleaseModel: ...


@dataclass(frozen=True)
class HostPathModel:
    """`model.path` an absolute directory on the host: nothing to stage, only checked to hold a config.json."""

    path: str
    verb = "stage"

    @property
    def label(self) -> str:
        return f"model directory {self.path} on the host"

    def fact_steps(self, venv: str) -> list[Step]:
        return [Step(FACT_MODEL, ("test", "-f", str(PurePosixPath(self.path) / "config.json")), sudo=True,
                     ok=ABSENT_OK)]

    def parse(self, results: Sequence[StepResult]) -> ModelFacts:
        if results[0].exit_code != 0:
            return ModelFacts(error="not_found", message=f"{self.path}/config.json does not exist on the host")
        return ModelFacts(commit=None)

    def release_model(self, facts: ModelFacts) -> ReleaseModel:
        return ReleaseModel(self.path)


def weights(profile: Profile, host_vars: HostVars, secrets: Mapping[str, str]) -> Weights:
    """Where the profile's weights come from on this host; ConfigError before any SSH when that cannot work."""
    model = profile.model
    if model.source is not None:
        return pushed_model(model.path, Path(os.path.expanduser(model.source.rsync)))
    if model.is_local_path:
        return HostPathModel(model.path)
    hub = hub_model(profile, host_vars, secrets)
    assert hub is not None
    return hub


def script_step(name: str, venv: str, user: str, request: Mapping[str, Any], timeout_s: float = 120) -> Step:
    """model_stage.py run by the venv's python as `user`; the request (a token included) travels on stdin."""
    stdin = (json.dumps(request) + "\n" + STAGE_SOURCE).encode()
    python = str(PurePosixPath(venv) / "bin" / "python3")
    return Step(name, ("runuser", "-u", user, "--", python, "-I", "-c", BOOTSTRAP), sudo=True, stdin=stdin,
                ok=frozenset({0, 1, 127}), timeout_s=timeout_s, secret=request.get("token") is not None)


def hub_model(profile: Profile, host_vars: HostVars, secrets: Mapping[str, str]) -> HubModel | None:
    """The profile's hub model on this host, or None when `model.path` is an absolute path (nothing to stage)."""
    model = profile.model
    if model.is_local_path:
        return None
    if not _REPO_ID.match(model.path):
        raise ConfigError(f"model.path: {model.path!r} is neither an absolute path nor a hub repo id (org/name)",
                          "give the repo id as the hub shows it, or the absolute path of the weights on the host")
    return HubModel(repo=model.path, revision=model.revision or "main", allow=tuple(model.allow_patterns),
                    ignore=tuple(model.ignore_patterns),
                    hf_home=host_vars.hf_home or profile.env.get("HF_HOME"),
                    endpoint=host_vars.hf_endpoint or profile.env.get("HF_ENDPOINT"),
                    user=profile.service.user, token=secrets.get("HF_TOKEN"))


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    blob: str


@dataclass(frozen=True)
class ModelFacts:
    """What the host's cache holds of one revision, as model_stage.py reported it (or why it could not)."""

    commit: str | None = None
    files: tuple[ModelFile, ...] = ()
    missing: tuple[str, ...] = ()      # files of the revision not yet in the snapshot
    missing_bytes: int = 0             # bytes still to download (a blob shared with another revision is not)
    free_bytes: int | None = None      # in the cache's filesystem
    hf_home: str | None = None
    asked_hub: bool = False
    error: str | None = None           # unreachable, not_found, gated, no_library, disk_full, hub_error, script
    message: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    @property
    def complete(self) -> bool:
        return self.error is None and not self.missing


RESULT_PREFIX = "RESULT "
PROGRESS_PREFIX = "PROGRESS "


def parse_model_result(result: StepResult) -> ModelFacts:
    if result.exit_code == 127:
        return ModelFacts(error="no_library", message="the venv's python3 (or runuser) was not found on the host")
    line = next((line for line in reversed(result.stdout.splitlines()) if line.startswith(RESULT_PREFIX)), None)
    if line is None:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return ModelFacts(error="script", message=f"model_stage.py exited {result.exit_code}: {tail or 'no output'}")
    data: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
    if "error" in data:
        return ModelFacts(error=str(data["error"]), message=str(data.get("message", "")))
    return ModelFacts(commit=data["commit"], files=tuple(ModelFile(f["path"], int(f["size"]), f["blob"])
                                                         for f in data["files"]),
                      missing=tuple(data["missing"]), missing_bytes=int(data["missing_bytes"]),
                      free_bytes=data.get("free_bytes"), hf_home=data.get("hf_home"),
                      asked_hub=bool(data.get("asked_hub")))


def size_text(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


_HINTS = {
    "unreachable": "check the host's network to the hub (or its `hf_endpoint` host var); nothing was changed and the "
                   "current release keeps serving",
    "not_found": "check model.path and model.revision (a commit, tag or branch of that repo)",
    "gated": "give a token with access: `secrets: {HF_TOKEN: {env: HF_TOKEN}}`",
    "no_library": "the release's venv needs huggingface_hub (SGLang depends on it)",
}


def check_model(model: Weights, facts: ModelFacts, where: str) -> None:
    """PreflightError when the weights cannot be planned (hub, revision, directory) or do not fit on the disk."""
    if facts.error is not None:
        raise PreflightError(f"{where}: cannot plan {model.label}: {facts.message}",
                             _HINTS.get(facts.error, "see the message above"))
    if facts.free_bytes is not None and facts.missing_bytes + MIN_FREE_AFTER_BYTES > facts.free_bytes:
        raise PreflightError(
            f"{where}: {model.label} ({facts.commit}): {size_text(facts.missing_bytes)} still to {model.verb} "
            f"into {facts.hf_home}, but only {size_text(facts.free_bytes)} is free there "
            f"({size_text(MIN_FREE_AFTER_BYTES)} must stay free)",
            "free disk space on the host, prune old revisions (`invoke model.list`), or point the weights "
            "(host var `hf_home`, model.path) at a larger disk")


@dataclass(frozen=True)
class ReleaseModel:
    """The weights a release runs: a hub repo at a resolved commit in a host cache, or a path on the host."""

    path: str                     # repo id, or absolute path on the host
    revision: str | None = None   # as the profile asked (hub only)
    commit: str | None = None     # what it resolved to at plan time (hub only)
    hf_home: str | None = None    # the host cache holding the snapshot (hub only)

    pushed_from: str | None = None  # the local directory an rsync source was pushed from

    def metadata(self) -> dict[str, str]:
        fields = {"path": self.path, "revision": self.revision, "commit": self.commit, "hf_home": self.hf_home,
                  "pushed_from": self.pushed_from}
        return {name: value for name, value in fields.items() if value is not None}

    def environment(self) -> dict[str, str]:
        """The server reads what was staged and never downloads: the hub is switched off, the cache named."""
        return {**({"HF_HOME": self.hf_home} if self.hf_home else {}), "HF_HUB_OFFLINE": "1"}


@dataclass
class TransferMeter:
    """Progress lines of a transfer from (bytes done, total) samples: rate over the transfer so far, and the ETA."""

    started_at: float
    every_s: float = PROGRESS_EVERY_S
    first_done: int | None = None
    shown_at: float | None = None
    last: tuple[int, int] | None = None
    last_shown: bool = False

    def sample(self, done: int, total: int, now: float, final: bool = False) -> str | None:
        self.last = (done, total)
        if self.first_done is None:
            self.first_done = done  # bytes a resumed transfer already had do not count toward the rate
        self.last_shown = final or self.shown_at is None or now - self.shown_at >= self.every_s
        if not self.last_shown:
            return None
        self.shown_at = now
        elapsed = max(now - self.started_at, 1e-9)
        rate = (done - self.first_done) / elapsed
        percent = 100 * done / total if total else 100.0
        line = f"{size_text(done)} / {size_text(total)} ({percent:.0f}%), {size_text(rate)}/s"
        if rate > 0 and done < total:
            line += f", ETA {_duration((total - done) / rate)}"
        return line


    def finish(self, now: float) -> str | None:
        """The last sample if it was not shown (the previous line was too recent): the transfer's end state."""
        return self.sample(*self.last, now, final=True) if self.last and not self.last_shown else None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _show_end(meter: TransferMeter, progress: Progress, what: str, now: float) -> None:
    if (line := meter.finish(now)) is not None:
        progress.transfer(f"{what}: {line}")


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
    _show_end(meter, progress, f"model {model.repo}", clock())
    if facts.error is not None:
        raise RemoteError(f"staging model {model.repo} at {commit} from {model.hub} failed: {facts.message}; "
                          "nothing was switched, the current release keeps serving",
                          "rerun the deploy: files already downloaded are kept and a partial file is resumed")
    return facts


# --- an rsync source: this machine's directory pushed into a version directory on the host ----------------------

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
    _show_end(meter, progress, f"push {model.local_dir}", clock())
    remote.run([Step("model: publish version", ("mv", "-T", "--", str(staging), str(model.version_dir)), sudo=True)])
    return facts


# --- what the host holds: `invoke model.list`, and pruning what no kept release uses -----------------------------

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
            hf_home = name.removeprefix(FACT_CACHE)
            line = next((line for line in result.stdout.splitlines() if line.startswith(RESULT_PREFIX)), None)
            data = json.loads(line[len(RESULT_PREFIX):]) if line else {}
            for item in data.get("revisions", []):
                key = (hf_home, item["repo"], item["commit"])
                stored.append(StoredModel("hub", hf_home, item["repo"], item["commit"], int(item["bytes"]),
                                          int(item["files"]), bool(item["staged"]), tuple(users.get(key, ()))))
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
