"""Patch sets as data: pick the variant for the installed versions, tell the states apart, apply, revert, audit.

A patch set is a directory (roles/<name>/ bundled with the tool, or patches/<name>/ in the user's project): meta.yaml
plus targets/<target>.yaml, each target with variants per version range that give the file, the exact upstream
(gated) text and our (patched) text. Everything here is a pure
function over file texts, so the same code runs on wheels unpacked by the tests and on files read from a host; check /
audit / enable / disable on a host is the command deploy_lib/commands/patches.py.

    versions    version ranges (">=0.5.8.post1,<0.5.16")
    spec        the YAML files as pydantic models; load, list, find
    variants    the variant of each target for the installed versions
    text        one target: its state, apply, revert, the record of what we changed
    engine      a whole set: refusals, warnings, check (dry run), enable, disable
    audit       the architecture bounds on the set's code path
    host_files  reading the files on a host, the record's place, the JIT cache to clear
"""

from deploy_lib.patches.audit import ArchBound, AuditReport, GpuArch, audit, audit_paths
from deploy_lib.patches.engine import (
    CheckReport,
    Enabled,
    active_warnings,
    check,
    disable,
    enable,
    refuse_another_sets_record,
    refuse_unless_applicable,
)
from deploy_lib.patches.host_files import (
    RECORD_FILE,
    clear_jit_cache_steps,
    distributions,
    file_facts,
    jit_cache_dirs,
    record_fact,
    top_level_packages,
)
from deploy_lib.patches.spec import FLASHINFER, Origin, PatchSet, find_patch_set, list_patch_sets, load_patch_set
from deploy_lib.patches.text import (
    PatchConflict,
    PatchRecord,
    RecordStep,
    State,
    TargetReport,
    apply,
    revert,
    sha256_text,
    target_state,
)
from deploy_lib.patches.variants import Variant, files_needed, select_variants
from deploy_lib.patches.versions import VersionRange

__all__ = [
    "FLASHINFER",
    "RECORD_FILE",
    "ArchBound",
    "AuditReport",
    "CheckReport",
    "Enabled",
    "GpuArch",
    "Origin",
    "PatchConflict",
    "PatchRecord",
    "PatchSet",
    "RecordStep",
    "State",
    "TargetReport",
    "Variant",
    "VersionRange",
    "active_warnings",
    "apply",
    "audit",
    "audit_paths",
    "check",
    "clear_jit_cache_steps",
    "disable",
    "distributions",
    "enable",
    "file_facts",
    "files_needed",
    "find_patch_set",
    "jit_cache_dirs",
    "list_patch_sets",
    "load_patch_set",
    "record_fact",
    "refuse_another_sets_record",
    "refuse_unless_applicable",
    "revert",
    "select_variants",
    "sha256_text",
    "target_state",
    "top_level_packages",
]
