"""invoke deploy / rollback end to end on the sandbox VM: real SSH, systemd, journald; simulated GPUs and model."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import FAULT_OF_CRASHY, GUEST_FAULT, REFERENCE, Rig
from helpers.waits import STATE_WAIT_S

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.releases import list_releases
from deploy_lib.commands.status import read_status
from deploy_lib.deploy.project import load_for_host
from deploy_lib.errors import (
    ConfigError,
    ConnectFailed,
    DriftDetected,
    LockHeld,
    PreflightError,
    ReadinessFailed,
    RollbackFailed,
)
from deploy_lib.health import ProbeTarget
from deploy_lib.host.readiness import health_request
from deploy_lib.host_scripts.probe import answer_status
from deploy_lib.remote import FabricRemote, OutputLine, Step
from deploy_lib.store import StoreLayout, this_process_owner

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def test_deploy_the_reference_profile_then_redeploy_is_a_no_op(rig: Rig) -> None:
    rig.fault(None)
    outcome = rig.deploy("glm5-nvfp4")
    assert outcome.action in ("deployed", "unchanged")
    assert rig.current() == outcome.release_id and rig.unit_state() == "active"
    unit, launcher = rig.root("systemctl cat sglang.service"), rig.root(f"cat {rig.store}/current/launch")
    assert f"ExecStart={rig.store}/current/launch" in unit
    assert "--dsa-decode-backend trtllm" in launcher and "--tp-size 8" in launcher
    env_file = shlex.quote(f"/opt/sglang-deploy/sglang/releases/{outcome.release_id}/sglang.env")
    mode = rig.root(f"stat -c %a {env_file}").strip()
    assert mode == "600"
    history_before = len(rig.history())
    again = rig.deploy("glm5-nvfp4")
    assert again.action == "unchanged" and len(rig.history()) == history_before


def test_a_no_op_asks_the_health_endpoint_through_the_connection_or_on_a_host_that_refuses_forwarding(
        rig: Rig, healthy: str) -> None:
    """The live probe's health request goes through the SSH connection (OpenSSH's sshd forwards by default); with
    `AllowTcpForwarding no` the probe runs on the host. Inputs tried: forwarding allowed, then refused: a no-op stays
    one, and a server stopped by hand is restarted."""
    request = health_request(ProbeTarget(unit=None, port=8000, health_path="/ready"))
    since = int(time.time())
    with rig.connect() as (_, remote):
        assert answer_status(remote.forward("127.0.0.1", 8000, request, 5).answer)[0] == 200
    assert rig.deploy(REFERENCE).action == "unchanged"
    # each connection ended as sshd expects: a reset one ends it without its normal exit (failed before: the client
    # closed while sshd's close of the forwarded channel was on its way)
    assert "Connection reset" not in rig.root(f"journalctl -q -u ssh.service --since @{since} || true")
    dropin = "/etc/ssh/sshd_config.d/50-no-forwarding.conf"
    # restart, not reload: reload returns once SIGHUP is sent, and sshd re-executes with its port closed for a moment
    # (the next connection was refused 2 times in 20); Type=notify makes restart wait until sshd listens again, and
    # KillMode=process keeps this command's own session
    rig.root(f"echo 'AllowTcpForwarding no' > {dropin} && systemctl restart ssh")
    try:
        with rig.connect() as (_, remote):
            assert not remote.forward("127.0.0.1", 8000, request, 5).sent, "the sshd refuses forwarding"
        assert rig.deploy(REFERENCE).action == "unchanged" and rig.current() == healthy
        rig.root(f"systemctl stop {rig.service}.service")
        outcome = rig.deploy(REFERENCE)
        assert outcome.action == "deployed" and outcome.release_id == healthy and rig.unit_state() == "active"
    finally:
        rig.root(f"rm -f {dropin} && systemctl restart ssh")


def test_a_changed_profile_deploys_a_new_release_and_keeps_the_old(rig: Rig, healthy: str) -> None:
    outcome = rig.deploy("glm5-omp4")
    assert outcome.action == "deployed" and outcome.previous_id == healthy
    assert [str(c) for c in outcome.plan.changes] == ["~ env OMP_NUM_THREADS: 8 -> 4"]
    assert {healthy, outcome.release_id} <= rig.release_dirs()
    env = rig.root("cat /proc/$(systemctl show -p MainPID --value sglang.service)/environ | tr '\\0' '\\n'")
    assert "OMP_NUM_THREADS=4" in env.splitlines()


def test_fusion_on_unpatched_sm120_fails_and_rolls_back(rig: Rig, healthy: str) -> None:
    with pytest.raises(ReadinessFailed) as caught:
        rig.deploy("glm5-nvfp4-fusion")
    message = str(caught.value)
    assert "requires SM90 or SM10X NVIDIA GPUs [fusion_gate]" in message  # the upstream cause, not the profile's name
    assert f"release {healthy} is serving" in message
    assert rig.current() == healthy and rig.unit_state() == "active"
    events = [(h["event"], h["outcome"]) for h in rig.history()[-2:]]
    assert events == [("deploy", "failed"), ("rollback", "healthy")]


def test_crash_while_loading_is_seen_at_once_and_rolled_back(rig: Rig, healthy: str) -> None:
    rig.fault("oom")
    try:
        with pytest.raises(ReadinessFailed, match="out of memory") as caught:
            rig.deploy("glm5-faulty")
    finally:
        rig.fault(None)
    assert caught.value.hint and "mem-fraction-static" in caught.value.hint
    assert rig.current() == healthy


def test_hang_while_loading_hits_the_deadline_and_rolls_back(rig: Rig, healthy: str) -> None:
    rig.fault("hang-loading")
    try:
        with pytest.raises(ReadinessFailed, match="not ready after"):
            rig.deploy("glm5-short")
    finally:
        rig.fault(None)
    assert rig.current() == healthy


def test_health_200_while_generation_hangs_is_not_ready(rig: Rig, healthy: str) -> None:
    rig.fault("generation-hang")
    try:
        with pytest.raises(ReadinessFailed):
            rig.deploy("glm5-short")
    finally:
        rig.fault(None)
    assert rig.current() == healthy


def test_unknown_flag_is_refused_at_preflight_and_nothing_changes(rig: Rig, healthy: str) -> None:
    """Input tried: extra_args ['--no-such-flag'] against the SGLang installed in the guest."""
    before = (rig.release_dirs(), len(rig.history()), rig.current())
    with pytest.raises(PreflightError, match="--no-such-flag"):
        rig.deploy("glm5-unknown-flag")
    assert (rig.release_dirs(), len(rig.history()), rig.current()) == before


def test_a_second_deploy_while_the_lock_is_held_is_refused(rig: Rig, healthy: str) -> None:
    layout = StoreLayout("sglang")
    from datetime import UTC, datetime
    owner = this_process_owner("someone-else", datetime.now(UTC))
    rig.write(str(layout.lock_owner), owner.to_json().decode())  # its directory is the lock
    try:
        with pytest.raises(LockHeld, match="held by"):
            rig.deploy("glm5-omp4")
    finally:
        rig.root(f"rm -rf {shlex.quote(str(layout.lock))}")
    assert rig.current() == healthy


def steps_sent(rig: Rig, command: Callable[[Any, FabricRemote], engine.Outcome], profile: str | None = None
               ) -> tuple[engine.Outcome, list[str]]:
    """What `command(target, remote)` returned, and the names of the steps it ran on the guest."""
    ran: list[str] = []
    _, target = rig.target(profile)
    with FabricRemote(target.ssh, on_result=lambda result: ran.append(result.step.name)) as remote:
        return command(target, remote), ran


def running(rig: Rig) -> tuple[list[str], list[str], str]:
    """The server's argv and environment as the kernel shows them, and systemd's NeedDaemonReload."""
    pid = rig.main_pid()
    argv = rig.root(f"cat /proc/{pid}/cmdline").split("\0")[:-1]
    environ = rig.root(f"cat /proc/{pid}/environ").split("\0")[:-1]
    return argv, environ, rig.root("systemctl show -p NeedDaemonReload --value sglang.service").strip()


def test_a_switch_between_releases_of_the_same_unit_settings_sends_no_daemon_reload(rig: Rig, healthy: str) -> None:
    """Real systemd: A (the reference) serving; deploy B (other flags and environment, same unit settings): no
    daemon-reload is sent, B's argv and environment run, NeedDaemonReload stays no; the rollback to A and a restart
    the same; C (another service.stop_timeout_s, a unit-level setting) reloads, and so does the rollback from it."""
    outcome, ran = steps_sent(rig, lambda target, remote: engine.deploy(
        rig.target("glm5-nometrics-omp4")[0], target, remote, RecordingProgress(), engine.Options()))
    assert outcome.action == "deployed" and outcome.previous_id == healthy
    assert "systemd: restart" in ran and "systemd: daemon-reload" not in ran
    argv, environ, need_reload = running(rig)
    assert "--enable-metrics" not in argv and "OMP_NUM_THREADS=4" in environ and need_reload == "no"
    inodes = {rig.root(f"stat -c %i {rig.store}/releases/{release}/sglang.service").strip()
              for release in (healthy, outcome.release_id)}
    assert len(inodes) == 1, "B's unit file is A's, hard-linked"

    back, ran = steps_sent(rig, lambda target, remote: engine.rollback(target, "sglang", remote, RecordingProgress(),
                                                                         healthy, {}))
    assert back.release_id == healthy and "systemd: daemon-reload" not in ran
    argv, environ, need_reload = running(rig)
    assert "--enable-metrics" in argv and "OMP_NUM_THREADS=8" in environ and need_reload == "no"
    restarted, ran = steps_sent(rig, lambda target, remote: engine.start(target, "sglang", remote,
                                                                         RecordingProgress(), {}, restart=True))
    assert restarted.action == "restarted" and "systemd: daemon-reload" not in ran and rig.unit_state() == "active"

    slower, ran = steps_sent(rig, lambda target, remote: engine.deploy(
        rig.target("glm5-slow-stop")[0], target, remote, RecordingProgress(), engine.Options()))
    assert slower.action == "deployed" and ran.index("systemd: daemon-reload") < ran.index("systemd: restart")
    assert rig.root("systemctl show -p TimeoutStopUSec --value sglang.service").strip() == "1min 17s"
    assert running(rig)[2] == "no"
    _, ran = steps_sent(rig, lambda target, remote: engine.rollback(target, "sglang", remote, RecordingProgress(),
                                                                      healthy, {}))
    assert "systemd: daemon-reload" in ran and rig.current() == healthy and running(rig)[2] == "no"


def test_a_unit_file_edited_by_hand_is_drift_until_forced(rig: Rig, healthy: str) -> None:
    unit = shlex.quote(f"/opt/sglang-deploy/sglang/releases/{healthy}/sglang.service")
    rig.root(f"sed -i 's/LimitNOFILE=65536/LimitNOFILE=1024/' {unit}")
    with pytest.raises(DriftDetected, match="edited on the host"):
        rig.deploy("glm5-omp4")
    outcome = rig.deploy("glm5-nvfp4", force=True)
    assert outcome.action == "deployed" and outcome.release_id == healthy
    assert "LimitNOFILE=65536" in rig.root("systemctl cat sglang.service")


def test_rollback_by_hand_returns_to_the_previous_healthy_release(rig: Rig, healthy: str) -> None:
    newer = rig.deploy("glm5-omp4").release_id
    outcome = rig.rollback()
    assert outcome.release_id == healthy and outcome.previous_id == newer
    assert rig.current() == healthy and rig.unit_state() == "active"
    assert (rig.history()[-1]["event"], rig.history()[-1]["outcome"]) == ("rollback", "healthy")


def test_rollback_to_an_unknown_release_is_refused(rig: Rig, healthy: str) -> None:
    with pytest.raises(ConfigError, match="not on the host"):
        rig.rollback("000000000000")


def test_rollback_target_broken_too_stops_the_unit(rig: Rig, healthy: str) -> None:
    rig.fault("oom")  # the new release
    rig.fault("oom", GUEST_FAULT)  # every other release, the rollback target among them
    try:
        with pytest.raises(RollbackFailed, match=r"rollback to .* failed too"):
            rig.deploy("glm5-faulty")
        assert rig.unit_state() in ("inactive", "failed")
        assert [(h["event"], h["outcome"]) for h in rig.history()[-2:]] == [("deploy", "failed"),
                                                                              ("rollback", "failed")]
    finally:
        rig.fault(None)
        rig.fault(None, GUEST_FAULT)


def test_status_and_releases_describe_the_host(rig: Rig, healthy: str) -> None:
    with rig.connect() as (target, remote):
        report = read_status(target, "sglang", remote)
        rows = list_releases(target, "sglang", remote)
    assert report.current == healthy and report.unit_state == "active/running"
    assert report.readiness.startswith("ready") and report.gpus and len(report.gpus) == 8
    assert report.gpus[0].arch == "sm120"
    assert any(row.is_current and row.outcome == "healthy" for row in rows)


def test_a_changed_host_key_is_refused(rig: Rig, tmp_path: Path) -> None:
    _, target = rig.target()
    forged = tmp_path / "known_hosts"
    line = target.ssh.known_hosts_path.read_text().splitlines()[0].split()
    other_key = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    forged.write_text(f"{line[0]} ssh-ed25519 {other_key}\n")
    from dataclasses import replace
    with FabricRemote(replace(target.ssh, known_hosts_file=forged, accept_new_host_key=True)) as remote:
        with pytest.raises(ConnectFailed):
            remote.run([Step("probe", ("true",))])


class DropDuring:
    """A Remote whose connection drops once, at the first batch holding a step named `when` (then it works)."""

    def __init__(self, inner: FabricRemote, when: str) -> None:
        self.inner, self.when, self.dropped = inner, when, False

    def run(self, batch: list, on_output: OutputLine | None = None) -> list:
        if not self.dropped and any(getattr(step, "name", "").startswith(self.when) for step in batch):
            self.dropped = True
            self.inner.run(batch[:1])  # part of the batch reached the host, as with a real drop
            self.inner.close()
            raise ConnectFailed("connection to the host lost (test)")
        return self.inner.run(batch, on_output)

    def close(self) -> None:
        self.inner.close()


def test_ssh_dropped_during_staging_leaves_current_untouched_and_a_rerun_completes(rig: Rig, healthy: str) -> None:
    # a release no earlier test of the module staged: its deploy has a stage batch to drop the connection in
    (rig.project.profiles_dir / "glm5-omp3.yaml").write_text("extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '3'\n")
    loaded, target = rig.target("glm5-omp3")
    with FabricRemote(target.ssh) as inner:
        with pytest.raises(ConnectFailed):
            engine.deploy(loaded, target, DropDuring(inner, "stage:"), RecordingProgress(), engine.Options())
    assert rig.current() == healthy and rig.unit_state() == "active"
    outcome = rig.deploy("glm5-omp3")
    assert outcome.action == "deployed" and rig.current() == outcome.release_id
    assert not any(name.endswith(".tmp") for name in rig.release_dirs()), "the rerun cleared the leftover"


def test_healthy_then_dead_within_the_grace_window_is_rolled_back(rig: Rig, healthy: str) -> None:
    rig.fault("die-after 1")  # the ladder's one generation, then the server exits
    try:
        with pytest.raises(ReadinessFailed, match=r"grace|exited|failed") as caught:
            rig.deploy("glm5-faulty")
    finally:
        rig.fault(None)
    assert f"release {healthy} is serving" in str(caught.value)
    assert rig.current() == healthy and rig.unit_state() == "active"


def test_a_lock_whose_owner_process_is_gone_is_taken_over_with_a_line_and_a_history_record(rig: Rig,
                                                                                          healthy: str) -> None:
    """Input tried: a lock whose owner is a process of this machine that no longer runs (issue 31 point 4: before,
    the deploy refused with "looks stale" and the user had to run unlock)."""
    import socket
    from datetime import UTC, datetime

    from deploy_lib.store import LockOwner

    layout = StoreLayout("sglang")
    dead = LockOwner(user="someone", host=socket.gethostname(), pid=2**22 + 17, time=datetime.now(UTC).isoformat(),
                     purpose="x", token="t")
    rig.write(str(layout.lock_owner), dead.to_json().decode())  # its directory is the lock
    progress = RecordingProgress()
    assert rig.deploy("glm5-omp4", progress).action == "deployed"
    [line] = [str(note) for note in progress.of_kind("note") if "took over the deploy lock" in str(note)]
    assert f"pid {dead.pid} on this machine" in line and "is no longer running" in line
    [record] = [h for h in rig.history() if h["event"] == "lock"]
    assert (record["outcome"], record["cause"]) == ("taken-over", line)


def test_a_store_on_a_full_filesystem_is_refused_before_anything_changes(rig: Rig, healthy: str,
                                                                         tmp_path: Path) -> None:
    """Input tried: deploy_root on a 1 MiB filesystem mounted in the guest."""
    rig.root("mkdir -p /srv/small && mount -t tmpfs -o size=1m tmpfs /srv/small")
    try:
        inventory = tmp_path / "small.yaml"
        inventory.write_text(Path(rig.inventory).read_text().replace("  vars:\n", "  vars:\n    deploy_root: "
                                                                     "/srv/small/store\n", 1))
        # a service of its own: the guest's sglang.service belongs to the other store (deploying over it is exit 9)
        (rig.project.profiles_dir / "glm5-small.yaml").write_text(
            "extends: glm5-omp4\nservice: {name: sglsmall}\nserver: {port: 8010}\n")
        loaded, target = load_for_host(rig.project, "glm5-small", str(inventory), None)
        with FabricRemote(target.ssh) as remote, pytest.raises(PreflightError, match="MiB free"):
            engine.deploy(loaded, target, remote, RecordingProgress(), engine.Options())
        # a refusal before the first change takes no lock and writes nothing, the facts' cache included
        assert rig.root("find /srv/small -not -type d").strip() == "", "no file: no release, lock or history"
        assert rig.current() == healthy
    finally:
        rig.root("umount /srv/small")


def test_a_crash_loop_stops_at_the_start_limit_and_rollback_returns_to_the_healthy_release(rig: Rig,
                                                                                           healthy: str) -> None:
    crashy = rig.crashy_release()
    try:
        for _ in range(4):  # the 4th crash within 15 minutes is one too many: 3 restarts, then systemd gives up
            rig.serve_until_crash()
        rig.root(f"timeout {STATE_WAIT_S} bash -c 'until systemctl is-failed -q sglang.service; do sleep 0.2; done'")
        report = rig.status()
        assert report.current == crashy and report.unit_state == "failed/failed"
        assert report.crashes is not None and report.crashes.gave_up
        assert report.crashes.verdict == ("gave up after 3 restarts: exit status 1: a CUDA kernel failed while "
                                            "running: an illegal memory access was encountered [cuda_runtime_error]")
        assert report.advice is not None and "`invoke rollback`" in report.advice and healthy in report.advice
        with rig.connect() as (target, remote):
            assert {row.id: row.outcome for row in list_releases(target, "sglang", remote)}[crashy] == "crashed"
        outcome = rig.rollback()
        assert outcome.release_id == healthy and outcome.previous_id == crashy
        assert rig.current() == healthy and rig.unit_state() == "active"
        events = [(h["event"], h["outcome"]) for h in rig.history() if h["release"] in (crashy, healthy)][-5:]
        assert events == [("crash", "restarted")] * 3 + [("crash", "failed"), ("rollback", "healthy")]
        assert rig.status().crashes is None
    finally:
        rig.fault(None, FAULT_OF_CRASHY)
