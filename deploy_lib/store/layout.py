"""Paths of one service's release store, its file names and modes, and the format of every file it writes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.digests import short_hash
from deploy_lib.errors import ConfigError

DEFAULT_ROOT = PurePosixPath("/opt/sglang-deploy")
SYSTEMD_DIR = PurePosixPath("/etc/systemd/system")
UNIT_FILE = "sglang.service"
ENV_FILE = "sglang.env"
LAUNCHER_FILE = "launch"  # the server's command (render_launcher); the unit runs current's
RELEASE_FILE = "release.json"
FILE_MODE = 0o644      # the unit, release.json, the lock owner: anyone may read them
ENV_FILE_MODE = 0o600  # the env file carries the secrets
LAUNCHER_MODE = 0o755  # run by the unit's User=
STAGING_SUFFIX = ".tmp"  # a directory still being written (release, pushed model version); renamed when complete


_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*$")
_RELEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_release_id(release_id: str, flag: str | None = None) -> str:
    """The release id, refused when no release could have it; `flag`: the option that gave it, named first."""
    if not _RELEASE_ID.fullmatch(release_id) or release_id.endswith(STAGING_SUFFIX):
        raise ConfigError((f"{flag}: " if flag else "") + f"invalid release id {release_id!r}",
                          hint="a release id is letters, digits, '.', '_' or '-' (see `invoke releases`)")
    return release_id


def check_service_name(service: str, flag: str | None = None) -> str:
    """The service name, refused when no systemd unit could have it; `flag`: the option that gave it, named first."""
    if not _UNIT_NAME.fullmatch(service) or service.endswith(".service"):
        raise ConfigError((f"{flag}: " if flag else "") + f"invalid service name {service!r}",
                          hint="use a systemd unit name without the .service suffix, e.g. sglang")
    return service


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one service's release store on the host."""

    service: str
    root: PurePosixPath = DEFAULT_ROOT
    unit_dir: PurePosixPath = SYSTEMD_DIR

    def __post_init__(self) -> None:
        check_service_name(self.service)
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

    def sglang_facts_dir(self, venv: str | PurePosixPath) -> PurePosixPath:
        """Where facts.py keeps what the venv at this path holds of SGLang (its options, versions), root's, verified
        on each read: named by the venv's path, which for a managed venv is its content hash."""
        return self.base / "facts" / short_hash(str(PurePosixPath(venv)))

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
        """The env file of one release: what the router's unit of that release names in EnvironmentFile= (a
        server's unit names current's, so that its text is the same for every release)."""
        return self.release(release_id) / ENV_FILE


def iso_time(when: datetime) -> str:
    """A timestamp as the store writes it (history, release.json, lock owner, venv markers): UTC, to the second."""
    if when.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return when.astimezone(UTC).isoformat(timespec="seconds")


def json_line(data: Mapping[str, Any]) -> bytes:
    """One line of canonical JSON (sorted keys, no spaces), as every JSON file and log line of the store."""
    return (json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
