"""Which local wheels a lock needs for the host's python and platform, which of them the host lacks, and the pinned
uv wheel that builds the venv. A wheel's bytes are read (and their hash checked) only when it travels.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from deploy_lib.digests import sha256_bytes
from deploy_lib.errors import ConfigError, DeployError
from deploy_lib.remote import Put
from deploy_lib.venvs.interpreter import PythonFacts
from deploy_lib.venvs.lock import Lock
from deploy_lib.venvs.paths import canonical_name

WHEEL_MODE = 0o644
# The installer: uv from PyPI, pinned by version and by the sha256 of its wheel per host machine (as PyPI serves
# them); the binary is the wheel's uv-<version>.data/scripts/uv.
UV_VERSION = "0.13.9"
UV_WHEELS = {
    "x86_64": ("uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
               "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"),
    "aarch64": ("uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
                "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe"),
}
UV_BINARY_MEMBER = f"uv-{UV_VERSION}.data/scripts/uv"
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                       r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _python_tag_fits(tag: str, abis: Sequence[str], major: str, minor: str) -> bool:
    if tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"):
        return True
    # an abi3 wheel built for an older CPython 3.x runs on a newer one
    built_for = tag.removeprefix(f"cp{major}")
    return "abi3" in abis and tag.startswith(f"cp{major}") and built_for.isdigit() and int(built_for) <= int(minor)


def wheel_fits(filename: str, python: PythonFacts) -> bool:
    """Whether pip on that interpreter could install this wheel (python tag, ABI and platform of its name)."""
    match = _WHEEL_RE.match(filename)
    if match is None:
        return False
    major, minor = python.version.split(".")[:2]
    pythons, abis, platforms = (match.group(key).split(".") for key in ("py", "abi", "plat"))
    return (any(_python_tag_fits(tag, abis, major, minor) for tag in pythons)
            and any(abi in ("none", "abi3", f"cp{major}{minor}") for abi in abis)
            and any(plat == "any" or (plat.startswith(("linux_", "manylinux")) and plat.endswith(python.machine))
                    for plat in platforms))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as wheel:
        while chunk := wheel.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LocalWheel:
    path: Path
    sha256: str
    size: int


def wheels_on_host(lock: Lock, on_host: frozenset[str]) -> frozenset[str]:
    """The sha256 of each wheel the lock lists that the host already has: neither read here nor sent."""
    return frozenset(sha for requirement in lock.requirements for sha in requirement.hashes & on_host)


def select_wheels(lock: Lock, wheelhouse: Path, python: PythonFacts,
                  on_host: frozenset[str] = frozenset()) -> tuple[LocalWheel, ...]:
    """For each requirement the host has no wheel of, the wheelhouse files with its name and version whose sha256
    the lock lists (a requirement with a hash in `on_host` is skipped: its wheels are not even read).

    A wheel of the right name and version with another hash (corrupted, or a different build) is an error
    here, before anything travels; so is a requirement without a wheel for the host's python and platform,
    unless it has an environment marker (`; sys_platform == "win32"`), which uv evaluates on the host.
    """
    if not wheelhouse.is_dir():
        raise ConfigError(f"wheelhouse {wheelhouse} is not a directory")
    by_release: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        match = _WHEEL_RE.match(path.name)
        if match:
            by_release.setdefault((canonical_name(match.group("name")), match.group("version").lower()),
                                  []).append(path)
    selected = []
    for requirement in lock.requirements:
        if requirement.hashes & on_host:
            continue
        candidates = [p for p in by_release.get((requirement.name, requirement.version.lower()), [])
                      if wheel_fits(p.name, python)]
        if not candidates and requirement.marker:
            continue  # uv skips it when the marker is false on the host, and names it when it is true
        if not candidates:
            raise ConfigError(f"{lock.path}:{requirement.line}: no wheel of {requirement.name}=={requirement.version} "
                              f"for {python.identity()} in {wheelhouse}",
                              hint=f"pip download --no-deps --only-binary=:all: --dest {wheelhouse} "
                                   f"{requirement.name}=={requirement.version}")
        digests = {path: _file_sha256(path) for path in candidates}
        matching = [LocalWheel(path, digest, path.stat().st_size) for path, digest in digests.items()
                    if digest in requirement.hashes]
        if not matching:
            listed = ", ".join(f"{path.name} sha256 {digest}" for path, digest in digests.items())
            raise ConfigError(f"{lock.path}:{requirement.line}: hash mismatch for {requirement.name}=="
                              f"{requirement.version}: the lock does not list the sha256 of {listed}",
                              hint="the wheel is corrupted or a different build than the lock was made from: "
                                   "download it again, or regenerate the lock")
        selected.extend(matching)
    return tuple(selected)


def uv_wheel(python: PythonFacts) -> tuple[str, str]:
    """(file name, sha256) of the pinned uv wheel for the host's machine."""
    pinned = UV_WHEELS.get(python.machine)
    if pinned is None:
        raise ConfigError(f"no uv wheel is pinned for {python.machine} hosts (uv builds the venvs)",
                          hint=f"uv {UV_VERSION} is pinned for {', '.join(sorted(UV_WHEELS))} hosts (UV_WHEELS in "
                               "deploy_lib/venvs/wheels.py)")
    return pinned


def select_uv_wheel(wheelhouse: Path, python: PythonFacts) -> LocalWheel:
    """The pinned uv wheel in the wheelhouse, its sha256 checked against the pin."""
    filename, expected = uv_wheel(python)
    platform_tag = filename.removesuffix(".whl").split("-")[-1].split(".")[0]
    hint = (f"pip download --no-deps --only-binary=:all: --platform {platform_tag} --dest {wheelhouse} "
            f"uv=={UV_VERSION}")
    path = wheelhouse / filename
    if not path.is_file():
        raise ConfigError(f"the wheelhouse {wheelhouse} has no {filename}: uv {UV_VERSION} builds the venv on the "
                          "host", hint=hint)
    digest = _file_sha256(path)
    if digest != expected:
        raise ConfigError(f"hash mismatch for {path}: sha256 {digest}, but uv {UV_VERSION} is pinned at {expected}",
                          hint=f"the wheel is corrupted or not PyPI's: download it again ({hint})")
    return LocalWheel(path, digest, path.stat().st_size)


@dataclass(frozen=True)
class WheelTransfer:
    """One local wheel the host lacks; its bytes are read (and their hash checked) only when it is sent."""

    wheel: LocalWheel
    dest: PurePosixPath

    def put(self) -> Put:
        data = self.wheel.path.read_bytes()
        if sha256_bytes(data) != self.wheel.sha256:
            raise DeployError(f"wheel {self.wheel.path} changed while deploying (sha256 no longer "
                              f"{self.wheel.sha256})", hint="rerun once the wheelhouse is stable")
        return Put(self.dest, data, WHEEL_MODE, sudo=True)
