"""Where a venv's pieces live in the store, and what names them: the content hash of a venv, the sha256 of a wheel."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from deploy_lib.digests import HASH_CHARS
from deploy_lib.errors import ConfigError
from deploy_lib.store import STAGING_SUFFIX, StoreLayout

MARKER_FILE = "venv.json"
HASH_RE = re.compile(rf"^[0-9a-f]{{{HASH_CHARS}}}$")


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name: `Flashinfer_Python` -> `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_venv_hash(venv_hash: str) -> str:
    if not HASH_RE.fullmatch(venv_hash):
        raise ConfigError(f"invalid venv hash {venv_hash!r}", hint=f"a venv hash is {HASH_CHARS} hex digits "
                                                                    "(see `invoke venv.list`)")
    return venv_hash


def wheel_store(layout: StoreLayout) -> PurePosixPath:
    return layout.base / "wheels"


def tool_store(layout: StoreLayout) -> PurePosixPath:
    return layout.base / "tools"


def uv_binary(layout: StoreLayout, wheel_sha256: str) -> PurePosixPath:
    """The uv binary taken from the uv wheel with this sha256: content-addressed like the wheel it comes from."""
    return tool_store(layout) / wheel_sha256 / "uv"


def uv_cache(layout: StoreLayout) -> PurePosixPath:
    """uv's cache, beside venvs/ in the store, so that installing from it hard-links on the same filesystem."""
    return layout.base / "uv-cache"


def venv_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.venvs / check_venv_hash(venv_hash)


def staging_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.venvs / (check_venv_hash(venv_hash) + STAGING_SUFFIX)


def wheel_dir(layout: StoreLayout, sha256: str) -> PurePosixPath:
    return wheel_store(layout) / sha256


def cache_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.cache / check_venv_hash(venv_hash)


def release_venv_hash(layout: StoreLayout, venv: str) -> str | None:
    """The managed venv a release.json `venv` field names (a path under venvs/ or a bare hash); None otherwise."""
    path = PurePosixPath(venv)
    name = path.name if path.parent == layout.venvs else venv
    return name if HASH_RE.fullmatch(name) else None
