"""Rollback's preflight, lenient reading of releases written by earlier versions, and signals (no SSH)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.store_output import release_entries
from test_deploy_plan import PROJECT, deployed, facts, first_plan, options_accepting, target

from deploy_lib import store
from deploy_lib.deploy import Options, check_release, check_release_files, deploy, probe_target, recorded_tags
from deploy_lib.errors import Interrupted, PreflightError, ReadinessFailed, Terminated
from deploy_lib.facts import host as host_facts
from deploy_lib.facts.host import SGLangInstall
from deploy_lib.health import LIVE_UNIT
from deploy_lib.interrupts import Interrupt, interrupted, signal_name, signals_raise
from deploy_lib.models import FACT_MODEL
from deploy_lib.profile import LoadedProfile, read_stored_profile
from deploy_lib.release.model import RecordedRelease
from deploy_lib.remote import NOT_SENT, Forwarded, OutputLine, Put, Step, StepResult, describe
from deploy_lib.store import (
    ENV_FILE,
    FAILED,
    HEALTHY,
    UNIT_FILE,
    StoreFacts,
    StoreLayout,
    Tags,
    history_entry,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LAYOUT = StoreLayout("sglang")


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


def _tags(release: str) -> Tags:
    return Tags("u@m", "th1", release, "p", "h")


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

READY = {"unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainPID": "7"},
         "port_open": True, "health_status": 200, "generation": {"status": 200, "text": " Paris"}}
DEAD = {"unit": {"ActiveState": "failed", "SubState": "failed", "NRestarts": "0", "ExecMainPID": "0",
                 "Result": "exit-code", "ExecMainStatus": "1", "ExecMainCode": "1"}, "port_open": False}


class ScriptedHost(FakeRemote):
    """A host holding releases A and B (B current and serving); each probe answers for the release `current` names
    with the next of its scripted snapshots (the last one repeats), or raises it. A live probe is answered from the
    same script, its unit state on the host and its health request forwarded (`forwarding`: the host's sshd forwards
    TCP; without, it refuses and the host probe answers)."""

    def __init__(self, probes: dict[str, list[object]], sglang_ok: bool = True, forwarding: bool = True) -> None:
        super().__init__()
        _, plan = first_plan()
        self.current, self.probes, self.forwarding = "B", probes, forwarding
        releases = {rid: {**plan.release.record(), "id": rid, "staged_at": f"2026-11-30T1{n}:00:00+00:00",
                          "tags": {**_tags(rid).as_dict(), "profile": "glm5-nvfp4"}}
                    for n, rid in enumerate(("A", "B"))}
        files = "".join(f"{LAYOUT.releases}/{rid}/release.json\0{json.dumps(meta)}\n" for rid, meta in releases.items())
        history = "".join(history_entry("deploy", HEALTHY, _tags(rid), NOW).to_json().decode() for rid in ("A", "B"))
        sums = plan.release.record()["files"]
        gpus = "".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 0, 30, 600, 0, "
                       "580\n" for i in range(8))
        sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
                  "options": options_accepting(plan.release.args)}
        replies: dict[str, tuple[int, str]] = {
            store.FACT_CURRENT: (0, "releases/B\n"), store.FACT_RELEASE_DIRS: (0, release_entries("A", "B")),
            store.FACT_RELEASE_FILES: (0, files), store.FACT_HISTORY: (0, history),
            store.FACT_CLOCK: (0, "1764500000\n"), store.FACT_LOCK: (1, ""), store.FACT_LOCK_OWNER: (1, ""),
            host_facts.FACT_GPUS: (0, gpus),
            host_facts.FACT_UNIT: (0, "ActiveState=active\nSubState=running\nMainPID=7\nNRestarts=0\n"
                                      "LoadState=loaded\n"),
            host_facts.FACT_RELEASE_SUMS: (0, "".join(f"{digest}  /x/{name}\n" for name, digest in sums.items())),
            host_facts.FACT_DISK: (0, "Filesystem 1-blocks Used Available Capacity Mounted on\n"
                                      "/dev/sda 1000000000000 1 900000000000 1% /\n"),
            host_facts.FACT_SGLANG: (0, json.dumps(sglang)) if sglang_ok else (127, ""),
        }
        for name, (code, out) in replies.items():
            self.reply(name, exit_code=code, stdout=out)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        for step in batch:
            if step.name == "switch: temp link":
                self.current = step.argv[-2].removeprefix("releases/")  # type: ignore[union-attr]
        if batch and batch[0].name.startswith("readiness probe"):
            self.reply(batch[0].name, stdout=json.dumps(self.next_snapshot()), times=1)
        if any(step.name == LIVE_UNIT for step in batch):  # the script's next snapshot, which `forward` then takes
            unit = dict(self.next_snapshot(take=False).get("unit") or {})
            self.reply(LIVE_UNIT, stdout="".join(f"{key}={value}\n" for key, value in unit.items()), times=1)
        return super().run(batch, on_output)

    def next_snapshot(self, take: bool = True) -> dict:
        script = self.probes[self.current]
        answer = script.pop(0) if take and len(script) > 1 else script[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        self.forwards.append((host, port, data))
        if not self.forwarding:
            return NOT_SENT
        snapshot = self.next_snapshot()
        if not snapshot.get("port_open"):
            return Forwarded(sent=True, error="Connection refused")
        status = snapshot.get("health_status")
        return Forwarded(sent=True, connected=True, answer=f"HTTP/1.1 {status} -\r\n\r\n".encode() if status else b"")

    def rollback(self, to: str = "A") -> object:
        from helpers.recording_progress import RecordingProgress

        from deploy_lib.deploy import rollback

        self.progress = RecordingProgress()
        return rollback(target(), "sglang", self, self.progress, to, {}, grace_s=0)

    def history(self) -> list[tuple[str, str, str, str]]:
        lines = [json.loads(step.stdin) for step in self.ran
                 if getattr(step, "name", "") == "history: append"]
        return [(line["event"], line["outcome"], line["release"], line["cause"]) for line in lines]

    def switches(self) -> list[str]:
        return [step.argv[-2] for step in self.ran if getattr(step, "name", "") == "switch: temp link"]


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


class ServingEveryRelease(dict):  # type: ignore[type-arg]
    def __missing__(self, release_id: str) -> list[object]:
        return [READY]


def _not_listed(step: Step | Put) -> bool:
    """The lock's take and release, and the reads prune decides from: steps of a deploy that change nothing listed."""
    return step.name.startswith(("lock:", "store facts:", "venv facts:", "model versions: ", "model cache: ")) or \
        (isinstance(step, Put) and step.dest == LAYOUT.lock_owner)


