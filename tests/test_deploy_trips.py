"""A deploy's round trips against a scripted host (no SSH): a no-op is the facts' one round trip and writes nothing,
not even the lock; a change takes the lock in its first round trip, only if the store is still as read."""

from __future__ import annotations

import json

import pytest
from helpers.deploy_plan import PROJECT, target
from helpers.deploy_trips import WRITES, serving_the_profile, with_service, writes
from helpers.host_lock import HOLDER
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT, LIVE_PROBE, READY, ScriptedHost, _tags, a_host, changed_profile
from helpers.store_output import release_entries

from deploy_lib import store
from deploy_lib.commands.deploy import Options, SweepCandidate, deploy
from deploy_lib.errors import LockHeld, PreflightError
from deploy_lib.facts import host as host_facts
from deploy_lib.host.models import FACT_CACHE
from deploy_lib.host.readiness import LIVE_UNIT
from deploy_lib.remote import Put, Step, round_trips


def test_a_no_op_deploy_is_one_round_trip_and_writes_nothing_not_even_the_lock() -> None:
    host, rid = serving_the_profile()
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (outcome.action, outcome.release_id) == ("unchanged", rid)
    assert len(host.batches) == 1 and len(round_trips(host.batches[0])) == 1, "the facts' one round trip"
    assert LIVE_UNIT in host.ran_names(), "the live probe's unit state rode in it"
    assert not any(name.startswith(LIVE_PROBE) for name in host.ran_names()), "no probe process on the host"
    [(where, port, request)] = host.forwards
    assert (where, port) == ("127.0.0.1", 8000) and request.startswith(b"GET /ready HTTP/1.1\r\n"), \
        "its health request went through the SSH connection"
    assert writes(host) == []


# What only preflight reads (deploy_lib/facts/host.py PREFLIGHT_ONLY): a no-op never sends it.
PREFLIGHT_TOOLS = ("nvidia-smi", "df", "ss")


def tools_run(host: ScriptedHost, batch: list[Step | Put] | None = None) -> set[str]:
    return {step.argv[0] for step in (host.ran if batch is None else batch) if isinstance(step, Step)}


def test_a_no_op_reads_no_gpus_disk_or_port_listeners() -> None:
    host, _ = serving_the_profile()
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "unchanged"
    assert tools_run(host) & set(PREFLIGHT_TOOLS) == set(), "no nvidia-smi, df or ss on the host"
    assert host_facts.FACT_IMPORT not in host.ran_names()


def test_a_change_reads_what_preflight_needs_in_one_round_trip_after_the_decision_and_before_the_lock() -> None:
    host, _ = serving_the_profile()
    outcome = deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed"
    decided, preflight_read, staged = host.batches[:3]
    assert tools_run(host, decided) & set(PREFLIGHT_TOOLS) == set()
    assert tools_run(host, preflight_read) >= set(PREFLIGHT_TOOLS) and len(round_trips(preflight_read)) == 1
    assert not [step for step in preflight_read if step.name.startswith(WRITES)], "read beside the lock, not under it"
    assert staged[1].name == store.LOCK_TAKE, "the lock is taken with the stage, the first change, as before"


def test_a_deploy_expecting_a_change_reads_what_preflight_needs_with_the_decision_and_a_refusal_changes_nothing(
        ) -> None:
    """A sweep's candidate (SweepCandidate): one read before the stage; 4 GPUs for a profile of 8 still refused
    before anything is written."""
    host, _ = serving_the_profile()
    outcome = deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0),
                     sweep=SweepCandidate(keep_releases_at_least=0))
    assert outcome.action == "deployed"
    decided, staged = host.batches[:2]
    assert tools_run(host, decided) >= set(PREFLIGHT_TOOLS) and len(round_trips(decided)) == 1
    assert staged[1].name == store.LOCK_TAKE, "the lock is taken with the stage, the first change"
    host, _ = serving_the_profile()
    host.reply(host_facts.FACT_GPUS, stdout="".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, "
                                                    "12.0, 97887, 0, 30, 600, 0, 580\n" for i in range(4)))
    with pytest.raises(PreflightError, match="the profile's parallel: tp 8 needs 8 GPUs per node, nvidia-smi shows 4"):
        deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0),
               sweep=SweepCandidate(keep_releases_at_least=0))
    assert len(host.batches) == 1 and writes(host) == [], "the one read, not even the lock"


def test_a_dry_run_reads_what_preflight_needs_in_its_one_round_trip_and_refuses_as_a_deploy_would() -> None:
    host, _ = serving_the_profile()
    planned = deploy(changed_profile(), target(), host, RecordingProgress(), Options(dry_run=True))
    assert planned.action == "planned"
    assert tools_run(host, host.batches[0]) >= set(PREFLIGHT_TOOLS)
    assert sum(len(round_trips(batch)) for batch in host.batches) == 1
    host.reply(host_facts.FACT_GPUS, stdout="0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-0, 12.0, 97887, 0, "
                                            "30, 600, 0, 580\n")
    with pytest.raises(PreflightError, match="the profile's parallel: tp 8 needs 8 GPUs per node, nvidia-smi shows 1"):
        deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(dry_run=True))


