"""preflight.gpu_check in a deploy (no SSH): when the check runs, the plan's batch and its dry run, the refusal of a
venv without torch, and whole deploys against a scripted host whose check step answers with the outputs recorded on
two real H200s (tests/data/gpu_check/h200x2-2026-11-30/): verified -> the release starts; a wrong sum, a hang or an
NCCL error -> a failed start, rolled back before SGLang ran, diagnosed `nccl_check`."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.deploy_plan import NOW, deployed, facts, target
from helpers.fake_remote import FakeRemote
from helpers.gpu_check_deploy import TORCH, CheckHost, checked, recorded_stdout
from helpers.rollback import READY

from deploy_lib.deploy import plan as engine
from deploy_lib.deploy import preflight as deploy_preflight
from deploy_lib.errors import PreflightError, ReadinessFailed
from deploy_lib.facts.diagnose import diagnose
from deploy_lib.gpu_check import check_reasons, check_step, subject_of_profile, subject_of_release
from deploy_lib.profile import LoadedProfile, Profile
from deploy_lib.remote import Step
from deploy_lib.store import FAILED, HEALTHY


def metadata(loaded: LoadedProfile, **versions: str | None) -> dict[str, Any]:
    """release.json of the profile's release as a host with `versions` (torch, NCCL) would record it."""
    host = facts(venv_versions=versions) if versions else facts()
    return engine.plan_deploy(loaded, target(), host, {}, False, NOW).release.record()


# ---------------------------------------------------------------------------------------------------------
# when the check runs


def test_the_check_runs_when_the_nccl_setup_differs_from_the_current_release() -> None:
    current = metadata(checked(), **TORCH)
    assert check_reasons(None, current) == ("no current release to compare with",)
    assert check_reasons(current, current) == ()
    assert check_reasons(current, metadata(checked(p2p_disable=True), **TORCH)) == ("env NCCL_P2P_DISABLE (none) -> 1",)
    assert check_reasons(current, metadata(checked(p2p_level="PHB"), **TORCH)) == ("env NCCL_P2P_LEVEL 5 -> PHB",)
    assert check_reasons(current, metadata(checked(tp=4), **TORCH)) == ("TP 2 -> 4",)
    assert check_reasons(current, metadata(checked(), **{**TORCH, "torch_version": "2.12.0+cu130"})) == \
        ("torch 2.11.0+cu130 -> 2.12.0+cu130",)
    assert check_reasons(current, metadata(checked(), **{**TORCH, "nccl_version": "2.29.1"})) == \
        ("NCCL 2.28.9 -> 2.29.1",)


def test_an_environment_nccl_does_not_read_is_no_reason_and_an_older_release_always_is() -> None:
    current = metadata(checked(), **TORCH)
    other_env = checked()
    other_env = other_env.model_copy(update={"profile": other_env.profile.model_copy(update={
        "env": {**other_env.profile.env, "OMP_NUM_THREADS": "4", "TORCH_NCCL_BLOCKING_WAIT": "1"}})})
    assert check_reasons(current, metadata(other_env, **TORCH)) == ("env TORCH_NCCL_BLOCKING_WAIT (none) -> 1",)
    written_before_versions_were_recorded = {k: v for k, v in current.items()
                                             if k not in ("torch_version", "nccl_version")}
    assert check_reasons(written_before_versions_were_recorded, current) == \
        ("torch (none) -> 2.11.0+cu130", "NCCL (none) -> 2.28.9")


def test_a_tp_group_spread_over_nodes_is_checked_on_this_nodes_gpus() -> None:
    """Input tried: TP 16 over two nodes of 8 GPUs (parallel.nnodes 2): each host checks its 8 ranks."""
    data = checked().profile.model_dump(mode="json")
    data["parallel"].update(tp=16, nnodes=2, dist_init_addr="192.0.2.10:5000")
    profile = Profile.model_validate(data)
    assert subject_of_profile(LoadedProfile(name="x", path=Path("x.yaml"), chain=("x",), profile=profile)
                              ).world_size == 8
    assert subject_of_release("r", {"venv": "/v", "profile": data}).world_size == 8
    assert subject_of_release("r", metadata(checked(tp=4))).world_size == 4


def test_the_key_alone_is_not_a_new_release() -> None:
    """preflight.gpu_check decides how a release is checked, not how it starts: turning it on restarts nothing."""
    assert metadata(checked(gpu_check=True))["id"] == metadata(checked(gpu_check=False))["id"]


# ---------------------------------------------------------------------------------------------------------
# the plan and its dry run


