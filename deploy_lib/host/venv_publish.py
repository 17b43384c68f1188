"""What build, adopt and derive share: a venv is made in venvs/<hash>.tmp, its baked-in paths rewritten for
its final place, its marker written last, and published by one rename; a build interrupted before is cleared
first. VenvResult is what each of them returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import PreflightError
from deploy_lib.host.venv_store import VenvStoreFacts
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import Put, Step
from deploy_lib.store import StoreLayout, json_line
from deploy_lib.venvs.host_scripts import RELOCATE_SCRIPT
from deploy_lib.venvs.paths import MARKER_FILE, canonical_name, staging_path, venv_path

COPY_TIMEOUT_S = 1800
JIT_CACHE_DISTRIBUTION = "flashinfer-jit-cache"


def relocate_step(name: str, python: PurePosixPath | str, directory: PurePosixPath, old: PurePosixPath,
                  new: PurePosixPath) -> Step:
    return Step(name, (str(python), "-I", "-c", RELOCATE_SCRIPT, str(directory), str(old), str(new)), sudo=True)


def staged_file_step(name: str, path: PurePosixPath, data: bytes) -> Step:
    """A file written inside venvs/<hash>.tmp from stdin, in the batch's own round trip (a Put costs one of its
    own): nothing there is used before the publishing rename, so it needs no atomic replace. Mode 0644: the
    store's facts are read without sudo."""
    return Step(name, ("install", "-m", "0644", "--", "/dev/stdin", str(path)), stdin=data, sudo=True)


def publish_steps(what: str, staging: PurePosixPath, final: PurePosixPath,
                  marker: Mapping[str, Any]) -> list[Step | Put]:
    """Marker last, flushed to disk, then one rename: venvs/<hash> exists only complete."""
    return [
        staged_file_step(f"{what}: marker", staging / MARKER_FILE, json_line(marker)),
        Step(f"{what}: flush to disk", ("sync", "-f", "--", str(staging)), sudo=True, timeout_s=600),
        Step(f"{what}: publish", ("mv", "-T", "--", str(staging), str(final)), sudo=True),
    ]


def clear_steps(what: str, layout: StoreLayout, venv_hash: str, facts: VenvStoreFacts) -> list[Step | Put]:
    """Remove an interrupted build of this venv; a venvs/<hash> without a readable marker is left for a person."""
    if venv_hash in facts.entries and not facts.published(venv_hash):
        raise PreflightError(f"{venv_path(layout, venv_hash)} exists but has no readable {MARKER_FILE}: it was not "
                             "published by this tool, or its marker was damaged; refusing to replace it",
                             hint="look at it, then remove it by hand so that the venv is built again")
    return [
        Step(f"{what}: clear leftovers", ("rm", "-rf", "--", str(staging_path(layout, venv_hash))), sudo=True,
             timeout_s=600),
        Step(f"{what}: venvs directory", ("mkdir", "-p", "--", str(layout.venvs)), sudo=True),
    ]


@dataclass(frozen=True)
class VenvResult:
    hash: str
    path: PurePosixPath
    reused: bool
    distributions: Mapping[str, str]
    bytes_sent: int = 0
    wheels_sent: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    drift: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    editable: Mapping[str, str] = field(default_factory=dict)  # distribution -> its source checkout

    @property
    def python(self) -> PurePosixPath:
        return venv_python(self.path)


def jit_cache_warnings(distributions: Mapping[str, str]) -> list[str]:
    version = {canonical_name(name): v for name, v in distributions.items()}.get(JIT_CACHE_DISTRIBUTION)
    if version is None:
        return []
    return [f"{JIT_CACHE_DISTRIBUTION} {version} is installed: FlashInfer can load its prebuilt kernels, which "
            "ignore patched headers; remove it from the lock when the venv is patched"]