@pytest.mark.parametrize(("fact", "stdout", "refusal"), [
    (host_facts.FACT_GPUS, "".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 0, "
                                   "30, 600, 0, 580\n" for i in range(4)),
     "the profile's parallel: tp 8 needs 8 GPUs per node, nvidia-smi shows 4"),
    (host_facts.FACT_DISK, "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/sda 10 1 1048576 99% /\n",
     "only 1 MiB free under"),
    (host_facts.FACT_PORT, 'LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("nc",pid=999,fd=3))\n',
     "port 8000 is already in use by another process"),
])
def test_a_change_preflight_refuses_changes_nothing_on_the_host(fact: str, stdout: str, refusal: str) -> None:
    """Inputs tried: 4 GPUs for a profile of 8; 1 MiB free; the port held by another process while the unit is
    stopped (so the release must be restarted: a change)."""
    host, _ = serving_the_profile()
    host.reply(fact, stdout=stdout)
    profile = changed_profile()
    if fact == host_facts.FACT_PORT:
        host.reply(host_facts.FACT_UNIT, stdout="ActiveState=inactive\nSubState=dead\nLoadState=loaded\n")
        profile = PROJECT.profile("glm5-nvfp4")
    with pytest.raises(PreflightError, match=refusal):
        deploy(profile, target(), host, RecordingProgress(), Options(grace_s=0))
    assert len(host.batches) == 2, "the decision's read, then preflight's"
    assert writes(host) == [] and not any(isinstance(step, Put) for step in host.ran), "not even the lock"


def test_a_host_that_forwards_nothing_is_probed_by_the_host_probe_in_one_more_round_trip() -> None:
    """Input tried: the host's sshd refuses TCP forwarding (AllowTcpForwarding no)."""
    host, rid = serving_the_profile()
    host.forwarding = False
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (outcome.action, outcome.release_id) == ("unchanged", rid)
    assert [batch[0].name for batch in host.batches[1:]] == [LIVE_PROBE]
    assert writes(host) == []


@pytest.mark.parametrize("forwarding", [True, False], ids=["forwarded", "host probe"])
@pytest.mark.parametrize("answer", [{"health_status": 503}, {"port_open": False, "health_status": None}],
                         ids=["503", "port closed"])
def test_a_release_current_but_not_ready_is_restarted_under_the_lock(forwarding: bool, answer: dict) -> None:
    """Inputs tried: the current release's health endpoint answering 503, and its port closed; its health request
    forwarded through the connection, and sent by the host probe."""
    host, rid = serving_the_profile()
    host.forwarding = forwarding
    host.probes[rid] = [{**READY, **answer}, READY]
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed" and outcome.release_id == rid
    names = host.ran_names()
    assert names.index(store.LOCK_TAKE) < names.index(store.LOCK_STORE_UNCHANGED) < names.index("systemd: restart")
    assert names[-1] == "lock: release"


def test_a_deploy_while_another_run_holds_the_lock_is_refused_from_the_facts_alone() -> None:
    """Input tried: the lock held by a live deploy on another machine, seen in the facts' read."""
    host, _ = serving_the_profile()
    host.reply(store.FACT_LOCK, stdout="1764499990\n").reply(store.FACT_LOCK_OWNER, stdout=HOLDER.to_json().decode())
    with pytest.raises(LockHeld, match=r"held by other@elsewhere \(pid 77\).*\(deploy glm5-omp4\); lock age 10 s") \
            as refused:
        deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert refused.value.exit_code == 4 and "invoke unlock --force" in (refused.value.hint or "")
    assert len(host.batches) == 1 and writes(host) == []


def test_a_store_changed_between_the_read_and_the_take_ends_the_deploy_with_nothing_changed() -> None:
    """Input tried: another command switched or pruned between this deploy's facts and its first change (the
    compare-and-set step exits 1)."""
    host, _ = serving_the_profile()
    host.reply(store.LOCK_STORE_UNCHANGED, exit_code=1)
    with pytest.raises(LockHeld, match=r"changed after this command read it.*nothing was changed") as refused:
        deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    assert refused.value.exit_code == 4
    assert [name for name in writes(host) if not name.startswith("lock:")] == [f"put {LAYOUT.lock_owner}"], \
        "only the lock's own owner.json was written"
    assert host.ran_names()[-2:] == ["lock: still ours", "lock: release"], "the lock it took is released"


