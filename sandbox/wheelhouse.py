"""Sandbox wheelhouse: the real sglang + flashinfer-python wheels, msgspec, what SGLang's serving benchmark
imports, and the sim wheel, cached outside the clone under ${SGLANG_DEPLOY_CACHE:-/var/tmp/sglang-deploy-cache}.
The guest has no network, so these are what its venv is built from; beside them the pinned uv wheel, which builds
the tool's managed venvs (it is no part of a lock).

    python sandbox/wheelhouse.py [--sglang 0.5.23] [--flashinfer 0.7.2]   # download + build, print the paths
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy_lib.venvs import UV_VERSION
from sandbox.names import DEFAULT_FLASHINFER, DEFAULT_SGLANG

SIM_DIR = Path(__file__).resolve().parent / "sim"
# sglang's argument tables are msgspec Structs (>= 0.5.15), so the argv check needs the real msgspec
ARGCHECK_DEPENDENCIES = ("msgspec",)
# FlashInfer's JIT runs `ninja` by name (flashinfer/jit/cpp_ext.py run_ninja); sglang and flashinfer-python depend
# on the ninja wheel, which installs it into the venv's bin/
JIT_DEPENDENCIES = ("ninja",)
# Top-level imports of sglang/benchmark/serving.py (0.5.23) and of what it imports without torch
# (sglang.benchmark.{datasets,utils,goodput}, sglang.srt.utils.network); pins as sglang 0.5.23 pins them.
# (datasets, pillow and pybase64 are imported at the top of the image/mmmu dataset modules.)
BENCHMARK_REQUIREMENTS = ("aiohttp", "datasets", "msgspec", "numpy", "orjson", "pillow", "pybase64", "psutil",
                          "pyzmq>=25.1.2", "requests", "tokenizers==0.23.2", "tqdm", "transformers==5.19.0")


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
             and _installable_here(p.name, tag)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _installable_here(wheel_name: str, interpreter: str) -> bool:
    """Pure-Python (py3, py2.py3, py311) and this interpreter's wheels, and stable-ABI (abi3) ones (x86_64 Linux)."""
    python_tags, abi = wheel_name.removesuffix(".whl").split("-")[-3:-1]
    accepted = {"py3", interpreter, interpreter.replace("cp", "py")}
    return bool(accepted & set(python_tags.split("."))) or abi == "abi3"


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


def download_with_dependencies(requirements: tuple[str, ...]) -> tuple[Path, ...]:
    """The wheels of the requirements and their dependencies (binary only): `pip download`ed once, then named.

    The resolution is done offline against the cache (`pip install --dry-run --report`), so the answer is the
    exact set pip would install, whatever else the flat cache holds; only when the cache cannot satisfy it does
    pip go to the index (a test session's setup then costs one offline resolution, not a round of downloads)."""
    wheel_dir().mkdir(parents=True, exist_ok=True)
    resolve = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--no-index",
               "--find-links", str(wheel_dir()), "--only-binary=:all:", "--report", "-", *requirements]
    offline = subprocess.run(resolve, capture_output=True, text=True)
    if offline.returncode != 0:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                                  "--dest", str(wheel_dir()), *requirements], capture_output=True, text=True)
        if fetched.returncode != 0:
            raise RuntimeError(f"pip download {' '.join(requirements)} failed:\n{fetched.stderr[-2000:]}")
    report = offline.stdout if offline.returncode == 0 else subprocess.run(
        resolve, check=True, capture_output=True, text=True).stdout
    wheels = []
    for item in json.loads(report)["install"]:
        metadata = item["metadata"]
        wheel = find_wheel(metadata["name"], metadata["version"])
        if wheel is None:
            raise FileNotFoundError(f"{metadata['name']} {metadata['version']}: no wheel in {wheel_dir()}")
        wheels.append(wheel)
    return tuple(sorted(wheels))


