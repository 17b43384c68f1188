"""A patch set's files on a host: read byte-exact (base64, so no transport can touch newlines), the record's place,
and the FlashInfer JIT cache to clear (flashinfer/jit/env.py: <base>/.cache/flashinfer/<version>/<archs>/cached_ops/
<module>)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from deploy_lib.patches.audit import audit_paths
from deploy_lib.patches.spec import PatchSet
from deploy_lib.patches.text import PatchConflict
from deploy_lib.remote import Step, StepResult

RECORD_FILE = "sglang-deploy-patches.json"  # kept in the patched venv, beside bin/


def read_steps(locations: Mapping[str, PurePosixPath]) -> list[Step]:
    """One read-only step per path (relative to site-packages -> where it is on the host, e.g. in an editable
    install's checkout); a path that is not there is a fact (exit 1), not a failure."""
    return [Step(name=f"read {path}", argv=("base64", "-w", "0", "--", str(location)), sudo=True,
                 ok=frozenset({0, 1}), timeout_s=30) for path, location in locations.items()]


def top_level_packages(patch_set: PatchSet) -> tuple[str, ...]:
    """The import packages whose files the patch set reads (sglang, flashinfer): where each is gets looked up."""
    paths = [v.file for t in patch_set.targets.values() for v in t.variants if v.file] + list(audit_paths(patch_set))
    return tuple(sorted({path.split("/", 1)[0] for path in paths}))


def files_from_results(paths: Sequence[str], results: Sequence[StepResult]) -> dict[str, str]:
    """The texts that read_steps(paths) returned, keyed by path; missing files are left out."""
    files = {}
    for path, result in zip(paths, results, strict=True):
        if result.exit_code != 0:
            continue
        try:
            files[path] = base64.b64decode(result.stdout.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as err:
            raise PatchConflict(f"{path}: cannot read it as UTF-8 text ({err}); nothing written") from None
    return files


def jit_cache_dirs(patch_set: PatchSet, workspace_base: PurePosixPath, versions: Mapping[str, str]) -> tuple[str, ...]:
    """Glob patterns of the JIT-built modules the patch set invalidates ($FLASHINFER_WORKSPACE_BASE = base)."""
    spec = patch_set.meta.jit_cache
    if spec is None or spec.dist not in versions:
        return ()
    root = workspace_base / ".cache" / "flashinfer" / versions[spec.dist]
    return tuple(f"{root}/*/cached_ops/{module}" for module in spec.modules)


def clear_jit_cache_steps(patch_set: PatchSet, workspace_base: PurePosixPath, versions: Mapping[str, str],
                          sudo: bool = False) -> list[Step]:
    """Remote steps deleting those modules; a cache that was never built is not an error."""
    steps = []
    for pattern in jit_cache_dirs(patch_set, workspace_base, versions):
        root, _, tail = pattern.partition("/*/")
        steps.append(Step(
            name=f"clear FlashInfer JIT cache ({tail.rsplit('/', 1)[-1]})",
            argv=("find", root, "-mindepth", "3", "-maxdepth", "3", "-type", "d", "-path", f"{root}/*/{tail}",
                  "-prune", "-exec", "rm", "-rf", "--", "{}", "+"),
            sudo=sudo,
            ok=frozenset({0, 1}),  # find exits 1 when the version's cache directory does not exist yet
        ))
    return steps

