"""The peer-to-peer verdict wired into the commands, as the CLI drives them (deploy_lib.ops.dispatch, no SSH): the
VM host answers as the lent H200 VM did (tests/data/p2p/h200-1gpu-2026-12-01) with the 2 x H200 topology and the
`CNS` P2P matrix of tests/data/p2p/composed-node, its node pve1 with the composed node's outputs (that folder's
README says where each comes from). gpu-check and status carry the verdict; a node that cannot be reached leaves the
VM side reported; a deploy's preflight.gpu_check reads none of it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from helpers.gpu_check_p2p_reading import DATA
from helpers.gpu_check_p2p_wiring import (
    INVENTORY,
    TOPO_DUMP,
    Reached,
    one_gpu_gpu_check,
    sent_steps,
    vm_scope,
)
from rich.console import Console

from deploy_cli import present, reports
from deploy_cli.present import jsonable
from deploy_lib.errors import ConfigError
from deploy_lib.gpu_check.p2p.verdict import Cause
from deploy_lib.ops import dispatch
from deploy_lib.remote import Step


def test_gpu_check_carries_the_verdict_with_the_nodes_causes_and_fixes(tmp_path: Path) -> None:
    hosts = Reached()
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path), "sglang", None, False, [1024], hosts.reach()))
    verdict = report.peer_to_peer
    assert verdict is not None and hosts.connected == ["vm105", "pve1"]
    (pair,) = verdict.pairs
    assert pair.gpus == (0, 1) and not pair.p2p
    assert [f.cause for f in pair.findings] == [Cause.DISABLED_BY_ENV, Cause.VM_NO_CLIQUE, Cause.ACS_REDIRECT,
                                                Cause.ROOT_COMPLEXES, Cause.IOMMU_TRANSLATED]
    acs = pair.findings[2]
    assert acs.fixes[0] == "on pve1, until reboot: setpci -s 0000:40:01.1 ECAP_ACS+6.w=0000" and acs.trade_off
    assert "NCCL chose: SHM/direct/direct (8 channel links)" in verdict.notes  # the check's own transports
    assert verdict.interim[0].startswith("NCCL: nccl.p2p_disable: true")
    # the node is only read: the node batch's argvs, nothing else
    assert [step.argv[0] for step in hosts.remotes["pve1"].ran] == ["cat", "find", "lspci", "lspci", "qm"]


def test_the_all_reduce_dumps_ncclss_topology_and_the_report_keeps_the_releases_environment(tmp_path: Path) -> None:
    hosts = Reached()
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path), "sglang", None, False, [1024], hosts.reach()))
    host = hosts.remotes["vm105"]
    names = host.ran_names()
    assert names.index("p2p: remove an older NCCL topology dump") + 1 == names.index("all-reduce check")
    check = next(step for step in host.ran if isinstance(step, Step) and step.name == "all-reduce check")
    assert f'"NCCL_TOPO_DUMP_FILE": "{TOPO_DUMP}"' in (check.stdin or b"").decode()
    assert ("cat", TOPO_DUMP) in host.ran_argvs()  # read back after the check, by the VM-side batch
    assert report.subject.environment == {"NCCL_P2P_DISABLE": "1"}
    assert report.peer_to_peer is not None
    assert "VM sign: NCCL topology reads 0000:00:06.0 at width 0" in report.peer_to_peer.notes


def test_an_unreachable_node_leaves_the_vm_side_in_gpu_checks_verdict(tmp_path: Path) -> None:
    hosts = Reached(refused=True)
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path), "sglang", None, False, [1024], hosts.reach()))
    verdict = report.peer_to_peer
    assert verdict is not None and report.check.verified
    assert "Proxmox node pve1, VM 105: not read (unreachable: pve1 (192.0.2.2:22): connection refused)" in \
        verdict.notes
    assert verdict.notes[0].startswith("a VM (firecracker)")
    (pair,) = verdict.pairs
    vm_cause = next(f for f in pair.findings if f.cause is Cause.VM_NO_CLIQUE)
    assert "node not read (unreachable: pve1" in vm_cause.detail and "qm set 105 --args" in vm_cause.fixes[0]
    assert Cause.ACS_REDIRECT not in [f.cause for f in pair.findings]


def test_a_node_that_is_no_inventory_host_is_refused_before_any_connection(tmp_path: Path) -> None:
    hosts = Reached()
    text = INVENTORY.replace("    pve1: {ansible_host: 192.0.2.2}\n", "")  # tried: proxmox_node pve1, no host pve1
    with pytest.raises(ConfigError, match="vm105's proxmox_node 'pve1' is not a host of the inventory"):
        dispatch.gpu_check(vm_scope(tmp_path, text), "sglang", None, False, [1024], hosts.reach())
    assert hosts.connected == []


def test_status_carries_the_verdict_in_one_line_and_as_json(tmp_path: Path) -> None:
    hosts = Reached()
    report = dispatch.one(dispatch.status(vm_scope(tmp_path), "sglang", hosts.reach()))
    verdict = report.peer_to_peer
    assert verdict is not None and hosts.connected == ["vm105", "pve1"]
    assert verdict.one_line() == ("peer-to-peer on 0 of 1 GPU pairs; causes: ACS redirect on, GPUs under different "
                                  "root complexes, IOMMU in translated mode, P2P disabled by the environment, VM "
                                  "without a GPUDirect clique")
    as_json = json.loads(json.dumps(jsonable(report)))
    assert [f["kind"] for f in as_json["peer_to_peer"]["pairs"][0]["findings"]] == [
        "disabled_by_env", "vm_no_clique", "acs_redirect", "root_complexes", "iommu_translated"]
    # no all-reduce in a status: NCCL's choice is not known there, and the server is left alone
    assert not any(note.startswith("NCCL chose") for note in verdict.notes)
    assert "all-reduce check" not in hosts.remotes["vm105"].ran_names()


def test_a_host_without_a_node_gets_the_vm_side_and_no_other_connection(tmp_path: Path) -> None:
    hosts = Reached()
    text = INVENTORY.replace(", proxmox_node: pve1, proxmox_vmid: 105", "")
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path, text), "sglang", None, False, [1024],
                                             hosts.reach()))
    assert hosts.connected == ["vm105"] and report.peer_to_peer is not None
    (pair,) = report.peer_to_peer.pairs
    vm_cause = next(f for f in pair.findings if f.cause is Cause.VM_NO_CLIQUE)
    assert "no proxmox_node / proxmox_vmid in the inventory" in vm_cause.detail
    assert vm_cause.fixes[0].startswith("on the Proxmox node: qm set VMID --args")


def test_the_report_prints_the_peer_to_peer_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path), "sglang", None, False, [1024], Reached().reach()))
    monkeypatch.setattr(present, "console", Console(record=True, width=10_000, highlight=False))
    reports.print_gpu_check(report)
    printed = present.console.export_text().splitlines()
    section = printed[printed.index("peer-to-peer:"):]
    assert "  GPU0-GPU1: no P2P (read CNS: chipset not supported, write CNS: chipset not supported)" in section
    assert "      fix: on pve1, until reboot: setpci -s 0000:40:01.1 ECAP_ACS+6.w=0000" in section
    assert any(line.startswith("      trade-off: ACS keeps devices isolated") for line in section)
    assert section[section.index("  until then:") + 2] == (
        "    SGLang: --disable-custom-all-reduce (its custom all-reduce needs peer access between the GPUs)")


def test_a_deploys_preflight_check_reads_no_peer_to_peer_and_dumps_no_topology() -> None:
    """preflight.gpu_check keeps its behaviour: the same all-reduce step, no NCCL topology dump, no VM or node read."""
    from helpers.gpu_check_deploy import CheckHost, checked, recorded_stdout
    from helpers.rollback import READY
    host = CheckHost(recorded_stdout("deploy-step-reference-env"), [READY])
    outcome = host.deploy(checked(p2p_disable=True))
    assert outcome.action == "deployed" and "gpu check" in outcome.timings
    assert not [name for name in host.ran_names() if name.startswith(("p2p:", "node:"))]
    check = next(step for step in host.ran if isinstance(step, Step) and step.name == "all-reduce check")
    assert b"NCCL_TOPO_DUMP_FILE" not in (check.stdin or b"")


def test_status_prints_the_verdicts_line_and_the_node_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    report = dispatch.one(dispatch.status(vm_scope(tmp_path), "sglang", Reached(refused=True).reach()))
    monkeypatch.setattr(present, "console", Console(record=True, width=10_000, highlight=False))
    reports.print_status(report)
    printed = present.console.export_text().splitlines()
    at = next(i for i, line in enumerate(printed) if line.startswith("peer-to-peer on 0 of 1 GPU pairs; causes: "))
    assert printed[at + 1:at + 3] == [
        "  Proxmox node pve1, VM 105: not read (unreachable: pve1 (192.0.2.2:22): connection refused)",
        "  each pair's cause and fix: `invoke gpu-check` (or `status --json`)"]


RECORDING = DATA / "p2p/h200-1gpu-2026-12-02-0743/gpu-check-run.json"  # re-record: tests/record_gpu_check.py


def test_the_steps_recorded_on_the_lent_h200_read_through_gpu_check(tmp_path: Path) -> None:
    """RECORDING: gpu-check's own steps run on a one-GPU H200 VM, the all-reduce writing NCCL's topology dump,
    answered here by argv; gpu-check sends exactly those steps."""
    recorded = json.loads(RECORDING.read_text())
    host, report = one_gpu_gpu_check(tmp_path, recorded["results"])
    sent = sent_steps(host)
    assert [list(step.argv) for step in sent] == [result["argv"] for result in recorded["results"]]
    check = next(step for step in sent if step.name == "all-reduce check")
    assert hashlib.sha256(check.stdin or b"").hexdigest() == recorded["check_stdin_sha256"], (
        f"the all-reduce program gpu-check ships (deploy_lib/host_scripts/gpu_check.py wrapped by check_step) is "
        f"not the one {RECORDING.parent.name} ran: re-record it on a one-GPU machine with tests/record_gpu_check.py "
        f"(its docstring says how) into a new dated folder and point RECORDING at it")
    assert report.check.verified and report.check.gpus == ("NVIDIA H200",)
    verdict = report.peer_to_peer
    assert verdict is not None and verdict.pairs == ()
    assert verdict.notes[0].startswith("a VM (firecracker): cpuinfo: hypervisor flag; kernel cmdline: "
                                       "--firecracker-init")
    assert "PCIe link: 00000000:00:06.0 gen 5 x16 (nvidia-smi)" in verdict.notes
    assert "VM sign: NCCL topology reads 0000:00:06.0 at width 0" in verdict.notes  # the dump this run wrote
    assert "fewer than two GPUs: no pair to judge" in verdict.notes
    assert verdict.measurement == "P2P measurement skipped: one GPU on the host, no pair to copy between"
    assert "p2p measure" not in host.ran_names()
