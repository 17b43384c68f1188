"""The sandbox VM over real SSH: the simulated server under the guest's systemd, its journal, its HTTP
surface from this host, nvidia-smi, the fusion gate, every fault mode, and a clean `down`."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.guest_shell import GuestShell
from helpers.http_client import http
from helpers.waits import wait_for

from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]

UNIT = "sglang-sim-test.service"
PORT = 30000
FAULT_FILE = "/etc/sglang-sim/fault"


def unit_text(extra_args: str, environment: str) -> str:
    return f"""[Unit]
Description=simulated SGLang server (sandbox test)

[Service]
Environment={environment}
ExecStart={manage.GUEST_VENV}/bin/python -m sglang.launch_server --model-path zai-org/GLM-5-NVFP4 \\
    --served-model-name glm-5 --tp-size 8 --host 0.0.0.0 --port {PORT} --enable-metrics {extra_args}
Restart=no
"""



class SimUnit:
    def __init__(self, shell: GuestShell) -> None:
        self.shell = shell
        self.base = f"http://{shell.guest.guest_ip}:{PORT}"
        self.cursor = ""

    def start(self, extra_args: str = "", fault: str = "", environment: str = "") -> None:
        self.shell.write(FAULT_FILE, fault + "\n" if fault else None)
        self.shell.write(f"/etc/systemd/system/{UNIT}", unit_text(extra_args, environment))
        self.cursor = self.shell.sudo("journalctl -n 0 --show-cursor | sed -n 's/^-- cursor: //p'").strip()
        self.shell.sudo(f"systemctl daemon-reload && systemctl reset-failed {UNIT} 2>/dev/null; "
                        f"systemctl restart {UNIT}")

    def show(self, prop: str) -> str:
        return self.shell.sudo(f"systemctl show -p {prop} --value {UNIT}").strip()

    def journal(self) -> str:
        """This start's lines of `journalctl -u`."""
        return self.shell.sudo(f"journalctl -u {UNIT} --no-pager -o cat --after-cursor={shlex.quote(self.cursor)}")

    def wait_failed(self) -> None:
        wait_for(lambda: self.show("ActiveState") == "failed", f"{UNIT} to fail")

    def wait_ready(self) -> None:
        wait_for(lambda: http(self.base + "/health")[0] == 200, "/health 200")


@pytest.fixture
def sim(sandbox_venv: manage.Guest, guest_shell: GuestShell) -> Iterator[SimUnit]:
    unit = SimUnit(guest_shell)
    yield unit
    guest_shell.sudo(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT} 2>/dev/null; rm -f {FAULT_FILE}; true")


def test_systemd_unit_runs_the_sim_health_goes_refused_503_200_and_journal_has_its_lines(sim: SimUnit) -> None:
    sim.start()
    states: list[int | str] = []

    def ready() -> bool:
        status = http(sim.base + "/health")[0]
        if not states or states[-1] != status:
            states.append(status)
        return status == 200

    wait_for(ready, "/health 200")
    assert states == ["refused", 503, 200]
    assert sim.show("ActiveState") == "active"
    journal = sim.journal()
    for line in ("Load weight begin", "KV Cache is allocated", "Capture target decode CUDA graph begin",
                 "The server is fired up and ready to roll!"):
        assert line in journal


