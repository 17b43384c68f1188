"""The one tag set, history.jsonl lines and release.json."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from deploy_lib.remote import Put, Step
from deploy_lib.store.layout import StoreLayout, iso_time, json_line

# Events that start a release and judge it (healthy or failed); `stop`, `crash`, `prune`, `bench` and `tune` (one
# measured candidate of a sweep, deploy_lib/tune/) judge no start.
ACTIVATIONS = ("deploy", "rollback", "adopt", "start", "restart")
# `lock`: a command took over the lock of an owner that was gone (lock.py, owner_gone); its cause says whose and why.
# `router`: what the router's clients saw while this replica was out of it and back (metrics/router_counters.py).
EVENTS = (*ACTIVATIONS, "failure", "bench", "crash", "prune", "stop", "tune", "lock", "router")
HEALTHY, FAILED, UNCHANGED, RESTARTED, STOPPED = "healthy", "failed", "unchanged", "restarted", "stopped"
TAKEN_OVER = "taken-over"
OUTCOMES = (HEALTHY, FAILED, UNCHANGED, RESTARTED, STOPPED, TAKEN_OVER)
CRASHED = "crashed"  # a release's outcome in `invoke releases` once systemd gave up restarting it


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
    tune: Mapping[str, str] = field(default_factory=dict)     # a sweep's line: its id, the candidate, the run

    def __post_init__(self) -> None:
        if self.event not in EVENTS or self.outcome not in OUTCOMES:
            raise ValueError(f"history entry: event must be one of {EVENTS} and outcome one of {OUTCOMES}, "
                             f"got {self.event!r}/{self.outcome!r}")

    def to_json(self) -> bytes:
        return json_line({"event": self.event, "outcome": self.outcome, "when": self.when,
                           **self.tags.as_dict(), "cause": self.cause, "timings": dict(self.timings),
                           "figures": dict(self.figures), **({"tune": dict(self.tune)} if self.tune else {})})

    @classmethod
    def from_json(cls, line: str) -> HistoryEntry:
        data = json.loads(line)
        return cls(event=data["event"], outcome=data["outcome"], when=data["when"], tags=Tags.from_dict(data),
                   cause=str(data.get("cause", "")),
                   timings={str(k): float(v) for k, v in dict(data.get("timings") or {}).items()},
                   figures={str(k): float(v) for k, v in dict(data.get("figures") or {}).items()},
                   tune={str(k): str(v) for k, v in dict(data.get("tune") or {}).items()})


def history_entry(event: str, outcome: str, tags: Tags, when: datetime, cause: str = "",
                  timings: Mapping[str, float] | None = None,
                  figures: Mapping[str, float] | None = None, tune: Mapping[str, str] | None = None) -> HistoryEntry:
    return HistoryEntry(event, outcome, iso_time(when), tags, cause, dict(timings or {}), dict(figures or {}),
                        dict(tune or {}))


# A line cut off by a power loss is ended first, so the new line is not glued to it (the torn one stays, counted as
# unreadable); then one write of one line on an O_APPEND file (concurrent appends never interleave), then fsync.
_APPEND = 'if [ -s "$1" ] && [ -n "$(tail -c 1 -- "$1")" ]; then echo >> "$1"; fi; cat >> "$1" && sync -- "$1"'


def append_history(layout: StoreLayout, entry: HistoryEntry) -> list[Step | Put]:
    return [Step("history: append", ("sh", "-c", _APPEND, "sh", str(layout.history)), sudo=True,
                 stdin=entry.to_json())]


def release_json(metadata: Mapping[str, Any], tags: Tags, staged_at: datetime) -> bytes:
    """release.json: the release's own metadata plus the tag set and when it was staged."""
    return json_line({**metadata, "tags": tags.as_dict(), "staged_at": iso_time(staged_at)})
