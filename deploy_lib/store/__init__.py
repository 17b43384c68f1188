"""The release store on the host, as data: pure builders of Step/Put batches, and pure parsers of what they read.

Layout (design.md, "The release"), under <root>/<service>/:

    releases/<id>/       sglang.service, sglang.env (0600), release.json; staged as <id>.tmp, then renamed
    current -> releases/<id>   switched with one rename (ln -s to a temp name, mv -T)
    venvs/, cache/       owned by deploy_lib/venvs
    history.jsonl        one JSON line per deploy, rollback, failure or bench
    lock/                mkdir-lock with owner.json
    /etc/systemd/system/<service>.service -> <root>/<service>/current/sglang.service

    layout      the paths and file names above, release ids, the JSON and time format of every file
    history     the tag set, history.jsonl lines, release.json
    facts       one read-only batch of the store's state and its pure parsers (StoreFacts)
    releases    stage, repair, switch and prune releases
    lock        the host lock (Kamal's: mkdir is the atomic test-and-set, owner.json says who): its steps, parsers
                and decisions
Nothing here reaches the host: deploy_lib/host/store.py sends these batches (`read_store_facts`, `host_lock`,
`lock_on_first_change`).
"""

from deploy_lib.store.facts import (
    FACT_CURRENT,
    FACT_HISTORY,
    FACT_RELEASE_DIRS,
    FACT_RELEASE_FILES,
    DamagedRelease,
    ReleaseRecord,
    StoreFacts,
    parse_current,
    parse_history,
    parse_release_files,
    parse_store_facts,
    release_fact_steps,
)
from deploy_lib.store.history import (
    ACTIVATIONS,
    CRASHED,
    FAILED,
    HEALTHY,
    RESTARTED,
    STOPPED,
    HistoryEntry,
    Tags,
    append_history,
    history_entry,
    operator_name,
    release_json,
)
from deploy_lib.store.layout import (
    ENV_FILE,
    ENV_FILE_MODE,
    FILE_MODE,
    LAUNCHER_FILE,
    LAUNCHER_MODE,
    RELEASE_FILE,
    STAGING_SUFFIX,
    UNIT_FILE,
    StoreLayout,
    check_release_id,
    check_service_name,
    iso_time,
    json_line,
)
from deploy_lib.store.lock import (
    FACT_BOOT_ID,
    FACT_CLOCK,
    FACT_LOCK,
    FACT_LOCK_BOOT,
    FACT_LOCK_OWNER,
    FACT_STORE_DIGEST,
    LOCK_STORE_UNCHANGED,
    LOCK_TAKE,
    LockContext,
    LockInfo,
    LockOwner,
    acquire_lock,
    lock_staleness,
    owner_gone,
    remove_lock,
    this_process_owner,
)
from deploy_lib.store.releases import (
    describe_pruned_releases,
    prune_releases,
    releases_to_prune,
    repair_release,
    stage_release,
    switch_current,
)

__all__ = [
    "ACTIVATIONS", "CRASHED", "ENV_FILE", "ENV_FILE_MODE", "FACT_BOOT_ID", "FACT_CLOCK", "FACT_CURRENT", "FACT_HISTORY",
    "FACT_LOCK", "FACT_LOCK_BOOT", "FACT_LOCK_OWNER", "FACT_RELEASE_DIRS", "FACT_RELEASE_FILES", "FACT_STORE_DIGEST",
    "FAILED", "FILE_MODE", "HEALTHY", "LAUNCHER_FILE", "LAUNCHER_MODE", "LOCK_STORE_UNCHANGED", "LOCK_TAKE",
    "RELEASE_FILE", "RESTARTED", "STAGING_SUFFIX", "STOPPED", "UNIT_FILE", "DamagedRelease", "HistoryEntry",
    "LockContext", "LockInfo", "LockOwner", "ReleaseRecord", "StoreFacts", "StoreLayout", "Tags", "acquire_lock",
    "append_history", "check_release_id", "check_service_name", "describe_pruned_releases", "history_entry", "iso_time",
    "json_line", "lock_staleness", "operator_name", "owner_gone", "parse_current", "parse_history",
    "parse_release_files", "parse_store_facts", "prune_releases", "release_fact_steps", "release_json",
    "releases_to_prune", "remove_lock", "repair_release", "stage_release", "switch_current", "this_process_owner",
]