def test_streamed_completion_and_nvidia_smi_under_load(sim: SimUnit, guest_shell: GuestShell) -> None:
    sim.start()
    sim.wait_ready()
    status, body = http(sim.base + "/v1/completions", {
        "model": "glm-5", "prompt": "Say something", "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).split().__len__() == 8
    assert chunks[-1]["usage"]["completion_tokens"] == 8

    _, out, _ = guest_shell.run("nvidia-smi --query-gpu=index,name,compute_cap,memory.total,memory.used,"
                                "power.draw,power.limit --format=csv,nounits")
    rows = list(csv.DictReader(io.StringIO(out), skipinitialspace=True))
    assert len(rows) == 8
    assert rows[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition" and rows[0]["compute_cap"] == "12.0"
    assert rows[0]["memory.total [MiB]"] == "97887" and rows[0]["power.limit [W]"] == "600.00"
    assert int(rows[0]["memory.used [MiB]"]) > 80000  # weights + KV pool of the running sim


def test_fusion_flag_on_unpatched_sm120_fails_at_startup_with_the_upstream_error(sim: SimUnit) -> None:
    sim.start("--enable-flashinfer-allreduce-fusion")
    sim.wait_failed()
    assert "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in sim.journal()


def test_unknown_flag_fails_with_exit_2_and_argparse_message(sim: SimUnit) -> None:
    sim.start("--nsa-decode-backend trtllm")
    sim.wait_failed()
    assert sim.show("ExecMainStatus") == "2"
    assert "unrecognized arguments: --nsa-decode-backend trtllm" in sim.journal()


@pytest.mark.parametrize(("fault", "evidence"), [
    ("oom", "torch.OutOfMemoryError: CUDA out of memory."),
    ("nccl-timeout", "Watchdog caught collective operation timeout"),
    ("port-in-use", "address already in use"),
])
def test_fault_that_kills_the_server_at_startup(sim: SimUnit, fault: str, evidence: str) -> None:
    sim.start(fault=fault)
    sim.wait_failed()
    assert evidence in sim.journal()
    assert http(sim.base + "/health")[0] == "refused"


def test_fault_hang_while_loading_keeps_the_port_closed(sim: SimUnit) -> None:
    sim.start(fault="hang-loading")
    wait_for(lambda: "Load weight begin" in sim.journal(), "weight loading to begin")
    time.sleep(3)  # longer than the whole configured startup
    assert sim.show("ActiveState") == "active"
    assert http(sim.base + "/health")[0] == "refused"
    assert "Load weight end" not in sim.journal()


def test_fault_die_after_n_requests(sim: SimUnit) -> None:
    sim.start(fault="die-after 2")
    sim.wait_ready()
    for _ in range(2):
        assert http(sim.base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    sim.wait_failed()
    assert "illegal memory access" in sim.journal()


def test_fault_generation_hang_fails_health_after_its_timeout_and_ready_stays_200(sim: SimUnit) -> None:
    """SGLang's /health runs a one-token generation by default: a hung scheduler answers 503 after
    SGLANG_HEALTH_CHECK_TIMEOUT (2 s here); /ready does not generate."""
    sim.start(fault="generation-hang", environment="SGLANG_HEALTH_CHECK_TIMEOUT=2")
    wait_for(lambda: http(sim.base + "/ready")[0] == 200, "/ready 200")
    with pytest.raises(TimeoutError):
        http(sim.base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout_s=2)
    assert http(sim.base + "/health")[0] == 503


def test_systemctl_stop_drains_and_exits_0(sim: SimUnit, guest_shell: GuestShell) -> None:
    sim.start()
    sim.wait_ready()
    guest_shell.sudo(f"systemctl stop {UNIT}")
    assert sim.show("ActiveState") == "inactive"
    assert sim.show("ExecMainStatus") == "0"
    assert "Finished server process" in sim.journal()


def test_down_leaves_no_process_mount_netns_veth_or_cgroup() -> None:
    name = "sbxdown"
    guest = manage.up(name, record=False)
    overlay = Path(guest.key).parent.parent / "run" / name / "root"
    manage.down(name, record=False)
    assert guest.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", guest.veth], capture_output=True).returncode != 0
    assert str(overlay) not in Path("/proc/mounts").read_text()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/testhost.{name}")) + list(
        Path("/sys/fs/cgroup").glob(f"testhost.{name}"))
    processes = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    assert not [line for line in processes.splitlines() if f"-M {name} " in line and not line.startswith("Z")]


def test_guest_gpus_are_configurable_per_guest(guest_shell: GuestShell) -> None:
    config = "/etc/sglang-sim/config.json"
    original = guest_shell.sudo(f"cat {config}")
    try:
        guest_shell.write(config, json.dumps({**json.loads(original), "gpus": {"model": "h100", "count": 4}}))
        _, out, _ = guest_shell.run("nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader")
        assert out.splitlines() == [f"{i}, 9.0" for i in range(4)]
    finally:
        guest_shell.write(config, original)


def test_put_text_writes_exactly_the_text_at_a_hostile_path_on_the_guest(sandbox_guest: manage.Guest) -> None:
    """Input tried: a path and a text holding quotes, command substitutions, a newline and non-ASCII (the same as
    tests/test_sandbox_manage.py's, there run by this machine's shells)."""
    from helpers.sandbox_manage import HOSTILE_DIR, HOSTILE_TEXT

    path = f"/root/put text/{HOSTILE_DIR}/-fault; x"
    manage.put_text(sandbox_guest, path, HOSTILE_TEXT)
    on_guest = manage.run_on(sandbox_guest, f"sha256sum < {shlex.quote(path)}").split()[0]
    assert on_guest == hashlib.sha256(HOSTILE_TEXT.encode()).hexdigest()
    manage.put_text(sandbox_guest, path, None)
    assert manage.run_on(sandbox_guest, f"test -e {shlex.quote(path)} || echo gone") == "gone\n"
    assert manage.run_on(sandbox_guest, "find / -xdev -name 'pwned*' 2>/dev/null | head -1; true") == ""
