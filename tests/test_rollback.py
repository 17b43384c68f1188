"""Rollback's preflight, lenient reading of releases written by earlier versions, and signals (no SSH)."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import pytest
from helpers.deploy_plan import PROJECT, deployed, facts, first_plan, target
from helpers.recording_progress import RecordingProgress
from helpers.rollback import (
    DEAD,
    LAYOUT,
    NOW,
    READY,
    ScriptedHost,
    _tags,
    a_host,
    changed_profile,
)

from deploy_lib import store
from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.deploy.preflight import check_release, check_release_files
from deploy_lib.errors import Interrupted, PreflightError, ReadinessFailed, Terminated
from deploy_lib.facts import host as host_facts
from deploy_lib.facts.host import SGLangInstall
from deploy_lib.host.switch import probe_target, recorded_tags
from deploy_lib.interrupts import Interrupt, interrupted, signal_name, signals_raise
from deploy_lib.profile import read_stored_profile
from deploy_lib.release.model import RecordedRelease
from deploy_lib.remote import Put, Step, describe
from deploy_lib.store import (
    ENV_FILE,
    FAILED,
    HEALTHY,
    UNIT_FILE,
    StoreFacts,
    history_entry,
)


def stored_by_a_previous_version() -> dict:
    """release.json of the reference release as an earlier version could have written it."""
    _, plan = first_plan()
    metadata = json.loads(json.dumps(deployed(plan).metadata))
    metadata["profile"]["service"]["health_path"] = "/health"   # a key removed since
    metadata["profile"]["retries"] = 3                           # a whole section removed since
    del metadata["profile"]["features"]["metrics"]               # a key added since
    del metadata["tags"]                                         # written before the tag set existed
    return metadata


def test_a_stored_profile_with_unknown_and_missing_keys_is_read_and_the_unknown_ones_reported() -> None:
    stored = read_stored_profile(stored_by_a_previous_version()["profile"])
    assert stored.server.port == 8000 and stored.parallel.gpus_per_node == 8
    assert stored.unknown == ("service.health_path", "retries")
    assert "service.health_path" in stored.notes("r1")[0] and "kept" in stored.notes("r1")[0]


def test_a_recorded_value_todays_schema_refuses_is_reported_and_read_as_the_default() -> None:
    """Input tried: port "eighty" and a startup timeout below today's minimum; and no profile at all."""
    stored = read_stored_profile({"server": {"port": "eighty", "host": "0.0.0.0"},
                                  "service": {"startup_timeout_s": 1, "venv": "/opt/v"}})
    assert (stored.server.port, stored.server.host, stored.service.venv) == (30000, "0.0.0.0", "/opt/v")
    assert [item.split(":")[0] for item in stored.refused] == ["server.port", "service.startup_timeout_s"]
    assert read_stored_profile(None).server.port == 30000
    assert read_stored_profile("garbage").unknown == ()


def test_a_release_without_venv_files_or_tags_falls_back_to_what_it_does_record() -> None:
    metadata = stored_by_a_previous_version()
    del metadata["venv"], metadata["files"]
    release = RecordedRelease.of("r1", metadata)
    assert release.venv == metadata["profile"]["service"]["venv"] and release.files == {}
    tags = recorded_tags(target(), "r1", metadata)
    assert (tags.release, tags.profile, tags.versions) == ("r1", "glm5-nvfp4", {"sglang": "0.5.23"})
    probe = probe_target(LAYOUT, metadata, {})
    assert (probe.port, probe.health_path) == (8000, "/ready")


def test_rollback_preflight_refuses_a_release_whose_venv_has_no_sglang() -> None:
    """Input tried: the venv's python3 missing (the venv was deleted) for a recorded release."""
    _, plan = first_plan()
    release = RecordedRelease.of(plan.release.id, plan.release.record())
    gone = replace(facts(plan.release.args), sglang=SGLangInstall(False, None, None, {},
                                                                  "the venv's python3 was not found"))
    with pytest.raises(PreflightError, match=f"release {plan.release.id}: no SGLang found in {release.venv}: the venv"):
        check_release(release, target(), gone)
    check_release(release, target(), facts(plan.release.args))