def _sim_source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in SIM_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(SIM_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_sim_wheel() -> Path:
    """Build sandbox/sim with its own PEP 517 backend into <cache>/sim/<source digest>/.

    Keyed by the source's digest, so test runs of different checkouts sharing the cache never overwrite each
    other's simulator; the wheel is built in a temporary folder and renamed into place whole.
    """
    out = cache_root() / "sim" / _sim_source_digest()
    built = sorted(out.glob("*.whl"))
    if built:
        return built[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.spec_from_file_location("sglang_sim_build_backend", SIM_DIR / "build_backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f"{out.name}."))
    name = backend.build_wheel(str(staging))
    try:
        staging.rename(out)
    except OSError:  # another run published the same source first
        shutil.rmtree(staging, ignore_errors=True)
    return out / name


@dataclass(frozen=True)
class Wheelhouse:
    sglang: Path
    flashinfer: Path
    dependencies: tuple[Path, ...]
    benchmark: tuple[Path, ...]  # what the serving benchmark needs, without those in `dependencies`
    sim: Path
    uv: Path  # the installer deploy_lib.venvs pins (UV_VERSION), for wheelhouse directories of venv_build

    @property
    def wheels(self) -> tuple[Path, ...]:
        """What a venv of the sandbox holds (and its lock pins)."""
        return (self.sglang, self.flashinfer, *self.dependencies, *self.benchmark, self.sim)

    def link_into(self, directory: Path, *others: Path) -> Path:
        """A wheelhouse directory for `service.venv_build`: symlinks to these wheels, uv's and `others`."""
        directory.mkdir(parents=True, exist_ok=True)
        for wheel in (*self.wheels, self.uv, *others):
            if not (directory / wheel.name).exists():
                (directory / wheel.name).symlink_to(wheel)
        return directory


def prepare(sglang_version: str = DEFAULT_SGLANG, flashinfer_version: str = DEFAULT_FLASHINFER) -> Wheelhouse:
    dependencies = tuple(download(dist) for dist in (*ARGCHECK_DEPENDENCIES, *JIT_DEPENDENCIES))
    return Wheelhouse(
        sglang=download("sglang", sglang_version),
        flashinfer=download("flashinfer-python", flashinfer_version),
        dependencies=dependencies,
        benchmark=tuple(w for w in download_with_dependencies(BENCHMARK_REQUIREMENTS) if w not in dependencies),
        sim=build_sim_wheel(),
        uv=download("uv", UV_VERSION),
    )


def router_wheelhouse() -> Path:
    """<cache>/router-wheels-<version>: links to the wheels of the router's lock and uv's, the directory a router
    host without internet builds its venv from (`router_wheelhouse`). Every version is the lock's: resolving
    sglang-router alone takes the newest dependencies PyPI has today, which the lock's hashes refuse."""
    from deploy_lib.ops.router import DEFAULT_LOCK, ROUTER_VERSION
    from deploy_lib.venvs.lock import load_lock
    pins = tuple(f"{name}=={version}" for name, version in load_lock(DEFAULT_LOCK).distributions().items())
    directory = cache_root() / f"router-wheels-{ROUTER_VERSION}"
    directory.mkdir(parents=True, exist_ok=True)
    wheels = (*download_with_dependencies(pins), download("uv", UV_VERSION))
    for stale in set(directory.iterdir()) - {directory / w.name for w in wheels}:  # an earlier lock's links
        stale.unlink()
    for wheel in wheels:
        if not (directory / wheel.name).exists():
            (directory / wheel.name).symlink_to(wheel)
    return directory


def install_argv(python: str, wheels: tuple[Path, ...] | tuple[str, ...]) -> list[str]:
    """pip command that installs the wheelhouse into a venv: no index, no dependencies resolved."""
    return [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
            "--disable-pip-version-check", *map(str, wheels)]


def build_local_venv(venv: Path, house: Wheelhouse) -> Path:
    """A venv on this machine with the wheelhouse installed (for the sim's loopback tests): `<venv>-<digest>`.

    Named by the digest of its wheels (the sim's by content), so it is never changed once built and runs of
    different checkouts sharing the cache each get their own; concurrent callers wait on a lock next to it.
    """
    wanted = "\n".join([*(p.name for p in house.wheels[:-1]), hashlib.sha256(house.sim.read_bytes()).hexdigest()])
    keyed = venv.with_name(f"{venv.name}-{hashlib.sha256(wanted.encode()).hexdigest()[:12]}")
    keyed.parent.mkdir(parents=True, exist_ok=True)
    marker = keyed / ".sglang-sim-wheels"
    with (keyed.parent / f"{keyed.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists() or marker.read_text() != wanted:
            shutil.rmtree(keyed, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(keyed)], check=True)
            subprocess.run(install_argv(str(keyed / "bin/python"), house.wheels), check=True)
            marker.write_text(wanted)
    return keyed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang", default=DEFAULT_SGLANG)
    parser.add_argument("--flashinfer", default=DEFAULT_FLASHINFER)
    options = parser.parse_args()
    for wheel in prepare(options.sglang, options.flashinfer).wheels:
        print(wheel)


if __name__ == "__main__":
    main()


def write_lock(path: Path, wheels: Sequence[Path]) -> Path:
    """A lock of these wheels in pip-compile's layout, each hashed with hashlib (what `pip hash` prints)."""
    lines = [f"# generated from the sandbox wheelhouse ({len(wheels)} wheels)"]
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        lines += [f"{name}=={version} \\", f"    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"]
    path.write_text("\n".join(lines) + "\n")
    return path
