"""gpu-check's peer-to-peer steps through the fake-remote route, on the recorded VM."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from deploy_lib.commands.gpu_check import parse_sizes
from deploy_lib.errors import ConnectFailed
from deploy_lib.facts import host as host_facts
from deploy_lib.gpu_check import GpuCheckReport
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops import dispatch
from deploy_lib.ops.scope import Reach, Scope, select
from deploy_lib.remote import Step
from helpers.fake_remote import FakeRemote
from helpers.gpu_check_p2p_reading import COMPOSED, DATA, composed_node, h200_vm
from helpers.ops import installed
from helpers.recording_progress import RecordingProgress

H200X2 = DATA / "gpu_check/h200x2-2026-11-30"


INVENTORY = """all:
  hosts:
    vm105: {ansible_host: 192.0.2.10, proxmox_node: pve1, proxmox_vmid: 105}
    pve1: {ansible_host: 192.0.2.2}
"""


TOPO_DUMP = "/opt/sglang-deploy/sglang/gpu-check-nccl-topo.xml"


def vm105() -> FakeRemote:
    """Release r1 (TP 2, NCCL_P2P_DISABLE=1) installed and stopped; two GPUs whose driver says CNS; the all-reduce
    answers with the 2 x H200 run under NCCL_P2P_DISABLE=1 (shared memory)."""
    release = {"id": "r1", "tags": {}, "venv": "/opt/ml-env", "environment": {"NCCL_P2P_DISABLE": "1"},
               "profile": {"server": {"port": 8000}, "parallel": {"tp": 2}}}
    cns = (COMPOSED / "vm-topo-p2p-r.txt").read_text()
    remote = (installed(release)
              .reply(host_facts.FACT_UNIT, stdout="ActiveState=inactive\nSubState=dead\nLoadState=loaded\n")
              .reply("topology", stdout=(H200X2 / "topo-m.txt").read_text())
              .reply("p2p read", stdout=cns).reply("p2p write", stdout=cns)
              .reply("readiness probe (health)", stdout='{"port_open": false}\n')
              .reply("all-reduce check", stdout=json.dumps(json.loads((H200X2 / "p2p-disable.json").read_text()))))
    return h200_vm(remote)


class Reached:
    """vm105 and pve1 as ops.scope.Reach reaches them; a node in `refused` cannot be connected to."""

    def __init__(self, refused: bool = False) -> None:
        self.remotes = {"vm105": vm105(), "pve1": composed_node()}
        self.refused = refused
        self.connected: list[str] = []

    def reach(self) -> Reach:
        def connect(target: Any, prefixed: bool) -> Any:
            self.connected.append(target.host.name)
            if self.refused and target.host.name == "pve1":
                raise ConnectFailed("pve1 (192.0.2.2:22): connection refused")
            return nullcontext(self.remotes[target.host.name])
        return Reach(connect, lambda host: RecordingProgress(), lambda question: None, {})


def vm_scope(tmp_path: Path, text: str = INVENTORY) -> Scope:
    (path := tmp_path / "hosts.yaml").write_text(text)
    return select(load_inventory(path), "vm105", None)


def one_gpu_gpu_check(tmp_path: Path, results: list[dict[str, Any]]) -> tuple[FakeRemote, GpuCheckReport]:
    """gpu-check with the CLI's default sizes on a one-GPU host (release venv /opt/torch/.venv, no Proxmox node),
    each step answered by argv from `results` (a recording's); the host and the report."""
    release = {"id": "r1", "tags": {}, "venv": "/opt/torch/.venv",
               "profile": {"server": {"port": 8000}, "parallel": {"tp": 1}}}
    host = (installed(release)
            .reply(host_facts.FACT_UNIT, stdout="ActiveState=inactive\nSubState=dead\nLoadState=loaded\n"))
    for result in results:
        host.reply(tuple(result["argv"]), exit_code=result["exit_code"], stdout=result["stdout"],
                   stderr=result["stderr"])
    hosts = Reached()
    hosts.remotes["vm105"] = host
    text = INVENTORY.replace(", proxmox_node: pve1, proxmox_vmid: 105", "")
    sizes = list(parse_sizes([]))  # the CLI's default sizes, as the recording ran them
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path, text), "sglang", None, False, sizes, hosts.reach()))
    return host, report


def sent_steps(host: FakeRemote) -> list[Step]:
    """The steps of gpu-check's check and peer-to-peer section, in order: not the store/lock/facts reads around it
    (those need the deploy store, which a lent machine has not)."""
    return [step for step in host.ran if isinstance(step, Step) and not step.name.startswith(
        ("store facts", "host facts", "lock", "readiness probe")) and step.name != host_facts.FACT_UNIT
        and not step.name.endswith("/lock/owner.json")]