def test_rollback_preflight_refuses_missing_or_changed_release_files() -> None:
    """Input tried: the env file absent; the unit file with another checksum than release.json records."""
    _, plan = first_plan()
    release = RecordedRelease.of(plan.release.id, plan.release.record())
    good = dict(release.files)
    ok = replace(facts(), release_sums=good)
    check_release_files(release, LAYOUT, ok, "th1")
    with pytest.raises(PreflightError, match=r"sglang\.env is missing"):
        check_release_files(release, LAYOUT, replace(ok, release_sums={UNIT_FILE: good[UNIT_FILE]}), "th1")
    with pytest.raises(PreflightError, match=r"sglang\.service was changed since the release was written"):
        check_release_files(release, LAYOUT, replace(ok, release_sums={**good, UNIT_FILE: "0" * 64}), "th1")
    older = replace(release, files={})  # nothing recorded to compare: present is enough
    check_release_files(older, LAYOUT, replace(ok, release_sums={UNIT_FILE: "1" * 64, ENV_FILE: "2" * 64}), "th1")


def test_only_history_last_word_on_what_serves_counts_as_recorded_healthy() -> None:
    def store(*lines: tuple[str, str, str]) -> StoreFacts:
        history = tuple(history_entry(event, outcome, _tags(release), NOW) for event, outcome, release in lines)
        return StoreFacts(current="b", releases=(), incomplete=(), history=history, lock=None)

    assert store(("deploy", HEALTHY, "b"), ("bench", FAILED, "b")).recorded_healthy("b")
    assert not store(("deploy", HEALTHY, "b"), ("deploy", FAILED, "c"), ("rollback", HEALTHY, "a")
                     ).recorded_healthy("b"), "b was healthy once, but something switched since"
    assert not store(("deploy", HEALTHY, "a")).recorded_healthy("b"), "switched to b with no line (killed)"
    assert not store().recorded_healthy("b")


def test_sigterm_and_sigint_raise_an_interrupt_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupt) as caught, signals_raise():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # not reached: the handler raises as soon as the signal is delivered
    assert signal_name(caught.value) == "SIGTERM" and signal.getsignal(signal.SIGTERM) is before
    error = interrupted(caught.value, "m")
    assert isinstance(error, Terminated) and error.exit_code == 143
    plain = interrupted(KeyboardInterrupt(), "m")
    assert type(plain) is Interrupted and plain.exit_code == 130 and signal_name(KeyboardInterrupt()) == "SIGINT"


def test_the_profile_of_the_repo_is_unchanged_by_lenient_reading() -> None:
    """Today's own profile read leniently is today's profile: nothing unknown, nothing refused."""
    profile = PROJECT.profile("glm5-nvfp4").profile
    stored = read_stored_profile(profile.model_dump(mode="json"))
    assert (stored.server, stored.service, stored.parallel) == (profile.server, profile.service, profile.parallel)
    assert stored.unknown == () and stored.refused == ()


# ---------------------------------------------------------------------------------------------------------
# `rollback` against a scripted host: two releases, A (the target) and B (current, serving)


def test_a_hand_rollback_to_a_release_whose_venv_is_gone_changes_nothing() -> None:
    host = ScriptedHost({"A": [READY], "B": [READY]}, sglang_ok=False)
    with pytest.raises(PreflightError, match="release A: no SGLang found"):
        host.rollback()
    assert all(name.startswith(("store facts:", "host facts:")) for name in host.ran_names()), \
        "only reads ran: no lock, switch, restart or history line"


def test_a_hand_rollback_whose_target_dies_switches_back_to_the_serving_release() -> None:
    host = ScriptedHost({"A": [DEAD], "B": [READY]})
    with pytest.raises(ReadinessFailed, match="rolled back, release B is serving") as caught:
        host.rollback()
    assert caught.value.exit_code == 6
    assert host.switches() == ["releases/A", "releases/B"]
    assert [line[:3] for line in host.history()] == [("rollback", FAILED, "A"), ("rollback", HEALTHY, "B")]
    assert "lock: release" in host.ran_names()


