"""The peer-to-peer verdict: which GPU pairs have P2P, which do not and why (VM without clique, ACS redirect on a
port, IOMMU translating, different root complexes, P2P turned off by the environment), the fix for each cause as
the exact command or config line, and what to run until then. Advice only: nothing here changes a host."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from deploy_lib.gpu_check.p2p.links import GpuLink, vm_signs
from deploy_lib.gpu_check.p2p.measure import Measurement, PairMeasure, disagreements
from deploy_lib.gpu_check.p2p.node import IommuFlags, PciDevice, PciTree, QmConfig
from deploy_lib.gpu_check.p2p.vm import VmReading
from deploy_lib.gpu_check.topology import P2P_STATUS

VMID_PLACEHOLDER = "VMID"
ACS_TRADE_OFF = ("ACS keeps devices isolated from each other: with it off, devices under those ports can reach each "
                 "other's memory without the IOMMU seeing it, so the host can no longer isolate them (one IOMMU "
                 "group); acceptable when one VM owns all of them")
# where a hang with P2P on is reported (NVIDIA/nccl#1999, local-inference-lab/rtx6kpro#15)
P2P_HANG_GPUS = ("RTX PRO 6000",)


class Cause(StrEnum):
    VM_NO_CLIQUE = "VM without a GPUDirect clique"
    CLIQUE_IGNORED = "clique set but ignored"
    ACS_REDIRECT = "ACS redirect on"
    IOMMU_TRANSLATED = "IOMMU in translated mode"
    ROOT_COMPLEXES = "GPUs under different root complexes"
    DISABLED_BY_ENV = "P2P disabled by the environment"
    NOT_FOUND = "cause not found"


@dataclass(frozen=True)
class Finding:
    cause: Cause
    detail: str
    fixes: tuple[str, ...]
    trade_off: str | None = None

    @property
    def kind(self) -> str:
        """The cause as a stable key for scripts (`--json`): "acs_redirect", "vm_no_clique", ..."""
        return self.cause.name.lower()


@dataclass(frozen=True)
class NodeReadings:
    """What was read on the Proxmox node (proxmox_node / proxmox_vmid), or why it was not."""

    name: str
    vmid: int
    error: str | None = None  # "unreachable: ..." -> the VM side is still reported
    iommu: IommuFlags | None = None
    groups: dict[str, int] = field(default_factory=dict)
    devices: dict[str, PciDevice] = field(default_factory=dict)
    tree: PciTree | None = None
    qm: QmConfig | None = None


@dataclass(frozen=True)
class VmSide:
    vm: VmReading
    p2p_read: dict[tuple[int, int], str]
    p2p_write: dict[tuple[int, int], str]
    links: tuple[GpuLink, ...] = ()
    gpu_names: tuple[str, ...] = ()
    transports: dict[str, int] = field(default_factory=dict)  # NCCL's choice: "P2P/CUMEM" -> channel links


@dataclass(frozen=True)
class PairVerdict:
    gpus: tuple[int, int]
    read: str
    write: str
    findings: tuple[Finding, ...]
    measured: tuple[PairMeasure, ...] = ()  # gpu-check's copies, both directions; () where not measured
    disagreement: tuple[str, ...] = ()  # where the copies contradict the driver's read/write status

    @property
    def p2p(self) -> bool:
        return self.read == "OK" and self.write == "OK" and not any(
            f.cause is Cause.DISABLED_BY_ENV for f in self.findings)


@dataclass(frozen=True)
class P2pVerdict:
    pairs: tuple[PairVerdict, ...]
    interim: tuple[str, ...]  # what to run until the fix
    notes: tuple[str, ...]  # readings, unreadable sources, assumptions
    measurement: str | None = None  # the copy measurement's line (measured, skipped or not run); None: not asked

    def one_line(self) -> str:
        """For `status`: how many pairs have P2P, and the causes found for the others."""
        if not self.pairs:
            return "peer-to-peer: no GPU pair"
        missing = [pair for pair in self.pairs if not pair.p2p]
        causes = sorted({finding.cause.value for pair in missing for finding in pair.findings})
        return f"peer-to-peer on {len(self.pairs) - len(missing)} of {len(self.pairs)} GPU pairs" + \
            (f"; causes: {', '.join(causes)}" if causes else "")

    def lines(self) -> list[str]:
        """The "peer-to-peer" section of the report."""
        out = ["peer-to-peer:", *(f"  {note}" for note in self.notes)]
        if self.measurement:
            out.append(f"  {self.measurement}")
        for pair in self.pairs:
            i, j = pair.gpus
            status = "P2P" if pair.p2p else "no P2P"
            out.append(f"  GPU{i}-GPU{j}: {status} (read {_status(pair.read)}, write {_status(pair.write)})")
            out += [f"    measured {measured.line()}" for measured in pair.measured]
            out += [f"    disagrees: {text}" for text in pair.disagreement]
            for finding in pair.findings:
                out.append(f"    cause: {finding.cause.value}: {finding.detail}")
                out += [f"      fix: {fix}" for fix in finding.fixes]
                if finding.trade_off:
                    out.append(f"      trade-off: {finding.trade_off}")
        if self.interim:
            out.append("  until then:")
            out += [f"    {line}" for line in self.interim]
        return out


def _status(code: str) -> str:
    return code if code == "OK" else f"{code}: {P2P_STATUS.get(code, code)}"


def disabled_by_env(environment: Mapping[str, str]) -> str | None:
    if environment.get("NCCL_P2P_DISABLE") == "1":
        return "NCCL_P2P_DISABLE=1"
    if environment.get("NCCL_P2P_LEVEL") in ("LOC", "0"):
        return f"NCCL_P2P_LEVEL={environment['NCCL_P2P_LEVEL']}"
    return None


def clique_args(qm: QmConfig | None, gpu_count: int) -> str:
    """The VM's `args` with every passed-through GPU in clique 0 (existing args kept, old clique settings replaced)."""
    indexes = sorted(qm.hostpci) if qm and qm.hostpci else list(range(gpu_count))
    kept = " ".join(part for part in _args_without_cliques(qm.args if qm else None))
    cliques = " ".join(f"-set device.hostpci{i}.x-nv-gpudirect-clique=0" for i in indexes)
    return f"{kept} {cliques}".strip()