def plan_over(current: LoadedProfile, new: LoadedProfile, current_versions: dict[str, str] | None = TORCH,
              **host: Any) -> engine.Plan:
    record = deployed(engine.plan_deploy(current, target(), facts(venv_versions=current_versions), {}, False, NOW))
    return engine.plan_deploy(new, target(), facts(current=record, active="active", **host), {}, False, NOW)


def test_the_plan_stops_the_old_server_and_checks_between_staging_and_the_switch() -> None:
    plan = plan_over(checked(), checked(p2p_disable=True), venv_versions=TORCH)
    assert [batch.kind for batch in plan.batches.in_order()] == [
        "stage", "gpu check", "switch and restart", "once verified"]
    stop, *topology, check = plan.batches.gpu_check
    assert isinstance(stop, Step) and stop.argv == ("systemctl", "stop", "--", "sglang.service")
    assert [s.argv[:3] for s in topology if isinstance(s, Step)] == [("nvidia-smi", "topo", "-m")] + \
        [("nvidia-smi", "topo", "-p2p")] * 2
    assert isinstance(check, Step) and check.argv == ("/root/ml-env/bin/python3", "-") and check.stdin is not None
    call = ast.parse(check.stdin.decode().splitlines()[-1]).body[0].value  # run_check_and_print(CONFIG, SOURCE)
    assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Constant)
    config = json.loads(call.args[0].value)
    assert config["world_size"] == 2 and config["env"] == plan.release.environment, \
        "exactly the release's non-secret environment"
    assert plan.release.environment["NCCL_P2P_DISABLE"] == "1"
    lines = plan.dry_run_lines()
    assert "gpu check:" in lines and lines.index("gpu check:") < lines.index("switch and restart:")
    assert any("gpu check (preflight.gpu_check): env NCCL_P2P_DISABLE (none) -> 1: the old server stops" in line
               for line in lines)


def test_no_check_when_nothing_it_depends_on_changed_or_the_key_is_off() -> None:
    ib = plan_over(checked(), checked(ib_disable=False), venv_versions=TORCH)
    assert ib.gpu_check_reasons == ("env NCCL_IB_DISABLE 1 -> 0",), "NCCL_IB_DISABLE is NCCL's too"
    data = checked().profile.model_dump(mode="json")
    data["memory"]["mem_fraction_static"] = 0.9
    other_memory = checked().model_copy(update={"profile": Profile.model_validate(data)})
    plan = plan_over(checked(), other_memory, venv_versions=TORCH)
    assert not plan.batches.gpu_check and plan.gpu_check_reasons == ()
    assert any("gpu check (preflight.gpu_check) not needed" in note for note in plan.notes)
    off = plan_over(checked(), checked(gpu_check=False, p2p_disable=True), venv_versions=TORCH)
    assert not off.batches.gpu_check and not any("gpu check" in note for note in off.notes)


def test_a_hand_run_server_is_stopped_before_the_check_not_at_the_restart() -> None:
    record = deployed(engine.plan_deploy(checked(), target(), facts(venv_versions=TORCH), {}, False, NOW))
    host = facts(current=record, active="inactive", venv_versions=TORCH)
    plan = engine.plan_deploy(checked(p2p_disable=True), target(), host, {}, False, NOW, hand_pid=4242)
    assert [s.name for s in plan.batches.gpu_check[:3]] == [
        "adopted server: stop pid 4242", "adopted server: wait for pid 4242 to exit", "systemd: stop"]
    assert not any("4242" in s.name for s in plan.batches.switch.activate)


def test_a_venv_without_torch_is_refused_at_preflight_naming_the_venv_and_the_key() -> None:
    """Input tried: a venv whose distributions include no torch (the sandbox's), with the check due."""
    plan = plan_over(checked(), checked(p2p_disable=True), current_versions=None)
    loaded = checked(p2p_disable=True)
    with pytest.raises(PreflightError) as refused:
        deploy_preflight.preflight(plan, loaded, target(), facts(plan.release.args))
    assert refused.value.exit_code == 3
    assert "preflight.gpu_check: the NCCL check must run (env NCCL_P2P_DISABLE (none) -> 1), but /root/ml-env " \
           "has no torch" in refused.value.message
    assert "preflight.gpu_check: false in profile glm5-nvfp4" in (refused.value.hint or "")
    deploy_preflight.preflight(plan, loaded, target(), facts(plan.release.args, venv_versions=TORCH))


# ---------------------------------------------------------------------------------------------------------
# whole deploys against a scripted host (current release B serving; the new release's check step answers with
# a recorded run)


def names_in_order(host: FakeRemote, *names: str) -> list[int]:
    ran = host.ran_names()
    return [ran.index(name) for name in names]


