"""What an operator meets on a real host, on the sandbox VM: no passwordless sudo, a server started by hand and
adopted as release 0, a hand-written unit, and the stop/start/restart/uninstall verbs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import Rig

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.adopt import adopt
from deploy_lib.commands.status import read_status
from deploy_lib.commands.uninstall import uninstall
from deploy_lib.errors import DriftDetected, ReadinessFailed, SudoPasswordRequired
from deploy_lib.release.server_args import sglang_args
from sandbox import manage

pytestmark = pytest.mark.sandbox
SUDOERS = "/etc/sudoers.d/deploy"


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return Rig.on(sandbox_venv, tmp_path_factory, {})


def test_without_passwordless_sudo_deploy_exits_5_naming_the_sudoers_line(rig: Rig) -> None:
    releases_before = rig.release_dirs()
    rig.write(SUDOERS, "deploy ALL=(ALL) ALL\n")
    try:
        with pytest.raises(SudoPasswordRequired) as raised:
            rig.deploy("glm5-nvfp4")
    finally:
        rig.write(SUDOERS, "deploy ALL=(ALL) NOPASSWD:ALL\n")
    assert raised.value.exit_code == 5
    assert "asks deploy for a password" in raised.value.message
    assert "deploy ALL=(ALL) NOPASSWD: ALL" in str(raised.value.hint)
    assert "edited on the host" not in str(raised.value)
    assert rig.release_dirs() == releases_before


def test_stop_start_restart_and_status_show_state_drift_and_endpoint(rig: Rig) -> None:
    release = rig.deploy("glm5-nvfp4").release_id
    with rig.connect() as (target, remote):
        assert engine.stop(target, "sglang", remote).action == "stopped"
        assert rig.unit_state() == "inactive"
        started = engine.start(target, "sglang", remote, RecordingProgress(), {}, restart=False)
        assert (started.action, started.release_id) == ("started", release) and rig.unit_state() == "active"
        pid_before = rig.main_pid()
        restarted = engine.start(target, "sglang", remote, RecordingProgress(), {}, restart=True)
        assert restarted.action == "restarted" and restarted.ready is not None
        assert rig.main_pid() != pid_before
        assert [(e["event"], e["outcome"]) for e in rig.history()[-3:]] == [
            ("stop", "stopped"), ("start", "healthy"), ("restart", "healthy")]
        report = read_status(target, "sglang", remote)
        assert report.endpoint == f"http://{rig.guest.guest_ip}:8000" and report.drift == ()
        rig.root(f"sed -i 's/OMP_NUM_THREADS=\"8\"/OMP_NUM_THREADS=\"4\"/' "
                 f"/opt/sglang-deploy/sglang/releases/{release}/sglang.env")
        try:
            drift = read_status(target, "sglang", remote).drift
        finally:
            rig.deploy("glm5-nvfp4", force=True)
    assert drift and "sglang.env was edited on the host" in drift[0]


def test_uninstall_removes_unit_and_store_and_keeps_history_here(rig: Rig, tmp_path: Path) -> None:
    release = rig.deploy("glm5-nvfp4").release_id
    with rig.connect() as (target, remote):
        done = uninstall(target, "sglang", remote, tmp_path)
    assert rig.root("test -e /opt/sglang-deploy/sglang && echo present || echo gone").strip() == "gone"
    assert rig.root("test -e /etc/systemd/system/sglang.service && echo present || echo gone").strip() == "gone"
    assert rig.unit_state() in ("inactive", "unknown")
    history = [json.loads(line) for line in (done.copy / "history.jsonl").read_text().splitlines()]
    assert any(entry["release"] == release for entry in history)
    assert (done.copy / f"{release}.release.json").is_file()


# Our reference user's launch as typed in an activated venv (docs/profiles.md: the reference profile is that
# command), with the DSA spelling SGLang 0.5.23 needs; `--model`, `--tp` and `--disable-cuda-graph` stay as users
# write them.
HAND_ARGS = (
    "--model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 --reasoning-parser glm45 --tool-call-parser glm47 "
    "--trust-remote-code --tp 8 --mem-fraction-static 0.92 --max-running-requests 1024 --kv-cache-dtype auto "
    "--quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass "
    "--dsa-decode-backend trtllm --dsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass "
    "--disable-cuda-graph --disable-radix-cache --host 0.0.0.0 --port 8000"
).split()
HAND_SECRET = "hf_sandbox-only-token"
HAND_ENV = (f"HOME=/root PATH=/opt/ml-env/bin:/usr/local/bin:/usr/bin:/bin VIRTUAL_ENV=/opt/ml-env TERM=xterm "
            f"NCCL_IB_DISABLE=1 NCCL_P2P_LEVEL=5 NCCL_MIN_NCHANNELS=8 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 "
            f"SAFETENSORS_FAST_GPU=1 CUDA_HOME=/usr/local/cuda-12.8 HF_TOKEN={HAND_SECRET}")
HAND_SERVICE = "sglhand"
HAND_FAULT = "/etc/sglang-sim/fault-hand"


def start_by_hand(rig: Rig) -> int:
    """The server as our user starts it: from /root, venv activated, nohup, in the background; waits for /health."""
    rig.root("systemctl stop sglang.service 2>/dev/null || true")  # other tests' releases also serve port 8000
    # `;` not `&&`: only the server goes to the background, so no shell holds the SSH channel open
    pid = int(rig.root(f"cd /root; env -i {HAND_ENV} nohup python -m sglang.launch_server {' '.join(HAND_ARGS)} "
                       "</dev/null >/root/sglang-hand.log 2>&1 & echo $!").strip())
    rig.wait_healthy()
    return pid


def proc_args(rig: Rig, pid: int | str) -> list[str]:
    return rig.root(f"cat /proc/{pid}/cmdline").split("\0")[:-1]


def deploy_the_adopted_profile_then_roll_back_to_0(rig: Rig, profile: str, service: str) -> None:
    """The adopted profile deploys over release 0, and `rollback --to 0` returns to the hand-written command."""
    deployed = rig.deploy(profile, environ={"HF_TOKEN": HAND_SECRET})
    assert deployed.action == "deployed" and deployed.previous_id == "0"
    with rig.connect() as (target, remote):
        assert engine.rollback(target, service, remote, RecordingProgress(), "0", {}).release_id == "0"
    assert proc_args(rig, rig.main_pid(service))[3:] == HAND_ARGS


@pytest.fixture
def hand_run(rig: Rig) -> Iterator[int]:
    pid = start_by_hand(rig)
    yield pid
    rig.root(f"kill {pid} 2>/dev/null; rm -f {HAND_FAULT}; true")
    rig.remove_service(HAND_SERVICE)


def test_adopt_a_hand_run_server_as_release_0_and_a_failed_deploy_returns_to_it(rig: Rig, hand_run: int) -> None:
    with rig.connect() as (target, remote):
        adopted = adopt(target, HAND_SERVICE, remote, "hand", hand_run)
    assert (adopted.release_id, adopted.sglang_version, adopted.venv) == ("0", "0.5.23", "/opt/ml-env")
    assert adopted.secret_names == ("HF_TOKEN",) and HAND_SECRET not in adopted.profile_text
    (rig.project.profiles_dir / "hand.yaml").write_text(adopted.profile_text)
    # the written profile renders the running argv, in the spelling SGLang 0.5.23 documents
    profile = rig.project.profile("hand").profile
    canonical = [{"--model": "--model-path", "--tp": "--tp-size"}.get(a, a) for a in HAND_ARGS]
    at = canonical.index("--disable-cuda-graph")
    canonical[at:at + 1] = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    assert list(sglang_args(profile, "0.5.23")) == canonical
    assert proc_args(rig, hand_run)[3:] == HAND_ARGS
    assert profile.environment()["NCCL_P2P_LEVEL"] == "5" and "HF_TOKEN" not in profile.env
    # release 0 is recorded on the host; its secret is only in the 0600 env file
    store = f"/opt/sglang-deploy/{HAND_SERVICE}"
    assert rig.root(f"readlink {store}/current").strip() == "releases/0"
    assert rig.root(f"stat -c %a {store}/releases/0/sglang.env").strip() == "600"
    assert HAND_SECRET in rig.root(f"cat {store}/releases/0/sglang.env")
    assert HAND_SECRET not in rig.root(f"cat {store}/releases/0/release.json {store}/history.jsonl")
    # the first managed deploy cannot start: the hand-run server is stopped, and release 0 comes back under systemd
    (rig.project.profiles_dir / "hand-broken.yaml").write_text(
        f"extends: hand\nenv:\n  SGLANG_SIM_FAULT: {HAND_FAULT}\nservice:\n  startup_timeout_s: 20\n")
    rig.fault("oom", HAND_FAULT)
    with pytest.raises(ReadinessFailed) as failed:
        rig.deploy("hand-broken", environ={"HF_TOKEN": HAND_SECRET})
    assert failed.value.exit_code == 6 and "rolled back, release 0 is serving" in failed.value.message
    assert rig.root(f"test -d /proc/{hand_run} && echo alive || echo gone").strip() == "gone"
    main_pid = rig.main_pid(HAND_SERVICE)
    assert proc_args(rig, main_pid)[1:] == ["-m", "sglang.launch_server", *HAND_ARGS]  # exactly what ran before
    environ = rig.root(f"tr '\\0' '\\n' < /proc/{main_pid}/environ").splitlines()
    assert f"HF_TOKEN={HAND_SECRET}" in environ and "NCCL_P2P_LEVEL=5" in environ
    assert rig.root(f"readlink {store}/current").strip() == "releases/0"
    # the adopted profile itself deploys, and `rollback --to 0` returns to the hand-written command
    rig.fault(None, HAND_FAULT)
    deploy_the_adopted_profile_then_roll_back_to_0(rig, "hand", HAND_SERVICE)


def test_a_deploy_over_a_hand_written_unit_is_refused_until_forced_and_keeps_a_copy(rig: Rig) -> None:
    service = "sglhand2"
    (rig.project.profiles_dir / "glm5-hand2.yaml").write_text(f"extends: glm5-nvfp4\nservice:\n  name: {service}\n")
    unit = (f"[Unit]\nDescription=SGLang, written by hand\n[Service]\nWorkingDirectory=/root\n"
            f"ExecStart=/opt/ml-env/bin/python -m sglang.launch_server {' '.join(HAND_ARGS)}\n")
    with rig.hand_written_unit(service, unit):
        with pytest.raises(DriftDetected) as dry:
            rig.deploy("glm5-hand2", dry_run=True)
        with pytest.raises(DriftDetected) as refused:
            rig.deploy("glm5-hand2")
        assert refused.value.exit_code == 9 == dry.value.exit_code
        assert f"/etc/systemd/system/{service}.service is a unit the tool did not write" in refused.value.message
        assert "Description=SGLang, written by hand" in refused.value.message
        assert rig.root(f"systemctl is-active {service}.service").strip() == "active"  # untouched
        planned = rig.deploy("glm5-hand2", dry_run=True, force=True)
        assert any(f"a copy of the replaced unit is kept at /opt/sglang-deploy/{service}/replaced/" in line
                   for line in planned.plan.dry_run_lines())
        assert rig.deploy("glm5-hand2", force=True).action == "deployed"
        kept = rig.root(f"cat /opt/sglang-deploy/{service}/replaced/{service}.service.*")
        assert kept == unit
        assert rig.root(f"readlink /etc/systemd/system/{service}.service").strip() == \
            f"/opt/sglang-deploy/{service}/current/sglang.service"


def test_adopt_a_hand_written_unit_keeps_it_running_as_release_0(rig: Rig) -> None:
    service = "sglhand3"
    unit = (f"[Unit]\nDescription=SGLang, written by hand\n[Service]\nUser=root\nWorkingDirectory=/root\n"
            f"Environment=HF_TOKEN={HAND_SECRET} NCCL_P2P_LEVEL=5 PATH=/opt/ml-env/bin:/usr/local/bin:/usr/bin:/bin\n"
            f"ExecStart=/opt/ml-env/bin/python -m sglang.launch_server {' '.join(HAND_ARGS)}\n")
    store = f"/opt/sglang-deploy/{service}"
    with rig.hand_written_unit(service, unit):
        pid = rig.main_pid(service)
        with rig.connect() as (target, remote):
            adopted = adopt(target, service, remote, "hand3", from_unit=True)
        assert adopted.release_id == "0" and HAND_SECRET not in adopted.profile_text
        # nothing restarted: the same process serves, now from release 0, which is the hand-written unit itself
        assert rig.main_pid(service) == pid
        assert rig.root(f"cat {store}/current/sglang.service") == unit
        assert rig.root(f"cat {store}/replaced/{service}.service.*") == unit
        assert rig.root(f"readlink /etc/systemd/system/{service}.service").strip() == f"{store}/current/sglang.service"
        (rig.project.profiles_dir / "hand3.yaml").write_text(adopted.profile_text)
        deploy_the_adopted_profile_then_roll_back_to_0(rig, "hand3", service)
        assert rig.root(f"cat /etc/systemd/system/{service}.service") == unit