def _args_without_cliques(args: str | None) -> list[str]:
    words, kept = shlex.split(args or ""), []
    index = 0
    while index < len(words):
        if words[index] == "-set" and index + 1 < len(words) and ".x-nv-gpudirect-clique=" in words[index + 1]:
            index += 2
            continue
        kept.append(words[index])
        index += 1
    return [shlex.quote(word) for word in kept]


def qm_set_args(vmid: int | str, args: str) -> str:
    return f"qm set {vmid} --args {shlex.quote(args)}"


def _vm_findings(side: VmSide, node: NodeReadings | None, pair: tuple[int, int]) -> list[Finding]:
    hypervisor = side.vm.hypervisor or "hypervisor not named"
    gpu_count = len({i for i, _ in side.p2p_read}) or 2
    if node is None or node.qm is None:
        why = "no proxmox_node / proxmox_vmid in the inventory" if node is None else f"node not read ({node.error})"
        vmid = node.vmid if node else VMID_PLACEHOLDER
        return [Finding(Cause.VM_NO_CLIQUE, f"in a VM ({hypervisor}) the driver cannot see the host's PCIe tree and "
                        f"reports no P2P unless the hypervisor marks the GPUs as one clique; the VM's config was not "
                        f"read ({why})",
                        (f"on the Proxmox node: {qm_set_args(vmid, clique_args(None, gpu_count))} "
                         "(one -set per hostpciN of the GPUs), then stop and start the VM",
                         "name the node in the inventory (proxmox_node, proxmox_vmid) so the next check reads it"))]
    indexes = [_hostpci_index(node.qm, gpu) for gpu in pair]
    cliques = [node.qm.cliques.get(index) if index is not None else None for index in indexes]
    if None in cliques or cliques[0] != cliques[1]:
        missing = ", ".join(f"hostpci{index}" for index, clique in zip(indexes, cliques, strict=True)
                            if clique is None and index is not None) or "the pair's hostpci entries"
        have = f"args: {node.qm.args}" if node.qm.args else "no args"
        return [Finding(Cause.VM_NO_CLIQUE, f"VM {node.vmid} on {node.name} ({have}) puts no x-nv-gpudirect-clique on "
                        f"{missing}, so the guest driver reports no P2P",
                        (f"on {node.name}: {qm_set_args(node.vmid, clique_args(node.qm, gpu_count))}, then "
                         f"`qm stop {node.vmid} && qm start {node.vmid}` (a reboot inside the guest keeps the old "
                         "QEMU process)",))]
    ignored = []
    fixes = []
    if node.qm.cpu_hidden:
        ignored.append(f"cpu: {node.qm.cpu} (hidden=1 makes QEMU emit kvm=off and the driver skips the clique)")
        cpu = ",".join(part for part in (node.qm.cpu or "").split(",") if part != "hidden=1")
        fixes.append(f"on {node.name}: qm set {node.vmid} --cpu {shlex.quote(cpu)}")
    for index in indexes:
        entry = node.qm.hostpci.get(index) if index is not None else None
        if entry is not None and entry.bare_slot:
            ignored.append(f"hostpci{index} names a slot without its function (the clique lands on no function)")
            value = ",".join([";".join(entry.devices), *(f"{k}={v}" if v else k for k, v in entry.options.items())])
            fixes.append(f"on {node.name}: qm set {node.vmid} --hostpci{index} {shlex.quote(value)}")
    if ignored:
        return [Finding(Cause.CLIQUE_IGNORED, "; ".join(ignored), tuple(fixes))]
    return []


