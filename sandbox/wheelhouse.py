"""Sandbox wheelhouse: the real sglang + flashinfer-python wheels, msgspec, and the sim wheel, cached outside
the clone under ${SGLANG_DEPLOY_CACHE:-/var/tmp/sglang-deploy-cache}. The guest has no network, so these are
what its venv is built from.

    python sandbox/wheelhouse.py [--sglang 0.5.23] [--flashinfer 0.7.2]   # download + build, print the paths
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parent / "sim"
DEFAULT_SGLANG = "0.5.23"
DEFAULT_FLASHINFER = "0.7.2"  # the version sglang 0.5.23 pins
# sglang's argument tables are msgspec Structs (>= 0.5.15), so the argv check needs the real msgspec
ARGCHECK_DEPENDENCIES = ("msgspec",)


def cache_root() -> Path:
    return Path(os.environ.get("SGLANG_DEPLOY_CACHE", "/var/tmp/sglang-deploy-cache"))


def wheel_dir() -> Path:
    return cache_root() / "wheels"


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def find_wheel(dist: str, version: str | None = None) -> Path | None:
    """Newest cached wheel of dist (of that version, if given) that this interpreter can install."""
    prefix = f"{_normalise(dist)}-{version}-" if version else f"{_normalise(dist)}-"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = [p for p in wheel_dir().glob("*.whl") if p.name.lower().startswith(prefix.lower())
             and ("-py3-none-" in p.name or f"-{tag}-" in p.name)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def download(dist: str, version: str | None = None) -> Path:
    """`pip download --no-deps` into the shared wheel cache (pip reuses a file already there)."""
    cached = find_wheel(dist, version)
    if cached is not None:
        return cached
    wheel_dir().mkdir(parents=True, exist_ok=True)
    requirement = f"{dist}=={version}" if version else dist
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--dest", str(wheel_dir()), requirement], check=True)
    wheel = find_wheel(dist, version)
    if wheel is None:
        raise FileNotFoundError(f"pip download {requirement} left no installable wheel in {wheel_dir()}")
    return wheel


def build_sim_wheel() -> Path:
    """Build sandbox/sim with its own PEP 517 backend into <cache>/sim/ (a fresh wheel every call)."""
    out = cache_root() / "sim"
    out.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.spec_from_file_location("sglang_sim_build_backend", SIM_DIR / "build_backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    return out / backend.build_wheel(str(out))


@dataclass(frozen=True)
class Wheelhouse:
    sglang: Path
    flashinfer: Path
    dependencies: tuple[Path, ...]
    sim: Path

    @property
    def wheels(self) -> tuple[Path, ...]:
        return (self.sglang, self.flashinfer, *self.dependencies, self.sim)


def prepare(sglang_version: str = DEFAULT_SGLANG, flashinfer_version: str = DEFAULT_FLASHINFER) -> Wheelhouse:
    return Wheelhouse(
        sglang=download("sglang", sglang_version),
        flashinfer=download("flashinfer-python", flashinfer_version),
        dependencies=tuple(download(dist) for dist in ARGCHECK_DEPENDENCIES),
        sim=build_sim_wheel(),
    )


def install_argv(python: str, wheels: tuple[Path, ...] | tuple[str, ...]) -> list[str]:
    """pip command that installs the wheelhouse into a venv: no index, no dependencies resolved."""
    return [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
            "--disable-pip-version-check", *map(str, wheels)]


def build_local_venv(venv: Path, house: Wheelhouse) -> Path:
    """A venv on this machine with the wheelhouse installed (for the sim's loopback tests).

    Reused while it holds the same wheels (the sim wheel is compared by content); concurrent callers wait on a
    lock next to it.
    """
    venv.parent.mkdir(parents=True, exist_ok=True)
    marker = venv / ".sglang-sim-wheels"
    wanted = "\n".join([*(p.name for p in house.wheels[:-1]), hashlib.sha256(house.sim.read_bytes()).hexdigest()])
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = marker.read_text() if marker.exists() else ""
        if installed.splitlines()[:-1] != wanted.splitlines()[:-1]:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(install_argv(str(venv / "bin/python"), house.wheels[:-1]), check=True)
        if installed != wanted:
            subprocess.run([*install_argv(str(venv / "bin/python"), (house.sim,)), "--force-reinstall"], check=True)
            marker.write_text(wanted)
    return venv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang", default=DEFAULT_SGLANG)
    parser.add_argument("--flashinfer", default=DEFAULT_FLASHINFER)
    options = parser.parse_args()
    for wheel in prepare(options.sglang, options.flashinfer).wheels:
        print(wheel)


if __name__ == "__main__":
    main()