def test_a_lock_taken_by_another_run_between_the_read_and_the_take_is_theirs() -> None:
    """Input tried: the lock free in the facts, then `mkdir` of the lock failing (another run took it)."""
    host, _ = serving_the_profile()
    host.reply(store.LOCK_TAKE, exit_code=1, stderr="mkdir: cannot create directory: File exists")
    host.reply(store.FACT_LOCK, stdout="1764499990\n").reply(store.FACT_LOCK_OWNER, stdout=HOLDER.to_json().decode())
    host.reply(store.FACT_LOCK, exit_code=1, times=1)  # the facts' read: no lock yet
    with pytest.raises(LockHeld, match=r"held by other@elsewhere \(pid 77\)"):
        deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    assert "lock: release" not in host.ran_names(), "their lock is left alone"
    assert not any(isinstance(step, Put) and step.dest != LAYOUT.lock_owner for step in host.ran)


def test_after_the_ladder_one_round_trip_commits_prunes_and_releases_the_lock() -> None:
    """Input tried: a third release with keep_releases 2 on a host holding A and B (B current): A goes."""
    host, loaded = a_host(), with_service(changed_profile(), keep_releases=2)
    plan = deploy(loaded, target(), host, RecordingProgress(), Options(dry_run=True)).plan
    assert plan is not None
    third = {**plan.release.record(), "staged_at": "2026-11-30T12:00:00+00:00", "tags": _tags("C").as_dict()}
    files = host.results[[r.step.name for r in host.results].index(store.FACT_RELEASE_FILES)].stdout
    host.reply(store.FACT_RELEASE_DIRS, stdout=release_entries("A", "B", plan.release.id))
    host.reply(store.FACT_RELEASE_FILES, stdout=f"{files}{LAYOUT.release(plan.release.id)}/release.json\0"
                                                f"{json.dumps(third)}\n")
    outcome = deploy(loaded, target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed"
    ladder, last = host.batches[-2], host.batches[-1]
    assert [step.name for step in ladder] == ["readiness probe (generate)"]
    names = [step.name for step in last]
    assert names[0] == "systemd: reset-failed" and names[-2:] == ["lock: still ours", "lock: release"]
    [removal] = [step for step in last if step.name == "prune releases"]
    assert removal.argv == ("rm", "-rf", "--", str(LAYOUT.releases / "A"))  # type: ignore[union-attr]
    events = [json.loads(step.stdin)["event"] for step in last if step.name == "history: append"]
    assert events == ["deploy", "prune"], "the commit's line, then what the prune removed"


def test_a_deploy_that_prunes_nothing_still_ends_in_one_round_trip_after_the_ladder() -> None:
    host = a_host()
    deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    names = [step.name for step in host.batches[-1]]
    assert host.batches[-2][0].name.startswith("readiness probe")
    assert names == ["systemd: reset-failed", "history: append", "lock: still ours", "lock: release"]


def test_the_weights_cache_listing_runs_while_the_server_starts_and_a_failed_one_prunes_no_weights() -> None:
    """Input tried: the HF cache's listing (a Python on the host, 0.3-0.4 s) cut off by its timeout (exit 124) after
    printing half a result. It rides after the restart, so the server starts without waiting for it; after the
    restart it must not fail the round trip, and what it did not list is not pruned."""
    host = a_host()
    host.reply(lambda step: step.name.startswith(FACT_CACHE), exit_code=124, stdout='RESULT {"revisions": [{"repo"\n')
    outcome = deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    assert outcome.action == "deployed"
    [switch] = [[step.name for step in batch] for batch in host.batches if "systemd: restart" in
                [step.name for step in batch]]
    assert switch[-2:] == ["systemd: restart", f"{FACT_CACHE}/root/.cache/huggingface"]
    assert "prune" not in " ".join(writes(host))


def test_a_hand_rollback_takes_the_lock_with_the_switch_and_releases_it_with_the_history_line() -> None:
    host = ScriptedHost({"A": [READY], "B": [READY]})
    host.rollback()
    switching = next(batch for batch in host.batches if any(step.name == "switch: temp link" for step in batch))
    assert [step.name for step in switching[:2]] == ["lock: store directory", store.LOCK_TAKE]
    assert "rollback to A" in next(step.data.decode() for step in switching if isinstance(step, Put))
    assert [step.name for step in host.batches[-1]] == ["systemd: reset-failed", "history: append",
                                                        "lock: still ours", "lock: release"]


def test_a_hand_rollback_while_another_run_holds_the_lock_changes_nothing() -> None:
    host = ScriptedHost({"A": [READY], "B": [READY]})
    host.reply(store.FACT_LOCK, stdout="1764499990\n").reply(store.FACT_LOCK_OWNER, stdout=HOLDER.to_json().decode())
    with pytest.raises(LockHeld, match=r"held by other@elsewhere \(pid 77\)"):
        host.rollback()
    assert writes(host) == []