def _hostpci_index(qm: QmConfig, gpu: int) -> int | None:
    """The guest's GPU i taken to be the i-th hostpci entry (QEMU places them on ports in that order)."""
    indexes = sorted(qm.hostpci)
    return indexes[gpu] if gpu < len(indexes) else None


def _host_address(node: NodeReadings, gpu: int) -> str | None:
    index = _hostpci_index(node.qm, gpu) if node.qm else None
    entry = node.qm.hostpci.get(index) if node.qm and index is not None else None
    return entry.devices[0] if entry and entry.devices else None


def _node_findings(node: NodeReadings, pair: tuple[int, int]) -> list[Finding]:
    addresses = [_host_address(node, gpu) for gpu in pair]
    if None in addresses or node.tree is None:
        return []
    a, b = str(addresses[0]), str(addresses[1])
    findings = []
    ports = node.tree.path_ports(a, b)
    redirecting = [node.devices[port] for port in ports if port in node.devices and node.devices[port].redirects]
    if redirecting:
        names = ", ".join(f"{d.bdf} ({'+ '.join(d.redirects)}+)" for d in redirecting)
        findings.append(Finding(
            Cause.ACS_REDIRECT, f"ports between {a} and {b} redirect peer-to-peer requests to the root complex: "
            f"{names}",
            (*(f"on {node.name}, until reboot: setpci -s {d.bdf} ECAP_ACS+6.w=0000" for d in redirecting),
             f"on {node.name}, lasting: add pci=noacs to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT in "
             "/etc/default/grub, then update-grub; or /etc/kernel/cmdline, then proxmox-boot-tool refresh), or "
             "disable ACS in the BIOS (often under PCIe / AMD CBS / NBIO), then reboot"),
            ACS_TRADE_OFF))
    hidden = [port for port in ports if port in node.devices and node.devices[port].capabilities_hidden]
    if hidden:
        findings.append(Finding(Cause.NOT_FOUND, f"ACS of {', '.join(hidden)} not readable (lspci ran without root)",
                                ("give the node's SSH user passwordless sudo for lspci",)))
    roots = {node.tree.root_bus.get(a), node.tree.root_bus.get(b)}
    if len(roots) == 2 and None not in roots:
        findings.append(Finding(
            Cause.ROOT_COMPLEXES, f"{a} hangs from root bus {node.tree.root_bus[a]} and {b} from "
            f"{node.tree.root_bus[b]}: P2P crosses the CPU's data fabric, which some platforms do not route",
            ("move both GPUs into slots under one root complex (or behind one PCIe switch)",
             "if the platform routes P2P between root complexes, the clique still helps; if the measured P2P is "
             "wrong or slow, give each root complex's GPUs their own clique id")))
    if node.iommu is not None and node.iommu.mode(bool(node.groups)) == "translated":
        flags = " ".join(f"{k}={v}" for k, v in (("intel_iommu", node.iommu.intel_iommu),
                                                  ("amd_iommu", node.iommu.amd_iommu)) if v)
        findings.append(Finding(
            Cause.IOMMU_TRANSLATED, f"the node's IOMMU translates DMA (cmdline: {flags or 'no IOMMU flag'}, no "
            "iommu=pt); with ACS redirect this routes P2P through the IOMMU (the RTX PRO 6000 hang of "
            "local-inference-lab/rtx6kpro#15)",
            (f"on {node.name}: add iommu=pt to the kernel command line" + (f" (next to {flags})" if flags else "")
             + ", then reboot",),
            "iommu=pt stops translating DMA of devices the host keeps; passed-through devices stay translated"))
    return findings