def _shown(step: Step | Put) -> str:
    """A step as the dry run lists it; release.json's bytes are left out (it records when it was staged)."""
    return f"put {step.dest} (mode 0{step.mode:o})" if isinstance(step, Put) else describe([step])[0]


LIVE_PROBE = "readiness probe (health)"


def a_host() -> ScriptedHost:
    """Releases A and B (B current and serving), the model staged, and an SGLang that knows the profile's flags."""
    host = ScriptedHost(ServingEveryRelease())
    model = {"commit": "c" * 40, "files": [{"path": "config.json", "size": 12, "blob": "c1"}], "missing": [],
             "missing_bytes": 0, "free_bytes": 10**12, "hf_home": "/root/.cache/huggingface", "asked_hub": True}
    host.reply(FACT_MODEL, stdout=f"RESULT {json.dumps(model)}\n")
    host.reply(host_facts.FACT_UNIT_LINK, stdout=f"{LAYOUT.current / UNIT_FILE}\n")
    sums = first_plan()[1].release.record()["files"]
    host.reply(host_facts.FACT_FILE_SUMS, stdout="".join(f"{digest}  /x/{name}\n" for name, digest in sums.items()))
    sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
              "options": options_accepting((*first_plan()[1].release.args, "--revision", "c" * 40))}
    host.reply(host_facts.FACT_SGLANG, stdout=json.dumps(sglang))
    host.reply(LIVE_PROBE, stdout=json.dumps(READY))
    return host


def changed_profile() -> LoadedProfile:
    """The reference profile with one env var more: a release other than the current one."""
    base = PROJECT.profile("glm5-nvfp4")
    return base.model_copy(update={"profile": base.profile.model_copy(update={"env": {"NCCL_DEBUG_SUBSYS": "ALL"}})})


def test_the_dry_run_lists_exactly_the_steps_the_deploy_then_runs() -> None:
    host, loaded = a_host(), changed_profile()
    planned = deploy(loaded, target(), host, RecordingProgress(), Options(dry_run=True, grace_s=0))
    assert planned.plan is not None
    batches = planned.plan.batches
    assert list(batches) == ["stage", "switch and restart", "once verified"]
    assert [f"{phase}:" for phase in batches] == [line for line in planned.plan.dry_run_lines() if line.endswith(":")]
    host.batches.clear()
    host.results.clear()
    outcome = deploy(loaded, target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed" and outcome.release_id == planned.release_id
    ran = [[_shown(step) for step in batch if not _not_listed(step)] for batch in host.batches]
    before_ladder = [_shown(step) for step in (*batches["stage"], *batches["switch and restart"])]
    assert before_ladder in ran, "the stage, switch and restart batches ran as listed, in one round trip"
    taking = [step.name for step in host.batches[ran.index(before_ladder)][:5]]
    assert taking == ["lock: store directory", "lock: take", f"put {LAYOUT.lock_owner}", "lock: boot id",
                      store.LOCK_STORE_UNCHANGED], \
        "the lock is taken in that round trip, the first that changes the host"
    after = ran[ran.index(before_ladder) + 1:]
    probes = [batch for batch in after if batch and batch[0].startswith("readiness probe")]
    verified = [_shown(step) for step in batches["once verified"]]
    assert probes and after[len(probes)][:len(verified)] == verified, "sent with the history line, first"