def test_a_verified_check_lets_the_release_start_and_times_the_phase() -> None:
    host = CheckHost(recorded_stdout("deploy-step-reference-env"), [READY])
    outcome = host.deploy(checked(p2p_disable=True))
    assert outcome.action == "deployed" and "gpu check" in outcome.timings
    stop, check, switch = names_in_order(host, "systemd: stop", "all-reduce check", "switch: temp link")
    assert stop < check < switch, "the old server stops, the check runs, then the switch and the start"
    assert host.switches() == [f"releases/{outcome.release_id}"]
    assert [line[:3] for line in host.history()] == [("deploy", HEALTHY, outcome.release_id)]
    assert ("gpu check: all-reduce over 2 GPUs verified exactly at every size (P2P/CUMEM; busbw 296.3 GB/s at "
            "256 MiB)") in [text for kind, text in host.progress.events if kind == "note"]


@pytest.mark.parametrize(("run", "cause"), [
    ("corrupt", "verification failed at 1 MiB: GPU0 (received from GPU1): element 131072: expected 15, got 16"),
    ("hang", "hang: rank 0 (GPU0) did not finish: inside the all-reduce of 1048576 bytes (waiting on a peer)"),
    ("deploy-step-socket-ifname-missing", "error: rank 0 (GPU0) exited 1 before NCCL was initialised: "
     "torch.distributed.DistBackendError: NCCL error in: "),
    ("rank-error", "error: rank 1 (GPU1) exited 1 outside any all-reduce, after 0 bytes (never entered the next): "
     "RuntimeError: planted failure on rank 1"),
])
def test_a_failed_check_is_a_failed_start_rolled_back_before_sglang_ran(run: str, cause: str) -> None:
    host = CheckHost(recorded_stdout(run), [READY])
    with pytest.raises(ReadinessFailed) as failed:
        host.deploy(checked(p2p_disable=True))
    error = failed.value
    assert error.exit_code == 6 and "rolled back, release B is serving" in error.message
    assert f"the NCCL check before the start failed: {cause}" in error.message and "[nccl_check]" in error.message
    assert host.switches() == ["releases/B"], "never switched to the new release: only back to B"
    history = host.history()
    assert [line[:2] for line in history] == [("deploy", FAILED), ("rollback", HEALTHY)]
    assert cause in history[0][3] and "SGLang was not started" in history[0][3]
    assert history[1][2] == "B"
    assert all(line.startswith("gpu-check: ") for line in error.evidence)
    assert "invoke gpu-check --profile glm5-nvfp4" in (error.hint or "")


def test_an_nccl_error_names_nccls_own_warning() -> None:
    host = CheckHost(recorded_stdout("deploy-step-socket-ifname-missing"), [READY])
    with pytest.raises(ReadinessFailed, match=r"\(NCCL WARN Bootstrap : no socket interface found\)"):
        host.deploy(checked(socket_ifname="nonexistent0"))


def test_a_check_that_cannot_run_there_fails_the_release_and_says_what_is_missing() -> None:
    """The real step's program run by this machine's python (no torch): its real output is the host's answer."""
    step = check_step(sys.executable, 2, {}, [1024], 30)
    done = subprocess.run(step.argv, input=step.stdin, capture_output=True, timeout=120, check=True)
    host = CheckHost(done.stdout.decode(), [READY])
    with pytest.raises(ReadinessFailed, match=r"all-reduce not run: needs torch with CUDA"):
        host.deploy(checked(p2p_disable=True))
    assert host.switches() == ["releases/B"]


def test_without_torch_the_deploy_is_refused_before_anything_stops() -> None:
    host = CheckHost(recorded_stdout("deploy-step-reference-env"), [READY], torch=False)
    with pytest.raises(PreflightError, match="has no torch") as refused:
        host.deploy(checked(p2p_disable=True))
    assert refused.value.exit_code == 3
    assert not {"systemd: stop", "all-reduce check", "switch: temp link", "history: append", "lock: take"} & \
        set(host.ran_names()), "refused from the facts' read alone: nothing changed, not even the lock"


def test_the_diagnosis_table_reads_the_checks_report_first() -> None:
    """A failed rank's line quotes NCCL's errors, which the journal signatures below nccl_check would also match."""
    line = "gpu-check: error: rank 1 (GPU1) exited 1 before NCCL was initialised: ncclSystemError: x"
    assert diagnose([line]).signature == "nccl_check"
    assert diagnose([line.removeprefix("gpu-check: ")]).signature == "nccl_p2p", "a server's journal line is not it"
