"""A patch set's files on a host: read byte-exact (base64, so no transport can touch newlines), the record's place,
and the FlashInfer JIT cache to clear (flashinfer/jit/env.py: <base>/.cache/flashinfer/<version>/<archs>/cached_ops/
<module>)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from functools import partial
from pathlib import PurePosixPath

from deploy_lib.patches.audit import audit_paths
from deploy_lib.patches.spec import PatchSet
from deploy_lib.patches.text import PatchConflict, PatchRecord
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Fact

RECORD_FILE = "sglang-deploy-patches.json"  # kept in the patched venv, beside bin/


def file_facts(locations: Mapping[str, PurePosixPath]) -> dict[str, Fact[str | None]]:
    """Per path (relative to site-packages -> where it is on the host, e.g. in an editable install's checkout) the
    fact of its text; a path that is not there is a fact (None), not a failure."""
    return {path: Fact(Step(f"read {path}", ("base64", "-w", "0", "--", str(location)), sudo=True, ok=ABSENT_OK,
                            timeout_s=30), partial(_file_text, path)) for path, location in locations.items()}


def _file_text(path: str, result: StepResult) -> str | None:
    if result.exit_code != 0:
        return None
    try:
        return base64.b64decode(result.stdout.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as err:
        raise PatchConflict(f"{path}: cannot read it as UTF-8 text ({err}); nothing written") from None


def record_fact(venv: PurePosixPath) -> Fact[PatchRecord | None]:
    """The venv's record of what we patched in it; None for a venv we never patched."""
    path = venv / RECORD_FILE
    return Fact(Step("patch facts: record", ("cat", "--", str(path)), sudo=True, ok=ABSENT_OK),
                lambda result: PatchRecord.from_json(result.stdout, str(path)) if result.exit_code == 0 else None)


def distributions(patch_set: PatchSet) -> tuple[str, ...]:
    """The distributions whose installed versions the patch set decides on: its packages (the variants), those its
    warnings name (conditions and {placeholders}) and the one whose JIT cache it clears."""
    named = set(patch_set.meta.packages)
    for warning in patch_set.meta.warnings:
        named |= {*warning.when, *re.findall(r"\{([A-Za-z0-9._-]+)\}", warning.text)}
    if patch_set.meta.jit_cache is not None:
        named.add(patch_set.meta.jit_cache.dist)
    return tuple(sorted(named))


def top_level_packages(patch_set: PatchSet) -> tuple[str, ...]:
    """The import packages whose files the patch set reads (sglang, flashinfer): where each is gets looked up."""
    paths = [v.file for t in patch_set.targets.values() for v in t.variants if v.file] + list(audit_paths(patch_set))
    return tuple(sorted({path.split("/", 1)[0] for path in paths}))


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

