"""The store's state in one read-only batch (where current points, the releases, history, the lock) and its
pure parsers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Readings
from deploy_lib.store.history import ACTIVATIONS, CRASHED, FAILED, HEALTHY, RESTARTED, HistoryEntry
from deploy_lib.store.layout import ENV_FILE, RELEASE_FILE, STAGING_SUFFIX, UNIT_FILE, StoreLayout
from deploy_lib.store.lock import (
    FACT_STORE_DIGEST,
    LockInfo,
    lock_fact_steps,
    parse_lock_facts,
    parse_store_digest,
    store_digest_step,
)

HISTORY_TAIL_LINES = 500
FACT_CURRENT = "store facts: current"
FACT_RELEASE_DIRS = "store facts: release directories"
FACT_RELEASE_FILES = "store facts: release.json files"
FACT_HISTORY = "store facts: history"


def release_fact_steps(layout: StoreLayout, history_lines: int = HISTORY_TAIL_LINES) -> list[Step]:
    """Read-only: the store's digest (read first: a change after it shows when the lock is taken), where current
    points, the release directories and their release.json, history, the lock."""
    releases = str(layout.releases)
    return [
        store_digest_step(layout),
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
    digest: str | None = None   # the store's state when it was read (lock_on_first_change compares it)

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

    def verified_since_switch(self, release_id: str) -> bool:
        """The last start history records is this release's, healthy: false for a release `current` was switched to
        by a command that never finished (killed, or its host went down before the readiness ladder ended)."""
        latest = next((entry for entry in reversed(self.history) if entry.event in ACTIVATIONS), None)
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
    recorded = metadata.get("files")
    # a launcher (rendered units run one) is needed where release.json records it
    needed = dict.fromkeys((UNIT_FILE, ENV_FILE, *(map(str, recorded) if isinstance(recorded, dict) else ())))
    missing = [name for name in needed if name not in files]
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
        digest=parse_store_digest(found.get(FACT_STORE_DIGEST)),
    )
