"""Derived (patched) venvs: a hard-linked copy of a published base whose replaced files are written as new files
and renamed over their links, so the base stays byte-identical; copied trees (an editable install's package)
are checked by digest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.digests import sha256_bytes, short_hash
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.host.store import host_lock
from deploy_lib.host.venv_publish import (
    COPY_TIMEOUT_S,
    VenvResult,
    clear_steps,
    jit_cache_warnings,
    publish_steps,
    relocate_step,
)
from deploy_lib.host.venv_store import VenvStoreFacts, parse_store_facts, store_facts
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.remote.readings import ABSENT_OK, Fact, read
from deploy_lib.store import StoreLayout, iso_time
from deploy_lib.venvs.host_scripts import (
    IMPORTED_FROM_SCRIPT,
    TREE_SCRIPT,
)
from deploy_lib.venvs.paths import MARKER_FILE, check_venv_hash, staging_path, venv_path

FACT_MODES = "venv derive: modes of replaced files"


def derived_hash(base_hash: str, replaced_files: Mapping[str, bytes], trees: Mapping[str, str] | None = None) -> str:
    """A derived venv's hash: its base's hash, each replaced path with the sha256 of its new bytes, and each copied
    tree's path with the digest of its content."""
    files = sorted((path, sha256_bytes(data)) for path, data in replaced_files.items())
    content: dict[str, Any] = {"kind": "derived", "base": check_venv_hash(base_hash), "files": files}
    if trees:
        content["trees"] = sorted(trees.items())
    return short_hash(json.dumps(content))


def check_relpath(relpath: str) -> PurePosixPath:
    path = PurePosixPath(relpath)
    if (not relpath or path.is_absolute() or any(part in ("", ".", "..") for part in relpath.split("/"))
            or "\n" in relpath or "\0" in relpath or path.parts[0] == MARKER_FILE):
        raise ConfigError(f"cannot replace {relpath!r} in a venv: give a relative path inside it "
                          f"(no '..', not {MARKER_FILE})")
    return path


def modes_fact(layout: StoreLayout, base_hash: str, relpaths: Iterable[str]) -> Fact[dict[str, int]]:
    """The modes of the files a derived venv replaces, so the new files keep them (stat prints those that exist)."""
    base = venv_path(layout, base_hash)
    return Fact(Step(FACT_MODES, ("stat", "--printf", "%a %n\\0", "--",
                                  *(str(base / check_relpath(p)) for p in relpaths)), ok=ABSENT_OK),
                lambda result: parse_modes(layout, base_hash, result.stdout))


def parse_modes(layout: StoreLayout, base_hash: str, stat_out: str) -> dict[str, int]:
    """relpath -> mode of each replaced file that exists in the base."""
    prefix = f"{venv_path(layout, base_hash)}/"
    modes = {}
    for entry in stat_out.split("\0"):
        mode, _, name = entry.partition(" ")
        if name.startswith(prefix) and re.fullmatch(r"[0-7]{3,4}", mode):
            modes[name[len(prefix):]] = int(mode, 8)
    return modes


FACT_TREES = "venv derive: digests of copied trees"


@dataclass(frozen=True)
class CopiedTree:
    """A directory copied into a derived venv (an editable install's package), and the digest of its content."""

    source: PurePosixPath
    digest: str


def tree_digests_fact(python: PurePosixPath, sources: Iterable[PurePosixPath]) -> Fact[dict[str, str]]:
    """Source directory -> the digest of its content (host_scripts/venv_tree.py), checked again after the copy."""
    return Fact(Step(FACT_TREES, (str(python), "-I", "-c", TREE_SCRIPT, "digest", *map(str, sources)), sudo=True,
                     timeout_s=COPY_TIMEOUT_S),
                lambda result: {str(source): str(digest) for source, digest in json.loads(result.stdout).items()})