def _pair_findings(side: VmSide, node: NodeReadings | None, pair: tuple[int, int], read: str, write: str,
                   environment: Mapping[str, str]) -> tuple[Finding, ...]:
    findings: list[Finding] = []
    disabled = disabled_by_env(environment)
    if disabled:
        findings.append(Finding(Cause.DISABLED_BY_ENV, f"{disabled} keeps NCCL off P2P on this pair",
                                ("remove it from the profile's nccl section once the pair's P2P is verified "
                                 "(gpu-check's all-reduce sums it exactly)",) if read == write == "OK" else ()))
    if read == write == "OK":
        return tuple(findings)
    if side.vm.in_vm:
        findings += _vm_findings(side, node, pair)
    if node is not None and node.error is None:
        findings += _node_findings(node, pair)
    if not [f for f in findings if f.cause is not Cause.DISABLED_BY_ENV]:
        findings.append(Finding(Cause.NOT_FOUND, f"the driver reports {_status(read if read != 'OK' else write)}; "
                                "no cause found in what was read",
                                ("on bare metal, read `lspci -vvv` ACSCtl of the GPUs' upstream ports (NCCL "
                                 "troubleshooting guide, ACS)",)))
    return tuple(findings)


def interim_advice(pairs: tuple[PairVerdict, ...], gpu_names: tuple[str, ...]) -> tuple[str, ...]:
    hang_prone = next((name for name in gpu_names for model in P2P_HANG_GPUS if model in name), None)
    if all(pair.p2p for pair in pairs):
        if hang_prone and pairs:
            return (f"{hang_prone}: NCCL has hung on the first all-reduce with P2P on (NVIDIA/nccl#1999); if "
                    "gpu-check's all-reduce hangs, set nccl.p2p_disable: true (NCCL_P2P_DISABLE=1)",)
        return ()
    return ("NCCL: nccl.p2p_disable: true (NCCL_P2P_DISABLE=1) keeps NCCL off a P2P path the driver refuses or that "
            "hangs" + (f" ({hang_prone}: NVIDIA/nccl#1999)" if hang_prone else ""),
            "SGLang: --disable-custom-all-reduce (its custom all-reduce needs peer access between the GPUs)",
            "expect the all-reduce through host memory to bound throughput; TP+PP or expert-parallel layouts are "
            "worth a tuning sweep")


def p2p_verdict(side: VmSide, node: NodeReadings | None, environment: Mapping[str, str],
                measurement: Measurement | None = None) -> P2pVerdict:
    """VM-side readings (+ the node's, where one is named) -> the verdict per pair, with fixes and interim advice;
    with gpu-check's copy `measurement`, each pair's copies and where they disagree with the driver."""
    pairs = tuple(_pair_verdict(side, node, (i, j), read, environment, measurement)
                  for (i, j), read in sorted(side.p2p_read.items()) if i < j)
    notes = [side.vm.one_line()]
    notes += [f"PCIe link: {link.text()}" for link in side.links]
    notes += [f"VM sign: {sign}" for sign in vm_signs(list(side.links))]
    if side.transports:
        notes.append("NCCL chose: " + ", ".join(f"{via} ({n} channel links)" for via, n in side.transports.items()))
    if node is not None:
        notes.append(f"Proxmox node {node.name}, VM {node.vmid}: " + (f"not read ({node.error})" if node.error else
                     "read (GPU i of the VM taken to be its i-th hostpci entry)"))
    if not pairs:
        notes.append("fewer than two GPUs: no pair to judge")
    return P2pVerdict(pairs, interim_advice(pairs, side.gpu_names), tuple(notes),
                      measurement.summary() if measurement else None)


def _pair_verdict(side: VmSide, node: NodeReadings | None, pair: tuple[int, int], read: str,
                  environment: Mapping[str, str], measurement: Measurement | None) -> PairVerdict:
    write = side.p2p_write.get(pair, "U")
    measured = measurement.of_pair(pair) if measurement else ()
    driver = read if read != "OK" else write  # the driver's P2P status: "OK" only when both are
    return PairVerdict(pair, read, write, _pair_findings(side, node, pair, read, write, environment), measured,
                       disagreements(driver, measured))
