"""deploy_lib.store without SSH: builders checked as data (as Kamal's test/commands), parsers on captured output,
pruning decisions, and the lock's held/stale/unlock decisions through FakeRemote."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from pathlib import PurePosixPath

import pytest
from helpers.fake_remote import FakeRemote
from helpers.store_output import release_entries

from deploy_lib.errors import ConfigError, LockHeld, StepFailed
from deploy_lib.host.store import holding_lock, take_lock, unlock
from deploy_lib.remote import Put, Step, StepResult, command_line, describe
from deploy_lib.store import (
    FACT_CLOCK,
    FACT_CURRENT,
    FACT_HISTORY,
    FACT_LOCK,
    FACT_LOCK_OWNER,
    FACT_RELEASE_DIRS,
    FACT_RELEASE_FILES,
    HEALTHY,
    LOCK_TAKE,
    HistoryEntry,
    LockContext,
    LockInfo,
    LockOwner,
    StoreFacts,
    StoreLayout,
    Tags,
    acquire_lock,
    append_history,
    describe_pruned_releases,
    history_entry,
    lock_staleness,
    parse_current,
    parse_history,
    parse_release_files,
    parse_store_facts,
    prune_releases,
    release_fact_steps,
    release_json,
    releases_to_prune,
    stage_release,
    switch_current,
)

LAYOUT = StoreLayout("sglang")
HOSTILE_ROOT = PurePosixPath("/srv/it's a \"store\" $(touch x) `id`\nnext line")
WHEN = datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
TAGS = Tags(who="ops@laptop", host="gpu1", release="r2", profile="glm5-nvfp4", profile_hash="ph2",
            versions={"sglang": "0.5.9", "flashinfer": "0.6.1"})


def store_paths(layout: StoreLayout) -> set[PurePosixPath]:
    return {layout.release("abc"), layout.staging("abc"), layout.env_file("abc"), layout.current, layout.history,
            layout.lock_owner, layout.unit_link}


def test_two_services_on_one_host_share_no_store_path() -> None:
    assert not store_paths(LAYOUT) & store_paths(StoreLayout("sglang-b"))
    assert all(path.is_relative_to(LAYOUT.root / LAYOUT.service) for path in store_paths(LAYOUT) - {LAYOUT.unit_link})


def test_a_release_is_staged_beside_itself_and_holds_its_own_env_file() -> None:
    """Publishing renames the staging directory onto the release (one filesystem); switching `current` switches the
    environment the unit reads."""
    assert LAYOUT.staging("abc").parent == LAYOUT.release("abc").parent
    assert LAYOUT.staging("abc") != LAYOUT.release("abc")
    assert LAYOUT.env_file("abc").parent == LAYOUT.release("abc")


@pytest.mark.parametrize("service", ["", "a b", "x/y", "sglang.service", "-rf", "../etc"])
def test_bad_service_names_are_refused(service: str) -> None:
    with pytest.raises(ConfigError, match="service name"):
        StoreLayout(service)


@pytest.mark.parametrize("release_id", ["", "..", "a/b", "r1.tmp", "-r", "r 1", "$(id)"])
def test_bad_release_ids_are_refused_before_any_command_is_built(release_id: str) -> None:
    with pytest.raises(ConfigError, match="release id"):
        switch_current(LAYOUT, release_id)


def test_relative_or_dotted_roots_are_refused() -> None:
    with pytest.raises(ConfigError, match="absolute"):
        StoreLayout("sglang", root=PurePosixPath("opt/x"))
    with pytest.raises(ConfigError, match="absolute"):
        StoreLayout("sglang", root=PurePosixPath("/opt/../etc"))


def test_stage_writes_beside_current_then_renames_once() -> None:
    batch = stage_release(LAYOUT, "r2", "[Unit]\n", "HF_TOKEN=hunter2\n", b"{}\n")
    assert describe(batch) == [
        "stage: clear leftover: sudo rm -rf -- /opt/sglang-deploy/sglang/releases/r2.tmp",
        "stage: make directory: sudo mkdir -p -- /opt/sglang-deploy/sglang/releases/r2.tmp",
        "put /opt/sglang-deploy/sglang/releases/r2.tmp/sglang.service (mode 0644, sudo, 7 bytes, sha256 "
        "ae6c63cff33b)",
        "put /opt/sglang-deploy/sglang/releases/r2.tmp/sglang.env (mode 0600, sudo, ***)",
        "put /opt/sglang-deploy/sglang/releases/r2.tmp/release.json (mode 0644, sudo, 3 bytes, sha256 "
        "ca3d163bab05)",
        "stage: flush to disk: sudo sync -- /opt/sglang-deploy/sglang/releases/r2.tmp/sglang.service "
        "/opt/sglang-deploy/sglang/releases/r2.tmp/sglang.env /opt/sglang-deploy/sglang/releases/r2.tmp/"
        "release.json /opt/sglang-deploy/sglang/releases/r2.tmp",
        "stage: publish: sudo mv -T -- /opt/sglang-deploy/sglang/releases/r2.tmp "
        "/opt/sglang-deploy/sglang/releases/r2",
        "stage: flush the publish: sudo sync -- /opt/sglang-deploy/sglang/releases",  # the rename reaches the disk
    ]
    assert "hunter2" not in "\n".join(describe(batch))
    assert not any(isinstance(s, Step) and str(LAYOUT.current) in s.argv for s in batch)


def test_switch_renames_a_temp_link_over_current_and_links_the_unit() -> None:
    assert describe(switch_current(LAYOUT, "r2")) == [
        "switch: release is complete: test -f /opt/sglang-deploy/sglang/releases/r2/release.json",
        "switch: temp link: sudo ln -sfn -- releases/r2 /opt/sglang-deploy/sglang/.current.tmp",
        "switch: current: sudo mv -T -- /opt/sglang-deploy/sglang/.current.tmp /opt/sglang-deploy/sglang/current",
        "switch: temp unit link: sudo ln -sfn -- /opt/sglang-deploy/sglang/current/sglang.service "
        "/etc/systemd/system/.sglang.service.tmp",
        "switch: unit link: sudo mv -T -- /etc/systemd/system/.sglang.service.tmp /etc/systemd/system/sglang.service",
        "switch: flush: sudo sync -- /opt/sglang-deploy/sglang /etc/systemd/system",  # before the restart
    ]


def test_hostile_root_survives_quoting_in_every_builder() -> None:
    layout = StoreLayout("sglang", root=HOSTILE_ROOT)
    owner = LockOwner("o'brien $(id)", "lap\ntop", 7, "t", "r1", "tok")
    batches = [stage_release(layout, "r1", "u", "e", b"{}"), switch_current(layout, "r1"), release_fact_steps(layout),
               acquire_lock(layout, owner), prune_releases(layout, ["r0"]), append_history(layout, history_entry(
                   "deploy", HEALTHY, TAGS, WHEN))]
    for step in (s for batch in batches for s in batch if isinstance(s, Step)):
        expected = ["sudo", "-n", "--", *step.argv] if step.sudo else list(step.argv)
        assert shlex.split(command_line(step, "deploy")) == expected
    assert any(str(HOSTILE_ROOT / "sglang" / "releases" / "r1.tmp") in s.argv
               for s in batches[0] if isinstance(s, Step))


def test_history_line_is_one_json_line_with_the_tag_set() -> None:
    entry = history_entry("deploy", "failed", TAGS, WHEN, cause="CUDA out of memory\nsecond line",
                          timings={"stage": 0.4, "ready": 95.0})
    [step] = append_history(LAYOUT, entry)
    assert isinstance(step, Step) and step.argv[:2] == ("sh", "-c") and step.argv[-1] == str(LAYOUT.history)
    assert step.stdin is not None and step.stdin.count(b"\n") == 1 and step.stdin.endswith(b"\n")
    data = json.loads(step.stdin)
    assert data | {"versions": None} == {
        "event": "deploy", "outcome": "failed", "when": "2026-11-29T11:00:00+00:00", "who": "ops@laptop",
        "host": "gpu1", "release": "r2", "profile": "glm5-nvfp4", "profile_hash": "ph2", "versions": None,
        "cause": "CUDA out of memory\nsecond line", "timings": {"stage": 0.4, "ready": 95.0}, "figures": {}}
    assert HistoryEntry.from_json(step.stdin.decode()) == entry


def test_history_refuses_unknown_events_and_naive_times() -> None:
    with pytest.raises(ValueError, match="event"):
        history_entry("deploi", HEALTHY, TAGS, WHEN)
    with pytest.raises(ValueError, match="timezone"):
        history_entry("deploy", HEALTHY, TAGS, datetime(2026, 1, 1))


def test_release_json_carries_metadata_tags_and_staging_time() -> None:
    data = json.loads(release_json({"id": "r2", "argv": ["python3"]}, TAGS, WHEN))
    assert data["id"] == "r2" and data["tags"]["profile_hash"] == "ph2"
    assert data["staged_at"] == "2026-11-29T11:00:00+00:00"


# Parsers, on output captured from GNU coreutils/findutils/grep on Debian 12.

def test_parse_current() -> None:
    assert parse_current("releases/3f9a0c\n") == "3f9a0c"
    assert parse_current("/opt/sglang-deploy/sglang/releases/3f9a0c\n") == "3f9a0c"
    assert parse_current("") is None


def test_parse_release_files_with_newlines_in_the_path() -> None:
    layout = StoreLayout("sglang", root=PurePosixPath("/a\nb"))
    base = "/a\nb/sglang/releases"
    captured = (f"{base}/r1/release.json\0{{\"id\":\"r1\"}}\n"
                f"{base}/r2/release.json\0{{\"id\":\n{base}/r2/release.json\0\"r2\"}}\n")
    assert parse_release_files(layout, captured) == {"r1": '{"id":"r1"}', "r2": '{"id":\n"r2"}'}
    assert parse_release_files(layout, "") == {}


def test_parse_history_skips_a_cut_off_last_line() -> None:
    good = history_entry("rollback", HEALTHY, TAGS, WHEN).to_json().decode()
    entries, unreadable = parse_history(good + good + '{"event":"dep')
    assert len(entries) == 2 and unreadable == 1


def _results(layout: StoreLayout, outputs: dict[str, tuple[int, str]]) -> list[StepResult]:
    return [StepResult(step, *outputs.get(step.name, (0, "")), "", 0.0) for step in release_fact_steps(layout)
            if isinstance(step, Step)]


def _release_json(release_id: str, staged_at: str) -> str:
    return json.dumps({"id": release_id, "staged_at": staged_at}, separators=(",", ":"))


def _history(*entries: tuple[str, str, str]) -> str:
    return "".join(history_entry(event, outcome, Tags("w", "h", rid, "p", "ph"), WHEN).to_json().decode()
                   for event, outcome, rid in entries)


CAPTURED_HISTORY = (("deploy", HEALTHY, "r1"), ("deploy", HEALTHY, "r2"), ("deploy", "failed", "r3"),
                    ("rollback", HEALTHY, "r2"), ("deploy", "failed", "r4"), ("bench", HEALTHY, "r4"))


def captured_facts(current: str | None = "r3", lock: tuple[int, str] = (1, ""),
                   history: tuple[tuple[str, str, str], ...] = CAPTURED_HISTORY) -> StoreFacts:
    base = "/opt/sglang-deploy/sglang/releases"
    files = "".join(f"{base}/{rid}/release.json\0{_release_json(rid, f'2026-11-2{n}T10:00:00+00:00')}\n"
                    for n, rid in enumerate(["r1", "r2", "r3", "r4"], start=1))
    return parse_store_facts(LAYOUT, _results(LAYOUT, {
        FACT_CURRENT: (0, f"releases/{current}\n") if current else (1, ""),
        FACT_RELEASE_DIRS: (0, release_entries("r4", "r3", "r2", "r1") + "r5.tmp\0r5.tmp/sglang.service\0"),
        FACT_RELEASE_FILES: (0, files),
        FACT_HISTORY: (0, _history(*history)),
        FACT_CLOCK: (0, "1764414000\n"),
        FACT_LOCK: lock,
        FACT_LOCK_OWNER: (1, ""),
    }))


def test_store_facts_from_one_batch() -> None:
    facts = captured_facts()
    assert facts.current == "r3"
    assert [r.id for r in facts.releases] == ["r1", "r2", "r3", "r4"]
    assert facts.incomplete == ("r5.tmp",)
    assert facts.last_healthy() == "r2" and facts.last_healthy(exclude="r2") == "r1"
    assert facts.outcomes() == {"r1": HEALTHY, "r2": HEALTHY, "r3": "failed", "r4": "failed"}
    assert facts.lock is None


def damaged_store(current: str) -> StoreFacts:
    """r1 complete; r2 with garbage in release.json; r3 without release.json; r4 without its env file; r5 a JSON
    list; r6 release.json empty."""
    base = "/opt/sglang-deploy/sglang/releases"
    texts = {"r1": _release_json("r1", "2026-11-21T10:00:00+00:00"), "r2": "{garbage", "r4": _release_json("r4", ""),
             "r5": "[1, 2]"}
    entries = (release_entries("r1", "r2", "r5") + "r3\0r3/sglang.service\0r3/sglang.env\0"
               + "r4\0r4/release.json\0r4/sglang.service\0" + release_entries("r6"))
    return parse_store_facts(LAYOUT, _results(LAYOUT, {
        FACT_CURRENT: (0, f"releases/{current}\n"), FACT_RELEASE_DIRS: (0, entries),
        FACT_RELEASE_FILES: (0, "".join(f"{base}/{rid}/release.json\0{text}\n" for rid, text in texts.items())),
        FACT_HISTORY: (0, _history(("deploy", HEALTHY, "r2"), ("deploy", HEALTHY, "r1"))),
        FACT_CLOCK: (0, "1764414000\n"), FACT_LOCK: (1, ""), FACT_LOCK_OWNER: (1, "")}))


def test_damaged_releases_are_listed_with_what_is_wrong_naming_the_file() -> None:
    """Input tried: release.json with garbage, missing, empty, a JSON list; a release without its env file."""
    facts = damaged_store(current="r1")
    assert [r.id for r in facts.releases] == ["r1"]
    reasons = {damaged.id: damaged.reason for damaged in facts.damaged}
    assert reasons["r2"].startswith("release.json is not valid JSON (Expecting property name")
    assert reasons["r3"] == "release.json is missing" and reasons["r4"] == "sglang.env is missing"
    assert reasons["r5"] == "release.json is not a JSON object"
    assert reasons["r6"] == "release.json is empty or not text"
    assert facts.current_problem() is None and facts.last_healthy(exclude="r1") is None  # r2 cannot be used


def test_a_damaged_or_missing_current_release_says_so() -> None:
    assert damaged_store(current="r2").current_problem() == (
        "current release r2 is damaged: release.json is not valid JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1))")
    assert damaged_store(current="r9").current_problem() == (
        "current release r9 is missing: its directory releases/r9 is gone")


def test_prune_removes_damaged_releases_but_never_the_current_one_and_names_each() -> None:
    facts = damaged_store(current="r4")
    doomed = releases_to_prune(facts, keep=5)
    assert doomed == ("r2", "r3", "r5", "r6")
    phrases = describe_pruned_releases(facts, doomed)
    assert phrases[0].startswith("damaged release r2 (release.json is not valid JSON")
    assert phrases[1] == "damaged release r3 (release.json is missing)"
    assert describe_pruned_releases(captured_facts(), ("r1", "r5.tmp")) == ["release r1", "unfinished release r5.tmp"]


def test_first_deploy_reads_as_an_empty_store() -> None:
    facts = parse_store_facts(LAYOUT, _results(LAYOUT, {
        FACT_CURRENT: (1, ""), FACT_RELEASE_DIRS: (1, ""), FACT_RELEASE_FILES: (1, ""), FACT_HISTORY: (1, ""),
        FACT_CLOCK: (0, "1764414000\n"), FACT_LOCK: (1, ""), FACT_LOCK_OWNER: (1, "")}))
    assert facts == StoreFacts(current=None, releases=(), incomplete=(), history=(), lock=None)
    assert releases_to_prune(facts, keep=3) == ()


def test_lock_fact_gives_owner_and_age_by_the_hosts_clock() -> None:
    owner = LockOwner("ops", "laptop", 4242, "2026-11-29T10:00:00+00:00", "r9", "t0k")
    facts = parse_store_facts(LAYOUT, _results(LAYOUT, {
        FACT_CLOCK: (0, "1764414000\n"), FACT_LOCK: (0, "1764413940\n"),
        FACT_LOCK_OWNER: (0, owner.to_json().decode())}))
    assert facts.lock == LockInfo(owner, 60.0)


# Pruning

def test_pruning_keeps_newest_current_and_last_healthy() -> None:
    facts = captured_facts(current="r3")
    assert releases_to_prune(facts, keep=1) == ("r1", "r5.tmp")  # r2 last healthy, r3 current, r4 newest
    assert releases_to_prune(facts, keep=2) == ("r1", "r5.tmp")
    assert releases_to_prune(facts, keep=4) == ("r5.tmp",)


def test_pruning_after_a_healthy_deploy_keeps_the_release_a_rollback_returns_to() -> None:
    """r1 was rolled back to and served until r4 was deployed; r4 is now current and the last healthy, and a
    rollback returns to r1, older than the newest two (a CI run saw the crash test's rollback target pruned)."""
    facts = captured_facts(current="r4", history=(("deploy", HEALTHY, "r1"), ("deploy", HEALTHY, "r2"),
                                                  ("deploy", HEALTHY, "r3"), ("rollback", HEALTHY, "r1"),
                                                  ("deploy", HEALTHY, "r4")))
    assert facts.last_healthy(exclude="r4") == "r1"
    assert releases_to_prune(facts, keep=2) == ("r2", "r5.tmp")


def test_pruning_never_removes_an_old_current_release() -> None:
    assert "r1" not in releases_to_prune(captured_facts(current="r1"), keep=1)


def test_pruning_needs_a_positive_keep_and_plain_names() -> None:
    with pytest.raises(ConfigError):
        releases_to_prune(captured_facts(), keep=0)
    with pytest.raises(ValueError):
        prune_releases(LAYOUT, [".."])
    assert prune_releases(LAYOUT, []) == []
    assert describe(prune_releases(LAYOUT, ["r1", "r5.tmp"])) == [
        "prune releases: sudo rm -rf -- /opt/sglang-deploy/sglang/releases/r1 "
        "/opt/sglang-deploy/sglang/releases/r5.tmp"]


# Lock

OWNER = LockOwner(user="o'brien $(id)", host="laptop \"2\"\nx", pid=4242, time="2026-11-29T10:00:00+00:00",
                  purpose="deploy of release r9", token="f00d")
CONTEXT = LockContext(where="gpu1", this_host="ci-runner", is_alive=lambda pid: True)


def _held_remote(owner_json: str, lock_mtime: str = "1764413940\n") -> FakeRemote:
    return (FakeRemote()
            .reply(LOCK_TAKE, exit_code=1, stderr="mkdir: cannot create directory: File exists")
            .reply(FACT_CLOCK, stdout="1764414000\n")
            .reply(FACT_LOCK, stdout=lock_mtime)
            .reply(FACT_LOCK_OWNER, stdout=owner_json))


def test_acquire_is_mkdir_then_owner_file() -> None:
    remote = FakeRemote()
    take_lock(remote, LAYOUT, OWNER, CONTEXT)
    assert remote.ran_argvs() == [("mkdir", "-p", "--", "/opt/sglang-deploy/sglang"),
                                  ("mkdir", "--", "/opt/sglang-deploy/sglang/lock"),
                                  ("cp", "--", "/proc/sys/kernel/random/boot_id",
                                   "/opt/sglang-deploy/sglang/lock/boot_id")]  # in which boot of the host
    written = LockOwner.from_json(remote.file_text(LAYOUT.lock_owner))
    assert written == OWNER  # hostile owner fields survive: JSON through SFTP, no shell involved


def test_a_held_lock_names_its_owner() -> None:
    remote = _held_remote(OWNER.to_json().decode())
    with pytest.raises(LockHeld) as held:
        take_lock(remote, LAYOUT, LockOwner("me", "here", 1, "t", "r10", "tok2"), CONTEXT)
    message = str(held.value)
    assert "o'brien $(id)@laptop \"2\"\nx (pid 4242)" in message and "r9" in message
    assert "stale" not in message and "--force" in message
    assert LAYOUT.lock_owner not in remote.files  # the holder's owner.json was not overwritten


def test_mkdir_failing_without_a_lock_is_not_reported_as_contention() -> None:
    remote = FakeRemote().reply(LOCK_TAKE, exit_code=1, stderr="Read-only file system").reply(FACT_LOCK, exit_code=1)
    with pytest.raises(StepFailed) as failed:
        take_lock(remote, LAYOUT, OWNER, CONTEXT)
    assert not isinstance(failed.value, LockHeld) and "Read-only" in str(failed.value)


@pytest.mark.parametrize(("owner_host", "alive", "age_s", "owner_known", "stale"), [
    ("ci-runner", False, 10, True, "no longer running"),     # our own machine, dead pid
    ("ci-runner", True, 10, True, None),                     # our own machine, running
    ("elsewhere", False, 10, True, None),                    # cannot check another machine's pid
    ("elsewhere", True, 4 * 3600, True, "h old"),            # too old
    ("elsewhere", True, 120, False, "no readable owner.json"),
    ("elsewhere", True, 5, False, None),                     # owner.json may still be being written
])
def test_stale_lock_detection(owner_host: str, alive: bool, age_s: float, owner_known: bool,
                              stale: str | None) -> None:
    owner = LockOwner("u", owner_host, 4242, "t", "r", "x") if owner_known else None
    reason = lock_staleness(LockInfo(owner, age_s), "ci-runner", lambda pid: alive)
    assert (reason is None) if stale is None else (stale in (reason or ""))


def test_a_stale_lock_says_so_and_how_to_clear_it() -> None:
    dead_here = LockOwner("u", "ci-runner", 4242, "t", "r", "x")
    remote = _held_remote(dead_here.to_json().decode())
    with pytest.raises(LockHeld, match="looks stale: its owner, pid 4242") as held:
        take_lock(remote, LAYOUT, OWNER, LockContext("gpu1", "ci-runner", lambda pid: False))
    assert held.value.hint == "`invoke unlock` removes it"


def test_holding_lock_releases_on_error_and_on_ctrl_c() -> None:
    for interruption in (RuntimeError("boom"), KeyboardInterrupt()):
        remote = FakeRemote()
        with pytest.raises(type(interruption)), holding_lock(remote, LAYOUT, OWNER, CONTEXT):
            raise interruption
        assert remote.ran_names()[-2:] == ["lock: still ours", "lock: release"]
        assert remote.ran_argvs()[-2][:5] == ("grep", "-q", "-F", "-e", '"token":"f00d"')


def test_holding_lock_leaves_a_lock_that_is_no_longer_ours() -> None:
    remote = FakeRemote().reply("lock: still ours", exit_code=1)
    with pytest.raises(LockHeld, match="no longer ours"), holding_lock(remote, LAYOUT, OWNER, CONTEXT):
        pass
    assert "lock: release" not in remote.ran_names()


def test_unlock_refuses_a_live_lock_without_force() -> None:
    remote = FakeRemote().reply(FACT_CLOCK, stdout="1764414000\n").reply(FACT_LOCK, stdout="1764413940\n") \
        .reply(FACT_LOCK_OWNER, stdout=OWNER.to_json().decode())
    with pytest.raises(LockHeld, match="--force"):
        unlock(remote, LAYOUT, force=False, context=CONTEXT)
    assert "lock: remove" not in remote.ran_names()
    assert unlock(remote, LAYOUT, force=True, context=CONTEXT) == LockInfo(OWNER, 60.0)
    assert remote.ran_argvs()[-1] == ("rm", "-rf", "--", "/opt/sglang-deploy/sglang/lock")


def test_unlock_clears_a_stale_lock_without_force_and_reports_no_lock() -> None:
    remote = FakeRemote().reply(FACT_CLOCK, stdout="1764414000\n").reply(FACT_LOCK, stdout="1764400000\n")
    assert unlock(remote, LAYOUT, force=False, context=CONTEXT) == LockInfo(None, 14000.0)
    assert unlock(FakeRemote().reply(FACT_LOCK, exit_code=1).reply(FACT_CLOCK, stdout="1\n"), LAYOUT, False,
                  CONTEXT) is None


def test_secret_env_put_is_the_only_place_the_secret_goes() -> None:
    batch = stage_release(LAYOUT, "r2", "[Service]\nEnvironmentFile=/x\n", "HF_TOKEN=hunter2\n", b"{}")
    carrying = [s for s in batch if (isinstance(s, Put) and b"hunter2" in s.data)
                or (isinstance(s, Step) and "hunter2" in " ".join(s.argv))]
    assert carrying == [batch[3]] and isinstance(batch[3], Put) and batch[3].secret and batch[3].mode == 0o600
