"""Stage, repair, switch and prune releases: pure builders of Step/Put batches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from deploy_lib.errors import ConfigError
from deploy_lib.remote import Put, Step
from deploy_lib.store.facts import StoreFacts
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
)


def _server_files(directory: PurePosixPath, unit_text: str, env_text: str, launcher_text: str | None,
                  unit_from: PurePosixPath | None) -> list[Step | Put]:
    """The unit (hard-linked from `unit_from`, a file of the same text, when given), env file and launcher."""
    unit: Step | Put = Put(directory / UNIT_FILE, unit_text.encode(), FILE_MODE, sudo=True) if unit_from is None \
        else Step("stage: unit file (the same text as the current one's)",
                  ("ln", "-f", "--", str(unit_from), str(directory / UNIT_FILE)), sudo=True)
    launcher = [] if launcher_text is None else \
        [Put(directory / LAUNCHER_FILE, launcher_text.encode(), LAUNCHER_MODE, sudo=True)]
    return [unit, Put(directory / ENV_FILE, env_text.encode(), ENV_FILE_MODE, sudo=True, secret=True), *launcher]


def stage_release(layout: StoreLayout, release_id: str, unit_text: str, env_text: str,
                  release_metadata: bytes, replace_damaged: bool = False, launcher_text: str | None = None,
                  unit_from: PurePosixPath | None = None) -> list[Step | Put]:
    """Write a release into releases/<id>.tmp, flush it, then rename it to releases/<id> in one step.

    A leftover <id>.tmp from an interrupted run is removed first; `current` is never touched here. A damaged
    releases/<id> (same content, files lost or garbled) is removed just before the rename replaces it. `unit_from`:
    a unit file of the same text, hard-linked rather than written, so the file systemd's unit link will resolve to
    keeps the mtime systemd compared when it loaded that text (NeedDaemonReload stays "no" across the switch).
    """
    staging, final = layout.staging(release_id), layout.release(release_id)
    files = [staging / name for name in (UNIT_FILE, ENV_FILE, *([LAUNCHER_FILE] if launcher_text is not None
                                                                  else []), RELEASE_FILE)]
    replace = [Step("stage: remove the damaged release", ("rm", "-rf", "--", str(final)), sudo=True)]
    return [
        Step("stage: clear leftover", ("rm", "-rf", "--", str(staging)), sudo=True),
        Step("stage: make directory", ("mkdir", "-p", "--", str(staging)), sudo=True),
        *_server_files(staging, unit_text, env_text, launcher_text, unit_from),
        Put(files[-1], release_metadata, FILE_MODE, sudo=True),
        Step("stage: flush to disk", ("sync", "--", *map(str, files), str(staging)), sudo=True),
        *(replace if replace_damaged else []),
        Step("stage: publish", ("mv", "-T", "--", str(staging), str(final)), sudo=True),
        # the rename on disk before anything points at it: `current` never names a release a power cut takes back
        Step("stage: flush the publish", ("sync", "--", str(layout.releases)), sudo=True),
    ]


def repair_release(layout: StoreLayout, release_id: str, unit_text: str, env_text: str,
                   launcher_text: str | None = None) -> list[Step | Put]:
    """Rewrite the files of a published release (hand edits undone); each file is replaced atomically."""
    return _server_files(layout.release(release_id), unit_text, env_text, launcher_text, None)


def switch_current(layout: StoreLayout, release_id: str) -> list[Step | Put]:
    """Point `current` at a complete release with one rename, and the systemd unit link at current's unit."""
    temp_current = layout.base / ".current.tmp"
    temp_unit = layout.unit_dir / f".{layout.unit_name}.tmp"
    relative_target = f"releases/{check_release_id(release_id)}"
    return [
        Step("switch: release is complete", ("test", "-f", str(layout.release(release_id) / RELEASE_FILE))),
        Step("switch: temp link", ("ln", "-sfn", "--", relative_target, str(temp_current)), sudo=True),
        Step("switch: current", ("mv", "-T", "--", str(temp_current), str(layout.current)), sudo=True),
        Step("switch: temp unit link", ("ln", "-sfn", "--", str(layout.current / UNIT_FILE), str(temp_unit)),
             sudo=True),
        Step("switch: unit link", ("mv", "-T", "--", str(temp_unit), str(layout.unit_link)), sudo=True),
        # both renames on disk before the restart: after a power cut systemd boots what was switched to
        Step("switch: flush", ("sync", "--", str(layout.base), str(layout.unit_dir)), sudo=True),
    ]


def releases_to_prune(facts: StoreFacts, keep: int) -> tuple[str, ...]:
    """Release directories beyond the newest `keep`, never current, the last healthy, nor the one `rollback` returns
    to, plus leftover staging directories and damaged releases (a release the tool cannot read can never be rolled
    back to)."""
    if keep < 1:
        raise ConfigError(f"keep must be at least 1, got {keep}")
    protected = {facts.current, facts.last_healthy(), facts.last_healthy(exclude=facts.current)}
    newest = {r.id for r in facts.releases[-keep:]}
    doomed = [r.id for r in facts.releases if r.id not in newest | protected]
    unusable = [*facts.incomplete, *(damaged.id for damaged in facts.damaged)]
    return tuple(doomed + [name for name in unusable if name not in protected])


def describe_pruned_releases(facts: StoreFacts, release_dirs: Sequence[str]) -> list[str]:
    """One phrase per removed directory, for the user and history: a damaged release says what was wrong."""
    phrases = []
    for name in release_dirs:
        damaged = facts.damaged_release(name)
        if damaged is not None:
            phrases.append(f"damaged release {name} ({damaged.reason})")
        else:
            phrases.append(f"unfinished release {name}" if name.endswith(STAGING_SUFFIX) else f"release {name}")
    return phrases


def prune_releases(layout: StoreLayout, release_dirs: Sequence[str]) -> list[Step | Put]:
    if not release_dirs:
        return []
    for name in release_dirs:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"refusing to prune {name!r}: not a release directory name")
    return [Step("prune releases", ("rm", "-rf", "--", *(str(layout.releases / name) for name in release_dirs)),
                 sudo=True, timeout_s=300)]
