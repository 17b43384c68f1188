"""The peer-to-peer verdict: one test per cause and its advice (the exact command or config line), on the
fixtures of tests/data/p2p (composed-node: a Proxmox node composed from documented formats, its README says which)
and the 2 x H200 recordings of tests/data/gpu_check/h200x2-2026-11-30."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from deploy_cli.present import jsonable
from deploy_lib.gpu_check.allreduce import parse_check_output
from deploy_lib.gpu_check.p2p import node, vm
from deploy_lib.gpu_check.p2p.verdict import Cause, NodeReadings, VmSide, clique_args, p2p_verdict
from deploy_lib.gpu_check.topology import parse_gpu_matrix

DATA = Path(__file__).resolve().parent / "data"
H200X2 = DATA / "gpu_check/h200x2-2026-11-30"
UPSTREAM = DATA / "p2p/upstream"
COMPOSED = DATA / "p2p/composed-node"
RTX_PRO = ("NVIDIA RTX PRO 6000 Blackwell Server Edition",) * 2
KVM_GUEST = vm.parse_vm(vm.parse_detect_virt("kvm\n", 0), ("QEMU", "Standard PC (Q35 + ICH9, 2009)"), True, "", "")
BARE = vm.parse_vm(vm.parse_detect_virt("none\n", 1), None, False, "", "")


def guest(names: tuple[str, ...] = RTX_PRO) -> VmSide:
    cns = parse_gpu_matrix((COMPOSED / "vm-topo-p2p-r.txt").read_text())
    return VmSide(KVM_GUEST, cns, cns, gpu_names=names)


def composed_node(qm_file: str = "qm-config-no-clique.conf", cmdline: str | None = None,
                  qm_text: str | None = None) -> NodeReadings:
    return NodeReadings(
        "pve1", 105, None, node.parse_cmdline(cmdline or (COMPOSED / "proc-cmdline.txt").read_text()),
        node.parse_iommu_groups((COMPOSED / "iommu-groups-find.txt").read_text()),
        node.parse_lspci_vvv((COMPOSED / "lspci-vvv.txt").read_text()),
        node.parse_lspci_tree((COMPOSED / "lspci-t.txt").read_text()),
        node.parse_qm_config(qm_text if qm_text is not None else (COMPOSED / qm_file).read_text()))


def findings(verdict, cause: Cause):
    return [f for pair in verdict.pairs for f in pair.findings if f.cause is cause]


def test_vm_without_clique_gives_the_qm_set_line_and_a_full_restart():
    (finding,) = findings(p2p_verdict(guest(), composed_node(), {}), Cause.VM_NO_CLIQUE)
    assert "no x-nv-gpudirect-clique on hostpci0, hostpci1" in finding.detail
    assert finding.fixes == ("on pve1: qm set 105 --args '-set device.hostpci0.x-nv-gpudirect-clique=0 "
                             "-set device.hostpci1.x-nv-gpudirect-clique=0', then `qm stop 105 && qm start 105` "
                             "(a reboot inside the guest keeps the old QEMU process)",)


def test_clique_line_keeps_the_vms_other_args_and_quotes_them():
    # an existing args line with a hostile quote and an old clique id of 3 on hostpci0 (tried input)
    config = ("args: -set device.hostpci0.x-nv-gpudirect-clique=3 -fw_cfg name=opt/x,string=\"it's\"\n"
              "hostpci0: 0000:41:00.0,pcie=1\nhostpci1: 0000:61:00.0,pcie=1\n")
    assert shlex.split(clique_args(node.parse_qm_config(config), 2)) == [
        "-fw_cfg", "name=opt/x,string=it's", "-set", "device.hostpci0.x-nv-gpudirect-clique=0",
        "-set", "device.hostpci1.x-nv-gpudirect-clique=0"]
    (finding,) = findings(p2p_verdict(guest(), composed_node(qm_text=config), {}), Cause.VM_NO_CLIQUE)
    assert "hostpci0" in finding.detail  # clique 3 on hostpci0 and none on hostpci1: not one clique
    command = finding.fixes[0].removeprefix("on pve1: ").split(", then")[0]
    assert shlex.split(command)[:4] == ["qm", "set", "105", "--args"] and "clique=3" not in command


def test_vm_without_a_node_says_what_to_set_and_how_to_name_the_node():
    (finding,) = findings(p2p_verdict(guest(), None, {}), Cause.VM_NO_CLIQUE)
    assert "no proxmox_node / proxmox_vmid in the inventory" in finding.detail
    assert finding.fixes[0].startswith("on the Proxmox node: qm set VMID --args '-set device.hostpci0.")
    assert "proxmox_node, proxmox_vmid" in finding.fixes[1]


def test_unreachable_node_still_reports_the_vm_side():
    unreachable = NodeReadings("pve1", 105, error="unreachable: [Errno 111] Connection refused")
    verdict = p2p_verdict(guest(), unreachable, {})
    (finding,) = findings(verdict, Cause.VM_NO_CLIQUE)
    assert "node not read (unreachable: [Errno 111] Connection refused)" in finding.detail
    assert "Proxmox node pve1, VM 105: not read (unreachable: [Errno 111] Connection refused)" in verdict.notes
    assert not findings(verdict, Cause.ACS_REDIRECT) and verdict.pairs[0].p2p is False


def test_clique_ignored_by_hidden_cpu_and_a_bare_slot():
    verdict = p2p_verdict(guest(), composed_node("qm-config-clique-hidden-bare.conf"), {})
    assert not findings(verdict, Cause.VM_NO_CLIQUE)
    (finding,) = findings(verdict, Cause.CLIQUE_IGNORED)
    assert finding.fixes == ("on pve1: qm set 105 --cpu host", "on pve1: qm set 105 --hostpci0 0000:41:00.0,pcie=1")


def test_acs_redirect_names_each_port_with_its_setpci_line_and_the_trade_off():
    (finding,) = findings(p2p_verdict(guest(), composed_node("qm-config-clique.conf"), {}), Cause.ACS_REDIRECT)
    assert "0000:40:01.1 (ReqRedir+ CmpltRedir+), 0000:60:03.1 (ReqRedir+ CmpltRedir+)" in finding.detail
    assert finding.fixes[:2] == ("on pve1, until reboot: setpci -s 0000:40:01.1 ECAP_ACS+6.w=0000",
                                 "on pve1, until reboot: setpci -s 0000:60:03.1 ECAP_ACS+6.w=0000")
    assert "pci=noacs" in finding.fixes[2] and "disable ACS in the BIOS" in finding.fixes[2]
    assert "isolate" in finding.trade_off


def test_acs_redirect_on_the_quoted_amd_root_ports():
    # linux-pci 2025-07-01: 03:00.0 behind 00:01.1 -> 01:00.0 -> 02:00.0, 04:00.0 behind 00:01.2; both ports ReqRedir+
    amd = NodeReadings("pve1", 105, None, node.parse_cmdline("quiet iommu=pt"), {},
                       node.parse_lspci_vvv((UPSTREAM / "linux-pci-2025-07-01-amd-lspci-vvv-acs.txt").read_text()),
                       node.parse_lspci_tree((UPSTREAM / "linux-pci-2025-07-01-amd-lspci-tv.txt").read_text()),
                       node.parse_qm_config("args: -set device.hostpci0.x-nv-gpudirect-clique=0 "
                                            "-set device.hostpci1.x-nv-gpudirect-clique=0\n"
                                            "hostpci0: 0000:03:00.0,pcie=1\nhostpci1: 0000:04:00.0,pcie=1\n"))
    verdict = p2p_verdict(guest(), amd, {})
    (finding,) = findings(verdict, Cause.ACS_REDIRECT)
    assert [fix.split("setpci -s ")[1] for fix in finding.fixes[:2]] == ["0000:00:01.1 ECAP_ACS+6.w=0000",
                                                                          "0000:00:01.2 ECAP_ACS+6.w=0000"]
    assert not findings(verdict, Cause.ROOT_COMPLEXES) and not findings(verdict, Cause.IOMMU_TRANSLATED)


def test_acs_off_gives_no_acs_cause():
    off = node.parse_lspci_vvv((UPSTREAM / "openvmm-3461-lspci-vv-acs-off.txt").read_text())
    readings = composed_node("qm-config-clique.conf")
    quiet = NodeReadings(readings.name, readings.vmid, None, readings.iommu, readings.groups,
                         {"0000:40:01.1": off["0000:00:00.0"]}, readings.tree, readings.qm)
    assert not findings(p2p_verdict(guest(), quiet, {}), Cause.ACS_REDIRECT)


def test_different_root_complexes():
    (finding,) = findings(p2p_verdict(guest(), composed_node("qm-config-clique.conf"), {}), Cause.ROOT_COMPLEXES)
    assert "0000:41:00.0 hangs from root bus 0000:40 and 0000:61:00.0 from 0000:60" in finding.detail
    assert "under one root complex" in finding.fixes[0] and "own clique id" in finding.fixes[1]


def test_iommu_translated_and_pass_through():
    (finding,) = findings(p2p_verdict(guest(), composed_node("qm-config-clique.conf"), {}), Cause.IOMMU_TRANSLATED)
    assert finding.fixes == ("on pve1: add iommu=pt to the kernel command line (next to amd_iommu=on), then reboot",)
    passthrough = composed_node("qm-config-clique.conf", cmdline="root=/dev/mapper/pve-root amd_iommu=on iommu=pt")
    assert not findings(p2p_verdict(guest(), passthrough, {}), Cause.IOMMU_TRANSLATED)


def test_p2p_disabled_by_env_on_a_pair_that_supports_it():
    # 2 x H200: topo -p2p r/w OK, and the run with NCCL_P2P_DISABLE=1 chose SHM on every channel
    read = parse_gpu_matrix((H200X2 / "topo-p2p-r.txt").read_text())
    write = parse_gpu_matrix((H200X2 / "topo-p2p-w.txt").read_text())
    check = parse_check_output(json.loads((H200X2 / "p2p-disable.json").read_text()))
    side = VmSide(KVM_GUEST, read, write, gpu_names=("NVIDIA H200",) * 2, transports=check.transports)
    verdict = p2p_verdict(side, None, {"NCCL_P2P_DISABLE": "1"})
    (finding,) = findings(verdict, Cause.DISABLED_BY_ENV)
    assert verdict.pairs[0].p2p is False and "remove it from the profile's nccl section" in finding.fixes[0]
    assert any(note.startswith("NCCL chose: SHM/direct/direct") for note in verdict.notes)
    assert p2p_verdict(side, None, {"NCCL_P2P_LEVEL": "LOC"}).pairs[0].p2p is False


def test_h200_pair_with_p2p_needs_no_advice():
    read = parse_gpu_matrix((H200X2 / "topo-p2p-r.txt").read_text())
    verdict = p2p_verdict(VmSide(KVM_GUEST, read, read, gpu_names=("NVIDIA H200",) * 2), None, {})
    assert verdict.pairs[0].p2p and verdict.pairs[0].findings == () and verdict.interim == ()
    assert "  GPU0-GPU1: P2P (read OK, write OK)" in verdict.lines()


def test_until_then_advice_and_the_rtx_pro_6000_hang():
    verdict = p2p_verdict(guest(), None, {})
    assert "NVIDIA/nccl#1999" in verdict.interim[0] and "NCCL_P2P_DISABLE=1" in verdict.interim[0]
    assert verdict.interim[1].startswith("SGLang: --disable-custom-all-reduce")
    read = parse_gpu_matrix((H200X2 / "topo-p2p-r.txt").read_text())
    working = p2p_verdict(VmSide(KVM_GUEST, read, read, gpu_names=RTX_PRO), None, {})
    assert working.pairs[0].p2p and "if gpu-check's all-reduce hangs" in working.interim[0]


def test_bare_metal_without_a_cause_found_says_so():
    # club-3090#1124: two RTX 5090 on bare metal, GNS between them
    gns = parse_gpu_matrix((UPSTREAM / "club-3090-1124-topo-p2p-gns.txt").read_text())
    (pair,) = p2p_verdict(VmSide(BARE, gns, gns), None, {}).pairs
    assert [f.cause for f in pair.findings] == [Cause.NOT_FOUND]
    assert "GNS: GPU not supported" in pair.findings[0].detail and "ACSCtl" in pair.findings[0].fixes[0]


def test_one_gpu_has_no_pair():
    verdict = p2p_verdict(VmSide(KVM_GUEST, {}, {}), None, {})
    assert verdict.pairs == () and "fewer than two GPUs: no pair to judge" in verdict.notes


def test_status_line_and_json_carry_the_verdict():
    verdict = p2p_verdict(guest(), composed_node(), {})
    assert verdict.one_line() == ("peer-to-peer on 0 of 1 GPU pairs; causes: ACS redirect on, GPUs under different "
                                  "root complexes, IOMMU in translated mode, VM without a GPUDirect clique")
    as_json = json.loads(json.dumps(jsonable(verdict)))  # as `gpu-check --json` and `status --json` write it
    assert as_json["pairs"][0]["gpus"] == [0, 1] and as_json["pairs"][0]["p2p"] is False
    assert [f["kind"] for f in as_json["pairs"][0]["findings"]] == ["vm_no_clique", "acs_redirect", "root_complexes",
                                                                    "iommu_translated"]
    assert as_json["pairs"][0]["findings"][1]["cause"] == "ACS redirect on"
    assert as_json["interim"][1].startswith("SGLang: --disable-custom-all-reduce")


def test_iommu_on_by_default_without_a_flag_still_asks_for_pass_through():
    # an AMD node whose IOMMU is on without amd_iommu= (the kernel's default) and IOMMU groups present
    (finding,) = findings(p2p_verdict(guest(), composed_node("qm-config-clique.conf", cmdline="root=/dev/sda1 ro"), {}),
                          Cause.IOMMU_TRANSLATED)
    assert "cmdline: no IOMMU flag, no iommu=pt" in finding.detail
    assert finding.fixes == ("on pve1: add iommu=pt to the kernel command line, then reboot",)