def derive_steps(layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
                 facts: VenvStoreFacts, modes: Mapping[str, int], now: datetime,
                 trees: Mapping[str, CopiedTree] | None = None) -> tuple[str, list[Step | Put]]:
    """Hard-linked copy of the base, each changed file written new and renamed over its link; nothing if published.

    `trees` (relative path in the venv -> source directory) are copied in as new files before the replaced files
    are written; the copy must have the digest read beforehand, and the venv's python must import from it.
    A replaced .py file's cached bytecode is unlinked in the copy (its directory entry only), so Python
    compiles the new source instead of checking a timestamp shared with the base.
    """
    trees = trees or {}
    if not replaced_files:
        raise ConfigError("a derived venv needs at least one replaced file")
    base_marker = facts.markers.get(base_hash)
    if base_marker is None:
        raise PreflightError(f"base venv {base_hash} is not published on the host", hint="see `invoke venv.list`")
    digest = derived_hash(base_hash, replaced_files, {relpath: tree.digest for relpath, tree in trees.items()})
    if facts.published(digest):
        return digest, []
    base, staging, final = venv_path(layout, base_hash), staging_path(layout, digest), venv_path(layout, digest)
    python = venv_python(staging)
    paths = {relpath: check_relpath(relpath) for relpath in sorted(replaced_files)}
    parents = sorted({str(staging / path.parent) for path in paths.values()})
    steps: list[Step | Put] = [
        *clear_steps("venv derive", layout, digest, facts),
        Step("venv derive: hard-linked copy", ("cp", "-al", "--", str(base), str(staging)), sudo=True,
             timeout_s=COPY_TIMEOUT_S),
        *(Step(f"venv derive: copy {tree.source}", (str(python), "-I", "-c", TREE_SCRIPT, "copy", str(tree.source),
                                                    str(staging / check_relpath(relpath)), tree.digest),
               sudo=True, timeout_s=COPY_TIMEOUT_S) for relpath, tree in sorted(trees.items())),
        Step("venv derive: directories", ("mkdir", "-p", "--", *parents), sudo=True),
    ]
    for relpath, path in paths.items():
        steps.append(Put(staging / path, replaced_files[relpath], modes.get(relpath, 0o644), sudo=True))
        if path.suffix == ".py":
            steps.append(Step(f"venv derive: stale bytecode of {relpath}",
                              ("find", str(staging / path.parent / "__pycache__"), "-maxdepth", "1", "-name",
                               f"{path.stem}.*.pyc", "-delete"), sudo=True, ok=ABSENT_OK))
    steps += [Step(f"venv derive: imports {PurePosixPath(relpath).name} from the copy",
                   (str(python), "-I", "-c", IMPORTED_FROM_SCRIPT, PurePosixPath(relpath).name,
                    str(staging / relpath)), sudo=True) for relpath in sorted(trees)]
    marker = {"hash": digest, "kind": "derived", "base": base_hash, "python": base_marker.get("python"),
              "created": iso_time(now), "distributions": base_marker.get("distributions", {}),
              "replaced": {relpath: sha256_bytes(data) for relpath, data in sorted(replaced_files.items())}}
    if trees:
        marker["copied"] = {relpath: {"source": str(tree.source), "digest": tree.digest}
                            for relpath, tree in sorted(trees.items())}
    steps += [relocate_step("venv derive: relocate scripts", python, staging, base, final),
              *publish_steps("venv derive", staging, final, marker)]
    return digest, steps


def derive(remote: Remote, layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
           now: datetime | None = None, *, copied: Mapping[str, PurePosixPath] | None = None,
           where: str = "the host") -> VenvResult:
    """A new venv: the base with `replaced_files` (relative path -> new bytes) and the `copied` directories
    (relative path -> source directory on the host, copied in whole); the base stays byte-identical."""
    with host_lock(remote, layout, "venv derive", where):
        return _derive(remote, layout, base_hash, replaced_files, now, copied or {})


def _derive(remote: Remote, layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
            now: datetime | None, copied: Mapping[str, PurePosixPath]) -> VenvResult:
    modes_read = modes_fact(layout, base_hash, replaced_files)
    trees_read = tree_digests_fact(venv_python(venv_path(layout, base_hash)), copied.values())
    found = read(remote, [*store_facts(layout).values(), modes_read, *([trees_read] if copied else [])])
    facts, modes = parse_store_facts(layout, found), found.value(modes_read)
    digests = found.value(trees_read) if copied else {}
    trees = {relpath: CopiedTree(source, digests[str(source)]) for relpath, source in copied.items()}
    digest, steps = derive_steps(layout, base_hash, replaced_files, facts, modes, now or datetime.now(UTC), trees)
    if steps:
        remote.run(steps)
    distributions = {str(k): str(v) for k, v in dict(facts.markers[base_hash].get("distributions", {})).items()}
    return VenvResult(digest, venv_path(layout, digest), reused=not steps, distributions=distributions,
                      warnings=tuple(jit_cache_warnings(distributions)))
