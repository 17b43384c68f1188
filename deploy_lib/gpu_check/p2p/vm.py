"""Whether the inventory host is a VM and which hypervisor: `systemd-detect-virt`, the DMI vendor, the cpuinfo
`hypervisor` flag, the kernel's own boot lines. Each source may be missing (a Firecracker guest has no DMI and no
systemd-detect-virt); what was not readable is said, never guessed."""

from __future__ import annotations

import re
from dataclasses import dataclass

# systemd-detect-virt's container ids (systemd's src/basic/virt.c): a container is not a VM, its GPUs are the host's
CONTAINERS = frozenset({"docker", "podman", "lxc", "lxc-libvirt", "systemd-nspawn", "openvz", "rkt", "wsl", "proot",
                        "pouch"})
# DMI sys_vendor / product_name words -> hypervisor (QEMU is what Proxmox VE runs)
DMI_HYPERVISORS = (("qemu", "qemu"), ("kvm", "kvm"), ("vmware", "vmware"), ("microsoft corporation", "microsoft"),
                   ("xen", "xen"), ("innotek", "oracle"), ("amazon ec2", "amazon"), ("google", "google"),
                   ("cloud hypervisor", "cloud-hypervisor"))
DMESG_HYPERVISOR = re.compile(r"Hypervisor detected: (\S+)")
# Firecracker's guest init is started with this marker on the kernel command line
FIRECRACKER_CMDLINE = re.compile(r"(?:^|\s)--firecracker-init(?:\s|$)")


@dataclass(frozen=True)
class VmReading:
    in_vm: bool | None  # None: no source could tell
    hypervisor: str | None
    container: str | None
    evidence: tuple[str, ...]  # "systemd-detect-virt: kvm", "cpuinfo: hypervisor flag", ...
    unreadable: tuple[str, ...]  # sources that could not be read here

    def one_line(self) -> str:
        if self.in_vm is None:
            return "not known whether this is a VM (" + "; ".join(self.unreadable) + ")"
        where = f"a VM ({self.hypervisor or 'hypervisor not named'})" if self.in_vm else "not a VM"
        inside = f", inside a {self.container} container" if self.container else ""
        return f"{where}{inside}: " + "; ".join(self.evidence)


def parse_detect_virt(stdout: str, exit_code: int) -> tuple[str | None, bool]:
    """`systemd-detect-virt` -> (its id or None, whether it could run); it prints "none" and exits 1 on bare metal."""
    if exit_code == 127:
        return None, False
    word = stdout.strip().splitlines()[0].strip() if stdout.strip() else ""
    return (word or None), bool(word)


def dmi_hypervisor(sys_vendor: str, product_name: str) -> str | None:
    text = f"{sys_vendor} {product_name}".lower()
    return next((name for word, name in DMI_HYPERVISORS if word in text), None)


def parse_vm(detect_virt: tuple[str | None, bool], dmi: tuple[str, str] | None, cpu_hypervisor_flag: bool | None,
             cmdline: str | None, dmesg: str | None) -> VmReading:
    """The sources read (None where not readable) -> the reading; any VM sign makes it a VM."""
    evidence: list[str] = []
    unreadable: list[str] = []
    hypervisors: list[str] = []
    container = None
    virt, ran = detect_virt
    if not ran:
        unreadable.append("no systemd-detect-virt")
    elif virt in CONTAINERS:
        container = virt
        evidence.append(f"systemd-detect-virt: {virt} (a container)")
    elif virt and virt != "none":
        hypervisors.append(virt)
        evidence.append(f"systemd-detect-virt: {virt}")
    else:
        evidence.append("systemd-detect-virt: none")
    if dmi is None:
        unreadable.append("no DMI under /sys/class/dmi/id")
    elif (named := dmi_hypervisor(*dmi)) is not None:
        hypervisors.append(named)
        evidence.append(f"DMI: {' / '.join(part for part in dmi if part)}")
    if cpu_hypervisor_flag is None:
        unreadable.append("no /proc/cpuinfo")
    elif cpu_hypervisor_flag:
        evidence.append("cpuinfo: hypervisor flag")
    if cmdline and FIRECRACKER_CMDLINE.search(cmdline):
        hypervisors.insert(0, "firecracker")
        evidence.append("kernel cmdline: --firecracker-init")
    if dmesg and (match := DMESG_HYPERVISOR.search(dmesg)):
        hypervisors.append(match.group(1).lower())
        evidence.append(f"kernel log: Hypervisor detected: {match.group(1)}")
    vm_signs = bool(hypervisors) or bool(cpu_hypervisor_flag)
    bare_signs = virt == "none" or cpu_hypervisor_flag is False
    in_vm = True if vm_signs else (False if bare_signs else None)
    return VmReading(in_vm, hypervisors[0] if hypervisors else None, container, tuple(evidence), tuple(unreadable))
