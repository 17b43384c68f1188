"""The release store on the host, as data: pure builders of Step/Put batches, and pure parsers of what they read.

Layout (design.md, "The release"), under <root>/<service>/:

    releases/<id>/       sglang.service, sglang.env (0600), release.json; staged as <id>.tmp, then renamed
    current -> releases/<id>   switched with one rename (ln -s to a temp name, mv -T)
    venvs/, cache/       owned by venvs.py
    history.jsonl        one JSON line per deploy, rollback, failure or bench
    lock/                mkdir-lock with owner.json
    /etc/systemd/system/<service>.service -> <root>/<service>/current/sglang.service

Nothing here opens a connection: the few functions that act (`take_lock`, `holding_lock`, `unlock`,
`read_store_facts`) only call a `Remote` they are given.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import ConfigError, DeployError, LockHeld, StepFailed
from deploy_lib.readings import ABSENT_OK, Readings, read
from deploy_lib.remote import Put, Remote, Step, StepResult

DEFAULT_ROOT = PurePosixPath("/opt/sglang-deploy")
SYSTEMD_DIR = PurePosixPath("/etc/systemd/system")
UNIT_FILE = "sglang.service"
ENV_FILE = "sglang.env"
RELEASE_FILE = "release.json"
FILE_MODE = 0o644      # the unit, release.json, the lock owner: anyone may read them
ENV_FILE_MODE = 0o600  # the env file carries the secrets
STAGING_SUFFIX = ".tmp"  # a directory still being written (release, pushed model version); renamed when complete
HISTORY_TAIL_LINES = 500
# A lock older than this is reported as stale even when its owner cannot be checked (another machine).
STALE_LOCK_AFTER_S = 3 * 3600
# A lock directory without owner.json (acquire interrupted between mkdir and the write) is stale after this.
OWNERLESS_LOCK_GRACE_S = 60

# Events that start a release and judge it (healthy or failed); `stop`, `crash`, `prune` and `bench` judge no start.
ACTIVATIONS = ("deploy", "rollback", "adopt", "start", "restart")
EVENTS = (*ACTIVATIONS, "failure", "bench", "crash", "prune", "stop")
HEALTHY, FAILED, UNCHANGED, RESTARTED, STOPPED = "healthy", "failed", "unchanged", "restarted", "stopped"
OUTCOMES = (HEALTHY, FAILED, UNCHANGED, RESTARTED, STOPPED)
CRASHED = "crashed"  # a release's outcome in `invoke releases` once systemd gave up restarting it

_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*$")
_RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_release_id(release_id: str) -> str:
    if not _RELEASE_ID.fullmatch(release_id) or release_id.endswith(STAGING_SUFFIX):
        raise ConfigError(f"invalid release id {release_id!r}",
                          hint="a release id is letters, digits, '.', '_' or '-' (see `invoke releases`)")
    return release_id


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one service's release store on the host."""

    service: str
    root: PurePosixPath = DEFAULT_ROOT
    unit_dir: PurePosixPath = SYSTEMD_DIR

    def __post_init__(self) -> None:
        if not _UNIT_NAME.fullmatch(self.service) or self.service.endswith(".service"):
            raise ConfigError(f"invalid service name {self.service!r}",
                              hint="use a systemd unit name without the .service suffix, e.g. sglang")
        for path in (self.root, self.unit_dir):
            if not path.is_absolute() or ".." in path.parts:
                raise ConfigError(f"store path {str(path)!r} must be absolute, without '..'")

    @property
    def base(self) -> PurePosixPath:
        return self.root / self.service

    @property
    def releases(self) -> PurePosixPath:
        return self.base / "releases"

    def release(self, release_id: str) -> PurePosixPath:
        return self.releases / check_release_id(release_id)

    def staging(self, release_id: str) -> PurePosixPath:
        return self.releases / (check_release_id(release_id) + STAGING_SUFFIX)

    @property
    def current(self) -> PurePosixPath:
        return self.base / "current"

    @property
    def venvs(self) -> PurePosixPath:
        return self.base / "venvs"

    @property
    def cache(self) -> PurePosixPath:
        return self.base / "cache"

    @property
    def history(self) -> PurePosixPath:
        return self.base / "history.jsonl"

    @property
    def lock(self) -> PurePosixPath:
        return self.base / "lock"

    @property
    def lock_owner(self) -> PurePosixPath:
        return self.lock / "owner.json"

    @property
    def unit_name(self) -> str:
        return f"{self.service}.service"

    @property
    def unit_link(self) -> PurePosixPath:
        return self.unit_dir / self.unit_name

    def env_file(self, release_id: str) -> PurePosixPath:
        """The env file of one release: what that release's unit names in EnvironmentFile=."""
        return self.release(release_id) / ENV_FILE


