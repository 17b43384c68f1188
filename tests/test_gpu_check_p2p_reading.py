"""The read-only batches of the peer-to-peer section, answered by FakeRemote with real outputs: the lent H200 VM's
recordings (tests/data/p2p/h200-1gpu-2026-12-01), and a Proxmox node composed from documented formats
(tests/data/p2p/composed-node, its README says which), reached like any inventory host, or not reached at all."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.fake_remote import FakeRemote
from helpers.gpu_check_p2p_reading import COMPOSED, DATA, H200_VM, composed_node, h200_vm, read

from deploy_lib.deploy.project import resolve_target
from deploy_lib.errors import ConfigError, ConnectFailed
from deploy_lib.gpu_check.p2p.verdict import Cause
from deploy_lib.gpu_check.topology import parse_topology
from deploy_lib.host.p2p_reading import (
    check_peer_to_peer,
    node_reader,
    node_steps,
    proxmox_node,
    read_node,
    read_peer_to_peer,
    vm_steps,
)
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote import Step

INVENTORY = """all:
  hosts:
    vm105: {ansible_host: 192.0.2.10, proxmox_node: pve1, proxmox_vmid: 105}
    pve1: {ansible_host: 192.0.2.2}
"""


def test_the_h200_vm_batch_reports_the_vm_its_link_and_nccls_width_0():
    remote = h200_vm()
    topology = None  # one GPU: `topo -p2p r` has no pair, so gpu-check's topology parse found no matrix
    verdict, unread = read_peer_to_peer(remote, topology, ("NVIDIA H200",), {}, {}, None, "/tmp/nccl-topo.xml")
    assert all(isinstance(step, Step) for step in remote.ran)  # reads only: no Put
    assert remote.ran_argvs()[-1] == ("cat", "/tmp/nccl-topo.xml")
    assert verdict.notes[0].startswith("a VM (firecracker): cpuinfo: hypervisor flag; kernel cmdline: "
                                       "--firecracker-init; kernel log: Hypervisor detected: KVM")
    assert "PCIe link: 00000000:00:06.0 gen 5 x16 (nvidia-smi)" in verdict.notes
    assert "VM sign: NCCL topology reads 0000:00:06.0 at width 0" in verdict.notes
    assert verdict.pairs == () and unread == ("nvidia-smi topo -p2p not read: no pair judged",)


def test_the_node_batch_is_read_only_and_feeds_the_verdict(found):
    inventory_remote = h200_vm()
    node_remote = composed_node()
    cns = read(COMPOSED / "vm-topo-p2p-r.txt")
    topology = parse_topology(read(DATA / "gpu_check/h200x2-2026-11-30/topo-m.txt"), cns, cns)
    readings = read_node(found, _connect(node_remote))
    verdict, _ = read_peer_to_peer(inventory_remote, topology, ("NVIDIA RTX PRO 6000 Blackwell Server Edition",) * 2,
                                   {"SHM/direct/direct": 32}, {}, readings)
    assert [step.argv for step in node_remote.ran] == [step.argv for step in node_steps(105)]
    assert all(argv[0] in ("cat", "find", "lspci", "qm") for argv in node_remote.ran_argvs())
    assert ("qm", "config", "105") in node_remote.ran_argvs()
    causes = [finding.cause for finding in verdict.pairs[0].findings]
    assert causes == [Cause.VM_NO_CLIQUE, Cause.ACS_REDIRECT, Cause.ROOT_COMPLEXES, Cause.IOMMU_TRANSLATED]
    assert "NCCL chose: SHM/direct/direct (32 channel links)" in verdict.notes
    assert "peer-to-peer:" == verdict.lines()[0] and any(line.startswith("      fix: on pve1: qm set 105 --args")
                                                         for line in verdict.lines())


def test_an_unreachable_node_leaves_the_vm_side_reported(found):
    def refuse(target):
        raise ConnectFailed(f"{target.host.name} (192.0.2.2:22): connection refused")
    readings = read_node(found, refuse)
    assert readings.error == "unreachable: pve1 (192.0.2.2:22): connection refused"
    verdict, _ = read_peer_to_peer(h200_vm(), None, (), {}, {}, readings)
    assert "Proxmox node pve1, VM 105: not read (unreachable: pve1 (192.0.2.2:22): connection refused)" in \
        verdict.notes and verdict.notes[0].startswith("a VM (firecracker)")


def test_a_node_without_qm_is_named(found):
    remote = composed_node().reply("node: qm config", exit_code=127, stderr="sudo: qm: command not found")
    assert read_node(found, _connect(remote)).error == "qm not found on pve1 (is it a Proxmox VE node?)"
    remote = composed_node().reply("node: qm config", exit_code=2,
                                   stderr="Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist\n")
    assert read_node(found, _connect(remote)).error == \
        "`qm config 105` exited 2: Configuration file 'nodes/pve1/qemu-server/105.conf' does not exist"


def test_vm_batch_without_a_dump_path_reads_no_dump():
    assert [step.name for step in vm_steps()][-1] == "p2p: links"


def test_proxmox_vars_go_together_and_name_an_inventory_host(tmp_path: Path):
    path = tmp_path / "hosts.yaml"
    path.write_text("all:\n  hosts:\n    vm105: {proxmox_node: pve1}\n")  # tried: a node without the VM's id
    with pytest.raises(ConfigError, match="proxmox_node and proxmox_vmid go together"):
        load_inventory(path)
    path.write_text("all:\n  hosts:\n    vm105: {proxmox_node: pve9, proxmox_vmid: 105}\n")  # tried: unknown node
    inventory = load_inventory(path)
    with pytest.raises(ConfigError, match="vm105's proxmox_node 'pve9' is not a host of the inventory"):
        proxmox_node(inventory, resolve_target(inventory, "vm105"))
    path.write_text("all:\n  hosts:\n    vm105: {proxmox_node: pve1, proxmox_vmid: 7}\n")  # tried: vmid below 100
    with pytest.raises(ConfigError, match="proxmox_vmid"):
        load_inventory(path)


@pytest.fixture
def found(tmp_path: Path):
    """vm105's node as the inventory names it: pve1, VM 105."""
    (path := tmp_path / "hosts.yaml").write_text(INVENTORY)
    inventory = load_inventory(path)
    return proxmox_node(inventory, resolve_target(inventory, "vm105"))