def test_ctrl_c_during_a_rollback_switches_back_and_records_it() -> None:
    host = ScriptedHost({"A": [Interrupt(signal.SIGINT)], "B": [READY]})
    with pytest.raises(Interrupted, match="release B is serving") as caught:
        host.rollback()
    assert caught.value.exit_code == 130 and "SIGINT" in caught.value.message
    assert [line[:3] for line in host.history()] == [("rollback", FAILED, "A"), ("rollback", HEALTHY, "B")]
    assert "interrupted by SIGINT" in host.history()[0][3]
    assert "lock: release" in host.ran_names()


def test_a_second_signal_during_the_switch_back_stops_it_and_says_what_the_host_is() -> None:
    host = ScriptedHost({"A": [Interrupt(signal.SIGTERM)], "B": [Interrupt(signal.SIGINT)]})
    host.reply("state: current", stdout="releases/B\n")
    host.reply("state: unit", stdout="ActiveState=activating\nSubState=start\n")
    with pytest.raises(Interrupted, match="interrupted again") as caught:
        host.rollback()
    assert caught.value.exit_code == 130
    assert "current: B, unit activating/start" in caught.value.message
    assert [line[:2] for line in host.history()] == [("rollback", FAILED), ("rollback", FAILED)]
    assert "lock: release" in host.ran_names()


def test_a_signal_before_the_switch_changes_nothing_and_says_so() -> None:
    host = ScriptedHost({"A": [READY], "B": [READY]})
    host.reply(host_facts.FACT_GPUS, raises=Interrupt(signal.SIGTERM))  # type: ignore[arg-type]
    with pytest.raises(Terminated, match="before the switch; nothing was switched or restarted: release B is current"):
        host.rollback()
    assert all(name.startswith(("store facts:", "host facts:")) for name in host.ran_names())


# ---------------------------------------------------------------------------------------------------------
# The dry run is what runs: a deploy executes the batches its plan lists


def _not_listed(step: Step | Put) -> bool:
    """The lock's take and release, and the reads prune decides from: steps of a deploy that change nothing listed."""
    return step.name.startswith(("lock:", "store facts:", "venv facts:", "model versions: ", "model cache: ")) or \
        (isinstance(step, Put) and step.dest == LAYOUT.lock_owner)


def _shown(step: Step | Put) -> str:
    """A step as the dry run lists it; release.json's bytes are left out (it records when it was staged)."""
    return f"put {step.dest} (mode 0{step.mode:o})" if isinstance(step, Put) else describe([step])[0]


def test_the_dry_run_lists_exactly_the_steps_the_deploy_then_runs() -> None:
    host, loaded = a_host(), changed_profile()
    planned = deploy(loaded, target(), host, RecordingProgress(), Options(dry_run=True, grace_s=0))
    assert planned.plan is not None
    batches = planned.plan.batches
    assert [batch.kind for batch in batches.in_order()] == ["stage", "switch and restart", "once verified"]
    assert [f"{batch.kind}:" for batch in batches.in_order()] == [line for line in planned.plan.dry_run_lines()
                                                                  if line.endswith(":")]
    host.batches.clear()
    host.results.clear()
    outcome = deploy(loaded, target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed" and outcome.release_id == planned.release_id
    ran = [[_shown(step) for step in batch if not _not_listed(step)] for batch in host.batches]
    before_ladder = [_shown(step) for step in (*batches.stage, *batches.switch.activate)]
    assert before_ladder in ran, "the stage, switch and restart batches ran as listed, in one round trip"
    taking = [step.name for step in host.batches[ran.index(before_ladder)][:5]]
    assert taking == ["lock: store directory", "lock: take", f"put {LAYOUT.lock_owner}", "lock: boot id",
                      store.LOCK_STORE_UNCHANGED], \
        "the lock is taken in that round trip, the first that changes the host"
    after = ran[ran.index(before_ladder) + 1:]
    probes = [batch for batch in after if batch and batch[0].startswith("readiness probe")]
    verified = [_shown(step) for step in batches.switch.verified]
    assert probes and after[len(probes)][:len(verified)] == verified, "sent with the history line, first"