def iso_time(when: datetime) -> str:
    """A timestamp as the store writes it (history, release.json, lock owner, venv markers): UTC, to the second."""
    if when.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return when.astimezone(UTC).isoformat(timespec="seconds")


def json_line(data: Mapping[str, Any]) -> bytes:
    """One line of canonical JSON (sorted keys, no spaces), as every JSON file and log line of the store."""
    return (json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


# ---------------------------------------------------------------------------------------------------------
# Tags, history and release.json


@dataclass(frozen=True)
class Tags:
    """The one tag set (as Kamal's tags) written on every history line and into release.json."""

    who: str             # user@machine that ran the tool
    host: str            # the target host, as the inventory names it
    release: str
    profile: str
    profile_hash: str
    versions: Mapping[str, str] = field(default_factory=dict)  # {"sglang": ..., "flashinfer": ...}

    def as_dict(self) -> dict[str, Any]:
        return {"who": self.who, "host": self.host, "release": self.release, "profile": self.profile,
                "profile_hash": self.profile_hash, "versions": dict(self.versions)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tags:
        return cls(who=str(data["who"]), host=str(data["host"]), release=str(data["release"]),
                   profile=str(data["profile"]), profile_hash=str(data["profile_hash"]),
                   versions={str(k): str(v) for k, v in dict(data.get("versions") or {}).items()})


def operator_name() -> str:
    """Who runs this tool: user@machine."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


@dataclass(frozen=True)
class HistoryEntry:
    """One line of history.jsonl."""

    event: str                 # one of EVENTS
    outcome: str               # one of OUTCOMES (restarted: a crash systemd restarted)
    when: str                  # ISO 8601, UTC
    tags: Tags
    cause: str = ""            # one line from diagnose.py when the outcome is failed
    timings: Mapping[str, float] = field(default_factory=dict)  # phase -> seconds
    figures: Mapping[str, float] = field(default_factory=dict)  # bench results

    def __post_init__(self) -> None:
        if self.event not in EVENTS or self.outcome not in OUTCOMES:
            raise ValueError(f"history entry: event must be one of {EVENTS} and outcome one of {OUTCOMES}, "
                             f"got {self.event!r}/{self.outcome!r}")

    def to_json(self) -> bytes:
        return json_line({"event": self.event, "outcome": self.outcome, "when": self.when,
                           **self.tags.as_dict(), "cause": self.cause, "timings": dict(self.timings),
                           "figures": dict(self.figures)})

    @classmethod
    def from_json(cls, line: str) -> HistoryEntry:
        data = json.loads(line)
        return cls(event=data["event"], outcome=data["outcome"], when=data["when"], tags=Tags.from_dict(data),
                   cause=str(data.get("cause", "")),
                   timings={str(k): float(v) for k, v in dict(data.get("timings") or {}).items()},
                   figures={str(k): float(v) for k, v in dict(data.get("figures") or {}).items()})


def history_entry(event: str, outcome: str, tags: Tags, when: datetime, cause: str = "",
                  timings: Mapping[str, float] | None = None,
                  figures: Mapping[str, float] | None = None) -> HistoryEntry:
    return HistoryEntry(event, outcome, iso_time(when), tags, cause, dict(timings or {}), dict(figures or {}))


def append_history(layout: StoreLayout, entry: HistoryEntry) -> list[Step | Put]:
    # tee -a: one write of one line on an O_APPEND file, so concurrent appends never interleave.
    return [Step("history: append", ("tee", "-a", "--", str(layout.history)), sudo=True, stdin=entry.to_json())]


def release_json(metadata: Mapping[str, Any], tags: Tags, staged_at: datetime) -> bytes:
    """release.json: the release's own metadata plus the tag set and when it was staged."""
    return json_line({**metadata, "tags": tags.as_dict(), "staged_at": iso_time(staged_at)})


# ---------------------------------------------------------------------------------------------------------
# Stage and switch


def stage_release(layout: StoreLayout, release_id: str, unit_text: str, env_text: str,
                  release_metadata: bytes, replace_damaged: bool = False) -> list[Step | Put]:
    """Write a release into releases/<id>.tmp, flush it, then rename it to releases/<id> in one step.

    A leftover <id>.tmp from an interrupted run is removed first; `current` is never touched here. A damaged
    releases/<id> (same content, files lost or garbled) is removed just before the rename replaces it.
    """
    staging, final = layout.staging(release_id), layout.release(release_id)
    files = (staging / UNIT_FILE, staging / ENV_FILE, staging / RELEASE_FILE)
    replace = [Step("stage: remove the damaged release", ("rm", "-rf", "--", str(final)), sudo=True)]
    return [
        Step("stage: clear leftover", ("rm", "-rf", "--", str(staging)), sudo=True),
        Step("stage: make directory", ("mkdir", "-p", "--", str(staging)), sudo=True),
        Put(files[0], unit_text.encode(), FILE_MODE, sudo=True),
        Put(files[1], env_text.encode(), ENV_FILE_MODE, sudo=True, secret=True),
        Put(files[2], release_metadata, FILE_MODE, sudo=True),
        Step("stage: flush to disk", ("sync", "--", *map(str, files), str(staging)), sudo=True),
        *(replace if replace_damaged else []),
        Step("stage: publish", ("mv", "-T", "--", str(staging), str(final)), sudo=True),
    ]


def repair_release(layout: StoreLayout, release_id: str, unit_text: str, env_text: str) -> list[Step | Put]:
    """Rewrite the unit and env file of a published release (hand edits undone); each file is replaced atomically."""
    final = layout.release(release_id)
    return [Put(final / UNIT_FILE, unit_text.encode(), FILE_MODE, sudo=True),
            Put(final / ENV_FILE, env_text.encode(), ENV_FILE_MODE, sudo=True, secret=True)]


def switch_current(layout: StoreLayout, release_id: str) -> list[Step | Put]:
    """Point `current` at a complete release with one rename, and the systemd unit link at current's unit."""
    temp_current = layout.base / ".current.tmp"
    temp_unit = layout.unit_dir / f".{layout.unit_name}.tmp"
    relative_target = f"releases/{check_release_id(release_id)}"
    return [
        Step("switch: release is complete", ("test", "-f", str(layout.release(release_id) / RELEASE_FILE))),
        Step("switch: temp link", ("ln", "-sfn", "--", relative_target, str(temp_current)), sudo=True),
        Step("switch: current", ("mv", "-T", "--", str(temp_current), str(layout.current)), sudo=True),
        Step("switch: temp unit link", ("ln", "-sfn", "--", str(layout.current / UNIT_FILE), str(temp_unit)),
             sudo=True),
        Step("switch: unit link", ("mv", "-T", "--", str(temp_unit), str(layout.unit_link)), sudo=True),
    ]


# ---------------------------------------------------------------------------------------------------------
# Facts: one read-only batch, pure parsers


FACT_CLOCK = "store facts: clock"
FACT_CURRENT = "store facts: current"
FACT_RELEASE_DIRS = "store facts: release directories"
FACT_RELEASE_FILES = "store facts: release.json files"
FACT_HISTORY = "store facts: history"
FACT_LOCK = "store facts: lock"
FACT_LOCK_OWNER = "store facts: lock owner"


def lock_fact_steps(layout: StoreLayout) -> list[Step]:
    return [
        Step(FACT_CLOCK, ("date", "+%s")),
        Step(FACT_LOCK, ("stat", "-c", "%Y", "--", str(layout.lock)), ok=ABSENT_OK),
        Step(FACT_LOCK_OWNER, ("cat", "--", str(layout.lock_owner)), ok=ABSENT_OK),
    ]


def release_fact_steps(layout: StoreLayout, history_lines: int = HISTORY_TAIL_LINES) -> list[Step]:
    """Read-only: where current points, the release directories and their release.json, history, the lock."""
    releases = str(layout.releases)
    return [
        Step(FACT_CURRENT, ("readlink", "--", str(layout.current)), ok=ABSENT_OK),
        # "<id>\0" for each entry of releases/ and "<id>/<file>\0" for each file in it: what a release lacks
        Step(FACT_RELEASE_DIRS, ("find", releases, "-mindepth", "1", "-maxdepth", "2", "-printf", "%P\\0"),
             ok=ABSENT_OK),
        # grep -H -Z prints "path\0line" for each line of each release.json; -e '' matches every line.
        Step(FACT_RELEASE_FILES, ("find", releases, "-mindepth", "2", "-maxdepth", "2", "-type", "f", "-name",
                                  RELEASE_FILE, "-exec", "grep", "-H", "-Z", "-e", "", "--", "{}", "+"),
             ok=ABSENT_OK),
        Step(FACT_HISTORY, ("tail", "-n", str(history_lines), "--", str(layout.history)), ok=ABSENT_OK),
        *lock_fact_steps(layout),
    ]


@dataclass(frozen=True)
class ReleaseRecord:
    id: str
    staged_at: str
    metadata: Mapping[str, Any]


@dataclass(frozen=True)
class LockOwner:
    """Who holds the lock and for what; `token` tells this holder's lock from one taken after a forced unlock."""

    user: str
    host: str
    pid: int
    time: str
    purpose: str   # what the holder is doing: "deploy glm5-nvfp4", "venv build", ...
    token: str

    def to_json(self) -> bytes:
        return json_line({"user": self.user, "host": self.host, "pid": self.pid, "time": self.time,
                           "purpose": self.purpose, "token": self.token})

    @classmethod
    def from_json(cls, text: str) -> LockOwner:
        data = json.loads(text)
        # owner.json written before `purpose` existed names the release being deployed
        purpose = data["purpose"] if "purpose" in data else f"deploy of release {data['release']}"
        return cls(user=str(data["user"]), host=str(data["host"]), pid=int(data["pid"]), time=str(data["time"]),
                   purpose=str(purpose), token=str(data["token"]))

    def __str__(self) -> str:
        return f"{self.user}@{self.host} (pid {self.pid}) since {self.time} ({self.purpose})"


def this_process_owner(purpose: str, now: datetime) -> LockOwner:
    return LockOwner(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid(), time=iso_time(now),
                     purpose=purpose, token=secrets.token_hex(8))


@dataclass(frozen=True)
class LockInfo:
    owner: LockOwner | None  # None: owner.json missing or unreadable
    age_s: float             # from the lock directory's mtime, by the host's own clock


@dataclass(frozen=True)
class DamagedRelease:
    """A release directory the tool cannot use: a file missing, or a release.json it cannot read."""

    id: str
    reason: str   # names the file: "release.json is not valid JSON (...)", "sglang.env is missing"


@dataclass(frozen=True)
class StoreFacts:
    current: str | None
    releases: tuple[ReleaseRecord, ...]   # complete releases (with a readable release.json), oldest first
    incomplete: tuple[str, ...]           # leftover staging directories (<id>.tmp) of interrupted runs
    history: tuple[HistoryEntry, ...]     # the tail of history.jsonl, oldest first
    lock: LockInfo | None
    unreadable_history_lines: int = 0
    damaged: tuple[DamagedRelease, ...] = ()   # every other entry of releases/, with what is wrong with it

    def release(self, release_id: str) -> ReleaseRecord | None:
        return next((r for r in self.releases if r.id == release_id), None)

    def damaged_release(self, release_id: str) -> DamagedRelease | None:
        return next((d for d in self.damaged if d.id == release_id), None)

    def current_problem(self) -> str | None:
        """Why the release `current` points at cannot be read: damaged or missing; None when it is fine (or none)."""
        if self.current is None or self.release(self.current) is not None:
            return None
        damaged = self.damaged_release(self.current)
        if damaged is not None:
            return f"current release {self.current} is damaged: {damaged.reason}"
        return f"current release {self.current} is missing: its directory releases/{self.current} is gone"

    def last_healthy(self, exclude: str | None = None) -> str | None:
        """The newest release that history records as healthy and that is still on the host.

        A release left down by a crash since (a `crash` line that was not restarted) no longer counts."""
        present = {r.id for r in self.releases} - {exclude}
        for entry in reversed(self.history):
            if entry.event == "crash" and entry.outcome == FAILED:
                present.discard(entry.tags.release)
            if entry.outcome == HEALTHY and entry.event in ACTIVATIONS and entry.tags.release in present:
                return entry.tags.release
        return None

    def recorded_healthy(self, release_id: str) -> bool:
        """History's last word on what serves names this release healthy: nothing switched, failed, stopped or gave
        up since (a crash the unit restarted from is left to the live probe)."""
        latest = next((entry for entry in reversed(self.history)
                       if entry.event in (*ACTIVATIONS, "failure", "crash", "stop")
                       and not (entry.event == "crash" and entry.outcome == RESTARTED)), None)
        return latest is not None and latest.tags.release == release_id and latest.outcome == HEALTHY

    def outcomes(self) -> dict[str, str]:
        """Each release's latest start outcome from history (for `invoke releases`); `crashed` when a
        crash that systemd did not restart (the start limit, or Restart=no) came after it."""
        outcomes = {}
        for entry in self.history:
            if entry.event in ACTIVATIONS:
                outcomes[entry.tags.release] = entry.outcome
            elif entry.event == "crash" and entry.outcome == FAILED:
                outcomes[entry.tags.release] = CRASHED
        return outcomes


def parse_current(readlink_out: str) -> str | None:
    target = readlink_out.removesuffix("\n")
    if not target:
        return None
    return PurePosixPath(target).name


def parse_release_dirs(find_out: str) -> dict[str, frozenset[str]]:
    """Each entry of releases/ with the names of the files in it, from `find -printf %P\\0` to depth 2."""
    entries: dict[str, set[str]] = {}
    for path in filter(None, find_out.split("\0")):
        name, _, file = path.partition("/")
        entries.setdefault(name, set()).update([file] if file else [])
    return {name: frozenset(files) for name, files in sorted(entries.items())}


def release_problem(files: frozenset[str], release_json_text: str | None) -> str | None:
    """What makes a release directory unusable, naming the file; None when it is complete and readable."""
    if RELEASE_FILE not in files:
        return f"{RELEASE_FILE} is missing"
    if release_json_text is None or not release_json_text.strip():
        return f"{RELEASE_FILE} is empty or not text"
    try:
        metadata = json.loads(release_json_text)
    except ValueError as error:
        return f"{RELEASE_FILE} is not valid JSON ({error})"
    if not isinstance(metadata, dict):
        return f"{RELEASE_FILE} is not a JSON object"
    missing = [name for name in (UNIT_FILE, ENV_FILE) if name not in files]
    return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else None


def parse_release_files(layout: StoreLayout, grep_out: str) -> dict[str, str]:
    """release id -> text of its release.json, from `grep -H -Z` output ("path\\0line\\n" per line).

    A path may hold newlines, a line of a file may not: so split on NUL, then each piece at its first newline.
    """
    prefix, suffix = f"{layout.releases}/", f"/{RELEASE_FILE}"
    pieces = grep_out.split("\0")
    texts: dict[str, list[str]] = {}
    path = pieces[0]
    for piece in pieces[1:]:
        line, _, next_path = piece.partition("\n")
        if path.startswith(prefix) and path.endswith(suffix):
            texts.setdefault(path[len(prefix):-len(suffix)], []).append(line)
        path = next_path
    return {release_id: "\n".join(lines) for release_id, lines in texts.items()}


def parse_history(tail_out: str) -> tuple[tuple[HistoryEntry, ...], int]:
    """Entries oldest first, and how many lines could not be read (a cut-off last line, a hand edit)."""
    entries, unreadable = [], 0
    for line in tail_out.splitlines():
        if not line.strip():
            continue
        try:
            entries.append(HistoryEntry.from_json(line))
        except (ValueError, KeyError, TypeError):
            unreadable += 1
    return tuple(entries), unreadable


def parse_lock(clock_out: str, stat: StepResult, owner: StepResult) -> LockInfo | None:
    if stat.exit_code != 0:
        return None
    try:
        lock_owner: LockOwner | None = LockOwner.from_json(owner.stdout) if owner.exit_code == 0 else None
    except (ValueError, KeyError, TypeError):
        lock_owner = None
    return LockInfo(lock_owner, max(float(clock_out.strip()) - float(stat.stdout.strip()), 0.0))


def parse_lock_facts(results: Sequence[StepResult] | Readings) -> LockInfo | None:
    found = Readings.of(results)
    return parse_lock(found[FACT_CLOCK].stdout, found[FACT_LOCK], found[FACT_LOCK_OWNER])


def parse_store_facts(layout: StoreLayout, results: Sequence[StepResult] | Readings) -> StoreFacts:
    """StoreFacts from the results of `release_fact_steps` (they may be part of a larger batch)."""
    found = Readings.of(results)
    stdout = found.stdout
    releases, incomplete, damaged = [], [], []
    texts = parse_release_files(layout, stdout(FACT_RELEASE_FILES))
    for name, files in parse_release_dirs(stdout(FACT_RELEASE_DIRS)).items():
        problem = release_problem(files, texts.get(name))
        if name.endswith(STAGING_SUFFIX):
            incomplete.append(name)
        elif problem is not None:
            damaged.append(DamagedRelease(name, problem))
        else:
            metadata = json.loads(texts[name])
            releases.append(ReleaseRecord(name, str(metadata.get("staged_at", "")), metadata))
    history, unreadable = parse_history(stdout(FACT_HISTORY))
    return StoreFacts(
        current=parse_current(stdout(FACT_CURRENT)),
        releases=tuple(sorted(releases, key=lambda r: (r.staged_at, r.id))),
        incomplete=tuple(incomplete),
        history=history,
        lock=parse_lock_facts(found),
        unreadable_history_lines=unreadable,
        damaged=tuple(damaged),
    )


def read_store_facts(remote: Remote, layout: StoreLayout) -> StoreFacts:
    return parse_store_facts(layout, read(remote, release_fact_steps(layout)))


# ---------------------------------------------------------------------------------------------------------
# Pruning


def releases_to_prune(facts: StoreFacts, keep: int) -> tuple[str, ...]:
    """Release directories beyond the newest `keep`, never current, the last healthy, nor the one `rollback` returns
    to, plus leftover staging directories and damaged releases (a release the tool cannot read can never be rolled
    back to)."""
    if keep < 1:
        raise ConfigError(f"keep must be at least 1, got {keep}")
    protected = {facts.current, facts.last_healthy(), facts.last_healthy(exclude=facts.current)}
    newest = {r.id for r in facts.releases[-keep:]}
    doomed = [r.id for r in facts.releases if r.id not in newest | protected]
    unusable = [*facts.incomplete, *(damaged.id for damaged in facts.damaged)]
    return tuple(doomed + [name for name in unusable if name not in protected])


def describe_pruned_releases(facts: StoreFacts, release_dirs: Sequence[str]) -> list[str]:
    """One phrase per removed directory, for the user and history: a damaged release says what was wrong."""
    phrases = []
    for name in release_dirs:
        damaged = facts.damaged_release(name)
        if damaged is not None:
            phrases.append(f"damaged release {name} ({damaged.reason})")
        else:
            phrases.append(f"unfinished release {name}" if name.endswith(STAGING_SUFFIX) else f"release {name}")
    return phrases


def prune_releases(layout: StoreLayout, release_dirs: Sequence[str]) -> list[Step | Put]:
    if not release_dirs:
        return []
    for name in release_dirs:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"refusing to prune {name!r}: not a release directory name")
    return [Step("prune releases", ("rm", "-rf", "--", *(str(layout.releases / name) for name in release_dirs)),
                 sudo=True, timeout_s=300)]


# ---------------------------------------------------------------------------------------------------------
# Lock (Kamal's: mkdir is the atomic test-and-set, owner.json says who)


LOCK_TAKE = "lock: take"
LOCK_STILL_OURS = "lock: still ours"


def acquire_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    return [
        Step("lock: store directory", ("mkdir", "-p", "--", str(layout.base)), sudo=True),
        Step(LOCK_TAKE, ("mkdir", "--", str(layout.lock)), sudo=True),
        Put(layout.lock_owner, owner.to_json(), FILE_MODE, sudo=True),
    ]


def release_lock(layout: StoreLayout, owner: LockOwner) -> list[Step | Put]:
    """Remove the lock only if it is still ours (someone may have forced it open and taken it since)."""
    token = f'"token":"{owner.token}"'
    return [
        Step(LOCK_STILL_OURS, ("grep", "-q", "-F", "-e", token, "--", str(layout.lock_owner))),
        Step("lock: release", ("rm", "-rf", "--", str(layout.lock)), sudo=True),
    ]


def remove_lock(layout: StoreLayout) -> list[Step | Put]:
    return [Step("lock: remove", ("rm", "-rf", "--", str(layout.lock)), sudo=True)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def lock_staleness(lock: LockInfo, this_host: str, is_alive: Callable[[int], bool],
                   stale_after_s: float = STALE_LOCK_AFTER_S) -> str | None:
    """Why the lock looks abandoned, or None while its owner may still be working."""
    owner = lock.owner
    if owner is not None and owner.host == this_host and not is_alive(owner.pid):
        return f"its owner, pid {owner.pid} on this machine ({this_host}), is no longer running"
    if owner is None and lock.age_s > OWNERLESS_LOCK_GRACE_S:
        return f"it has no readable owner.json and is {lock.age_s:.0f} s old"
    if lock.age_s > stale_after_s:
        return f"it is {lock.age_s / 3600:.1f} h old (stale after {stale_after_s / 3600:.1f} h)"
    return None


def lock_held_error(where: str, lock: LockInfo, staleness: str | None) -> LockHeld:
    holder = str(lock.owner) if lock.owner else "an unknown owner (no readable owner.json)"
    message = f"the deploy lock on {where} is held by {holder}; lock age {lock.age_s:.0f} s"
    if staleness:
        return LockHeld(f"{message}; it looks stale: {staleness}",
                        hint="`invoke unlock` removes it")
    return LockHeld(message, hint="wait for that run to finish; if you are sure it is gone, "
                                  "`invoke unlock --force` removes the lock")


@dataclass(frozen=True)
class LockContext:
    """What lock decisions need to know about this machine; injectable for tests."""

    where: str                                   # the target host, for messages
    this_host: str = field(default_factory=socket.gethostname)
    is_alive: Callable[[int], bool] = pid_alive
    stale_after_s: float = STALE_LOCK_AFTER_S


def read_lock(remote: Remote, layout: StoreLayout) -> LockInfo | None:
    return parse_lock_facts(read(remote, lock_fact_steps(layout)))


def take_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> None:
    """Take the lock, or raise LockHeld naming its owner (and whether it looks stale)."""
    try:
        remote.run(acquire_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_TAKE:
            raise
        lock = read_lock(remote, layout)
        if lock is None:
            raise  # mkdir failed and no lock exists: not contention (read-only or full filesystem, ...)
        raise lock_held_error(context.where, lock,
                              lock_staleness(lock, context.this_host, context.is_alive, context.stale_after_s)
                              ) from None


@contextmanager
def holding_lock(remote: Remote, layout: StoreLayout, owner: LockOwner, context: LockContext) -> Iterator[LockOwner]:
    """Hold the lock for the block; released on any exit, Ctrl-C included, if it is still ours."""
    try:
        take_lock(remote, layout, owner, context)
    except KeyboardInterrupt:  # the host may have taken it before the interrupt reached this process
        _release_quietly(remote, layout, owner)
        raise
    try:
        yield owner
    except BaseException:
        _release_quietly(remote, layout, owner)
        raise
    try:
        remote.run(release_lock(layout, owner))
    except StepFailed as failure:
        if getattr(failure.step, "name", None) != LOCK_STILL_OURS:
            raise
        raise LockHeld(f"the deploy lock on {context.where} was no longer ours at the end of this run "
                       "(forced open and taken by someone else?); it was left in place",
                       hint="`invoke unlock` shows who holds it now") from failure


def _release_quietly(remote: Remote, layout: StoreLayout, owner: LockOwner) -> None:
    try:
        remote.run(release_lock(layout, owner))
    except DeployError:
        pass  # the error that is propagating matters more than a lock left behind


# Locks this process holds, by (remote, lock path): a library call that changes the host takes the lock itself, and
# one that runs inside another (patch-fusion's deploy, deploy's venv build) reuses it, as Kamal's `holding_lock?`.
_HELD: dict[tuple[int, str], LockOwner] = {}


@contextmanager
def host_lock(remote: Remote, layout: StoreLayout, purpose: str, where: str,
              context: LockContext | None = None) -> Iterator[LockOwner]:
    """The one lock for every change to a service's store on a host: deploy, rollback, venv build/adopt/derive,
    patching, prune. Re-entrant within this process; released on any exit, Ctrl-C included (`holding_lock`)."""
    key = (id(remote), str(layout.lock))
    if key in _HELD:
        yield _HELD[key]
        return
    owner = this_process_owner(purpose, datetime.now(UTC))
    with holding_lock(remote, layout, owner, context or LockContext(where=where)) as held:
        _HELD[key] = held
        try:
            yield held
        finally:
            del _HELD[key]


def unlock(remote: Remote, layout: StoreLayout, force: bool, context: LockContext) -> LockInfo | None:
    """Remove the lock if stale, or if `force`; returns what was removed (None: there was no lock)."""
    lock = read_lock(remote, layout)
    if lock is None:
        return None
    staleness = lock_staleness(lock, context.this_host, context.is_alive, context.stale_after_s)
    if staleness is None and not force:
        raise lock_held_error(context.where, lock, None)
    remote.run(remove_lock(layout))
    return lock