def _connect(remote: FakeRemote):
    @contextmanager
    def connect(target):
        assert target.host.name == "pve1" and target.ssh.host == "192.0.2.2"
        yield remote
    return connect


def test_the_batch_as_run_on_the_lent_h200_vm():
    # vm-batch.json: vm_steps' argv run on the lent H200 machine, each result as it came back
    recorded = json.loads(read(H200_VM / "vm-batch.json"))["results"]
    assert [r["argv"] for r in recorded] == [list(step.argv) for step in vm_steps("/tmp/nccl-topo.xml")]
    remote = FakeRemote()
    for result in recorded:
        remote.reply(result["name"], exit_code=result["exit_code"], stdout=result["stdout"], stderr=result["stderr"])
    verdict, _ = read_peer_to_peer(remote, None, ("NVIDIA H200",), {}, {}, None, "/tmp/nccl-topo.xml")
    assert verdict.notes[:4] == (
        "a VM (firecracker): cpuinfo: hypervisor flag; kernel cmdline: --firecracker-init; "
        "kernel log: Hypervisor detected: KVM", "PCIe link: 00000000:00:06.0 gen 5 x16 (nvidia-smi)",
        "PCIe link: 0000:00:06.0 gen 5 x0 (NCCL topology)", "VM sign: NCCL topology reads 0000:00:06.0 at width 0")


def test_after_a_gpu_check_report_the_section_uses_its_topology_transports_and_environment(found, tmp_path):
    # the 2 x H200 run with NCCL_P2P_DISABLE=1 (tests/data/gpu_check/h200x2-2026-11-30/p2p-disable.json)
    from deploy_lib.gpu_check.allreduce import parse_check_output
    from deploy_lib.gpu_check.subject import CheckSubject, GpuCheckReport
    h200x2 = DATA / "gpu_check/h200x2-2026-11-30"
    topology = parse_topology(*(read(h200x2 / name) for name in ("topo-m.txt", "topo-p2p-r.txt", "topo-p2p-w.txt")))
    check = parse_check_output(json.loads(read(h200x2 / "p2p-disable.json")))
    report = GpuCheckReport(CheckSubject("release 1a2b3c4d5e6f", "/opt/ml-env", 2, {"NCCL_P2P_DISABLE": "1"}),
                            topology, None, None, check)
    (path := tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    vm: {ansible_host: 192.0.2.10}\n")
    inventory = load_inventory(path)
    opened = []
    target = resolve_target(inventory, "vm")
    verdict = check_peer_to_peer(report, h200_vm(), node_reader(inventory, [target], opened.append)(target))
    assert opened == []  # no proxmox_node: no connection to anything but the host
    (pair,) = verdict.pairs
    assert [f.cause for f in pair.findings] == [Cause.DISABLED_BY_ENV] and pair.p2p is False
    assert any(note.startswith("NCCL chose: SHM/direct/direct") for note in verdict.notes)
