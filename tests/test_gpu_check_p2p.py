"""gpu-check's peer-to-peer readings and verdict (deploy_lib/gpu_check/p2p), on real outputs: recorded on the lent
H200 VM (tests/data/p2p/h200-1gpu-2026-12-01), the 2 x H200 set (tests/data/gpu_check/h200x2-2026-11-30), the
development machine (tests/data/p2p/devmachine-2026-12-01), quoted upstream (tests/data/p2p/upstream), and a
Proxmox node composed from documented formats (tests/data/p2p/composed-node). Each test names its fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy_lib.gpu_check.p2p import links, node, vm

DATA = Path(__file__).resolve().parent / "data"
H200_VM = DATA / "p2p/h200-1gpu-2026-12-01"
H200X2 = DATA / "gpu_check/h200x2-2026-11-30"
DEV = DATA / "p2p/devmachine-2026-12-01"
UPSTREAM = DATA / "p2p/upstream"
COMPOSED = DATA / "p2p/composed-node"
RTX_PRO = ("NVIDIA RTX PRO 6000 Blackwell Server Edition",) * 2


def text(path: Path) -> str:
    return path.read_text()


def detect_virt(path: Path) -> tuple[str | None, bool]:
    *out, exit_line = text(path).splitlines()
    return vm.parse_detect_virt("\n".join(out), int(exit_line.split()[1]))


# --- whether the host is a VM


def test_h200_firecracker_vm_is_a_vm_without_systemd_detect_virt_or_dmi():
    reading = vm.parse_vm(detect_virt(H200_VM / "systemd-detect-virt.txt"), None,
                          text(H200_VM / "cpuinfo-hypervisor.txt").strip() == "hypervisor",
                          text(H200_VM / "proc-cmdline.txt"), text(H200_VM / "dmesg-hypervisor-lines.txt"))
    assert reading.in_vm is True and reading.hypervisor == "firecracker"
    assert "kernel log: Hypervisor detected: KVM" in reading.evidence
    assert reading.unreadable == ("no systemd-detect-virt", "no DMI under /sys/class/dmi/id")


def test_dev_machine_container_inside_a_vm_names_both():
    reading = vm.parse_vm(detect_virt(DEV / "systemd-detect-virt.txt"), None,
                          text(DEV / "cpuinfo-hypervisor.txt").strip() == "hypervisor", text(DEV / "proc-cmdline.txt"),
                          None)
    assert (reading.in_vm, reading.container, reading.hypervisor) == (True, "docker", "firecracker")
    assert "inside a docker container" in reading.one_line()


def test_bare_metal_and_proxmox_guest_dmi():
    # systemd-detect-virt prints "none" and exits 1 on bare metal; QEMU's DMI vendor in a Proxmox guest
    assert vm.parse_vm(vm.parse_detect_virt("none\n", 1), ("Dell Inc.", "PowerEdge R760"), False, "", "").in_vm is False
    guest = vm.parse_vm(vm.parse_detect_virt("kvm\n", 0), ("QEMU", "Standard PC (Q35 + ICH9, 2009)"), True, "", "")
    assert (guest.in_vm, guest.hypervisor) == (True, "kvm") and "DMI: QEMU / Standard PC (Q35 + ICH9, 2009)" in \
        guest.evidence


def test_nothing_readable_says_not_known():
    reading = vm.parse_vm((None, False), None, None, None, None)
    assert reading.in_vm is None and reading.one_line().startswith("not known whether this is a VM")


# --- PCIe links


def test_h200_links_nvidia_smi_and_sysfs_say_gen5_x16_while_nccl_reads_width_0():
    (smi,) = links.parse_nvidia_smi_links(text(H200_VM / "nvidia-smi-query.csv"))
    assert (smi.bus_id, smi.gen, smi.width, smi.gen_max, smi.width_max) == ("00000000:00:06.0", 5, 16, 5, 16)
    sysfs = dict(line.split(": ", 1) for line in text(H200_VM / "sysfs-gpu-link.txt").splitlines())
    link = links.parse_sysfs_link("0000:00:06.0", sysfs["current_link_speed"], sysfs["current_link_width"])
    assert (link.gen, link.width) == (5, 16)
    (nccl,) = links.parse_topo_dump(text(H200_VM / "nccl-topo-dump.xml"))
    assert (nccl.bus_id, nccl.gen, nccl.width, nccl.index) == ("0000:00:06.0", 5, 0, 0)
    assert links.vm_signs([smi, link, nccl]) == ["NCCL topology reads 0000:00:06.0 at width 0"]


def test_nccl_1329_vm_dump_has_four_gpus_without_link():
    dump = links.parse_topo_dump(text(UPSTREAM / "nccl-1329-vm-topo-dump.xml"))
    assert [(g.bus_id, g.gen, g.width) for g in dump] == [(f"0000:00:{d}.0", None, 0) for d in ("09", "0a", "0b", "0c")]
    assert len(links.vm_signs(dump)) == 4


def test_link_parsers_refuse_what_is_not_their_output():
    with pytest.raises(ValueError, match=r"pci\.bus_id"):
        links.parse_nvidia_smi_links("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    with pytest.raises(ValueError, match="not XML"):
        links.parse_topo_dump("<system><cpu>")


# --- the Proxmox node's readings


def test_lspci_tree_amd_desktop_chains_and_path_ports():
    tree = node.parse_lspci_tree(text(UPSTREAM / "linux-pci-2025-07-01-amd-lspci-tv.txt"))
    assert tree.upstream["0000:03:00.3"] == ("0000:00:01.1", "0000:01:00.0", "0000:02:00.0")
    assert tree.upstream["0000:0b:00.0"] == ("0000:00:02.2", "0000:06:00.0", "0000:07:03.0")
    assert tree.upstream["0000:00:18.7"] == () and tree.root_bus["0000:04:00.0"] == "0000:00"
    assert tree.path_ports("0000:03:00.0", "0000:04:00.0") == ("0000:00:01.1", "0000:01:00.0", "0000:02:00.0",
                                                               "0000:00:01.2")
    assert tree.path_ports("0000:08:00.0", "0000:09:00.0") == ("0000:07:01.0", "0000:07:02.0")  # one switch


def test_lspci_tree_two_root_buses_and_the_dev_machine():
    tree = node.parse_lspci_tree(text(UPSTREAM / "club-3090-1124-lspci-t-two-domains.txt"))
    assert (tree.root_bus["0000:22:00.4"], tree.upstream["0000:22:00.4"]) == ("0000:20", ("0000:20:08.1",))
    assert tree.root_bus["0000:03:00.0"] == "0000:00"
    dev = node.parse_lspci_tree(text(DEV / "lspci-t.txt"))
    assert sorted(dev.upstream) == [f"0000:00:0{d}.0" for d in range(6)] and not any(dev.upstream.values())
    with pytest.raises(ValueError, match="no devices"):
        node.parse_lspci_tree("")


def test_lspci_vvv_acs_control_per_port():
    ports = node.parse_lspci_vvv(text(UPSTREAM / "linux-pci-2025-07-01-amd-lspci-vvv-acs.txt"))
    assert ports["0000:00:01.1"].redirects == ("ReqRedir", "CmpltRedir")
    assert ports["0000:00:01.0"].acs_control is None
    off = node.parse_lspci_vvv(text(UPSTREAM / "openvmm-3461-lspci-vv-acs-off.txt"))["0000:00:00.0"]
    assert off.redirects == () and off.driver == "pcieport" and off.acs_control["SrcValid"] is False
    dev = node.parse_lspci_vvv(text(DEV / "lspci-vvv.txt"))
    assert len(dev) == 6 and all(d.acs_control is None for d in dev.values())
    assert dev["0000:00:03.0"].driver == "virtio-pci"


def test_acsctl_lines_of_nccl_523():
    flags = [node.parse_acs_flags(line.strip()) for line in text(UPSTREAM / "nccl-523-acsctl-grep.txt").splitlines()]
    assert len(flags) == 12 and sum(f["ReqRedir"] for f in flags) == 5 and flags[8]["SrcValid"] is False


def test_lspci_without_root_hides_capabilities():
    block = "41:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1 (rev a1)\n" \
            "\tCapabilities: <access denied>\n\tKernel driver in use: vfio-pci\n"
    device = node.parse_lspci_vvv(block)["0000:41:00.0"]
    assert device.capabilities_hidden and device.driver == "vfio-pci"


def test_cmdline_iommu_flags_and_mode():
    h200 = node.parse_cmdline(text(H200_VM / "proc-cmdline.txt"))
    assert (h200.intel_iommu, h200.amd_iommu, h200.passthrough, h200.pci_noacs) == (None, None, False, False)
    assert h200.mode(groups_present=False) == "off"
    composed = node.parse_cmdline(text(COMPOSED / "proc-cmdline.txt"))
    assert composed.amd_iommu == "on" and composed.mode(groups_present=True) == "translated"
    tuned = node.parse_cmdline("quiet intel_iommu=on iommu=pt pcie_acs_override=downstream,multifunction pci=noacs")
    assert tuned.mode(True) == "pass-through" and tuned.acs_override == "downstream,multifunction" and tuned.pci_noacs


def test_iommu_groups():
    assert node.parse_iommu_groups(text(COMPOSED / "iommu-groups-find.txt"))["0000:61:00.0"] == 46
    assert node.parse_iommu_groups(text(DEV / "iommu-groups-find.txt")) == {}


def test_qm_config_hostpci_args_and_cliques():
    plain = node.parse_qm_config(text(UPSTREAM / "proxmox-qemu-server-q35-linux-hostpci.conf"))
    assert sorted(plain.hostpci) == [0, 1, 2, 3, 4, 7] and plain.args is None and plain.cliques == {}
    assert plain.hostpci[4].devices == ("0000:d0:17.0",) and plain.hostpci[4].options == {"pcie": "1", "rombar": "0"}
    clique = node.parse_qm_config(text(COMPOSED / "qm-config-clique.conf"))
    assert clique.cliques == {0: 0, 1: 0} and not clique.cpu_hidden
    broken = node.parse_qm_config(text(COMPOSED / "qm-config-clique-hidden-bare.conf"))
    assert broken.cpu_hidden and broken.hostpci[0].bare_slot and not broken.hostpci[1].bare_slot
    mapped = node.parse_qm_config("hostpci0: mapping=gpu-a,pcie=1\n[snap1]\nhostpci1: 0000:99:00.0\n")
    assert mapped.hostpci[0].mapping == "gpu-a" and list(mapped.hostpci) == [0]


def test_bad_pci_address_is_named():
    with pytest.raises(ValueError, match=r"'zz:00\.0' is not a PCI address"):
        node.parse_qm_config("hostpci0: zz:00.0,pcie=1\n")
