"""Real SGLang / FlashInfer wheels for tests: downloaded once, unpacked selectively, shared by every test run.

Layout (outside the clone): ${SGLANG_DEPLOY_CACHE:-/var/tmp/sglang-deploy-cache}/wheels/*.whl (flat, as
`pip download --dest` leaves it) and .../unpacked/<dist>-<version>/ (the selected members of that wheel).
A wheel already in wheels/ is never fetched again; a member already unpacked with the right size is not rewritten.
Concurrent test processes serialise on an flock in the cache directory.

Use in a test module:

    pytest_plugins = ("helpers.wheelcache",)  # registers the sglang_source fixture (tests/ is on sys.path under pytest)

    @pytest.mark.wheels
    def test_x(sglang_source):
        root = sglang_source("0.5.23")            # site-packages-like dir: root/sglang/srt/server_args.py
        fi = unpacked("flashinfer-python", "0.7.2", members=("flashinfer/*.py", "flashinfer/data/include/*.cuh"))
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from deploy_lib.host_scripts.sglang_options import extract

# fnmatch patterns over wheel member names; `*` also matches `/`. Python sources and the dist-info are all the
# extractor and the patch tests read; compiled extensions and data files are left in the wheel.
DEFAULT_MEMBERS: tuple[str, ...] = ("sglang/*.py", "*.dist-info/*")

# sglang >= 0.5.15 ships only platform wheels (cp311+ manylinux_2_34, as listed on PyPI); pin the
# target so the download does not depend on the interpreter or glibc running the tests.
PIP_TARGET = ("--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "--only-binary=:all:")


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_DEPLOY_CACHE") or "/var/tmp/sglang-deploy-cache")


@contextmanager
def _cache_lock() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".wheelcache.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _find_wheel(wheels: Path, dist: str, version: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    # Any build of one version holds the same Python sources; prefer the one pip would pick for 3.11.
    return next((w for w in found if "-py3-none-any" in w.name or "-cp311-" in w.name), found[0] if found else None)


def wheel_path(dist: str, version: str) -> Path:
    """The wheel of dist==version in the cache, downloaded with pip if it is not there yet."""
    wheels = cache_dir() / "wheels"
    wheel = _find_wheel(wheels, dist, version)
    if wheel is not None:
        return wheel
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels),
               *PIP_TARGET, f"{dist}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    wheel = _find_wheel(wheels, dist, version)
    if done.returncode != 0 or wheel is None:
        raise RuntimeError(f"pip download {dist}=={version} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wheel


def _safe_member(name: str) -> bool:
    return not name.startswith("/") and ".." not in Path(name).parts


def unpacked(dist: str, version: str, members: tuple[str, ...] = DEFAULT_MEMBERS) -> Path:
    """Directory holding the members of dist==version's wheel that match `members` (laid out like site-packages)."""
    dest = cache_dir() / "unpacked" / f"{dist}-{version}"
    marker = dest / f".members-{hashlib.sha256(repr(members).encode()).hexdigest()[:12]}"
    if marker.exists():
        return dest
    with _cache_lock():
        if marker.exists():
            return dest
        wheel = wheel_path(dist, version)
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                name = info.filename
                if info.is_dir() or not _safe_member(name) or not any(fnmatch.fnmatchcase(name, p) for p in members):
                    continue
                target = dest / name
                if target.is_file() and target.stat().st_size == info.file_size:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(f"{target.name}.part{os.getpid()}")
                partial.write_bytes(archive.read(info))
                os.replace(partial, target)
        marker.write_text(f"{wheel.name}\n{members!r}\n")
    return dest


@pytest.fixture(scope="session")
def sglang_source() -> Callable[[str], Path]:
    """Factory: version -> a site-packages-like directory with that SGLang wheel's Python sources and dist-info."""
    return lambda version: unpacked("sglang", version)


@pytest.fixture(scope="session")
def real_options(sglang_source: Callable[[str], Path]) -> Callable[[str], dict[str, Any]]:
    """Factory: version -> that SGLang release's launch options, read from its real server_args (once each)."""
    cache: dict[str, dict[str, Any]] = {}

    def get(version: str) -> dict[str, Any]:
        if version not in cache:
            cache[version] = extract(sglang_source(version))["options"]
        return cache[version]

    return get
