"""The read-only batches of the peer-to-peer section: one on the inventory host (the VM), one on the Proxmox node
its `proxmox_node` / `proxmox_vmid` vars name, reached through the same remote layer. Nothing on either is changed;
a node that cannot be reached leaves the VM side reported and says the node was not read."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from deploy_lib.deploy.project import Target, resolve_target
from deploy_lib.errors import ConfigError, DeployError
from deploy_lib.gpu_check.p2p import links, node, vm
from deploy_lib.gpu_check.p2p.measure import Measurement
from deploy_lib.gpu_check.p2p.verdict import NodeReadings, P2pVerdict, VmSide, p2p_verdict
from deploy_lib.gpu_check.topology import Topology
from deploy_lib.inventory.model import Inventory
from deploy_lib.remote import Remote, Step
from deploy_lib.remote.readings import ANY_EXIT, Readings

if TYPE_CHECKING:
    from deploy_lib.gpu_check.subject import GpuCheckReport

LINK_QUERY = "index,name,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current," \
             "pcie.link.width.max"
MISSING = 127  # the shell's "command not found"


def vm_steps(topo_dump_path: str | None = None) -> list[Step]:
    """Whether the host is a VM and each GPU's link; any exit is a fact (a Firecracker guest lacks half of these)."""
    steps = [Step("p2p: systemd-detect-virt", ("systemd-detect-virt",), ok=ANY_EXIT, timeout_s=15),
             Step("p2p: dmi", ("cat", "/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name"), ok=ANY_EXIT,
                  timeout_s=15),
             Step("p2p: cpuinfo hypervisor", ("grep", "-c", "-w", "hypervisor", "/proc/cpuinfo"), ok=ANY_EXIT,
                  timeout_s=15),
             Step("p2p: cmdline", ("cat", "/proc/cmdline"), ok=ANY_EXIT, timeout_s=15),
             Step("p2p: kernel log", ("dmesg",), sudo=True, ok=ANY_EXIT, timeout_s=30),
             Step("p2p: links", ("nvidia-smi", f"--query-gpu={LINK_QUERY}", "--format=csv"), ok=ANY_EXIT,
                  timeout_s=30)]
    if topo_dump_path is not None:
        steps.append(Step("p2p: NCCL topology dump", ("cat", topo_dump_path), ok=ANY_EXIT, timeout_s=15))
    return steps


def node_steps(vmid: int) -> list[Step]:
    """What the Proxmox node says about the VM's GPUs; lspci and qm under sudo (ACS is hidden from other users)."""
    return [Step("node: cmdline", ("cat", "/proc/cmdline"), ok=ANY_EXIT, timeout_s=15),
            Step("node: iommu groups", ("find", "/sys/kernel/iommu_groups", "-mindepth", "3", "-maxdepth", "3"),
                 ok=ANY_EXIT, timeout_s=15),
            Step("node: lspci -t", ("lspci", "-t"), ok=ANY_EXIT, timeout_s=30),
            Step("node: lspci -vvv", ("lspci", "-vvv"), sudo=True, ok=ANY_EXIT, timeout_s=60),
            Step("node: qm config", ("qm", "config", str(vmid)), sudo=True, ok=ANY_EXIT, timeout_s=30)]


def parse_vm_side(readings: Readings, topology: Topology | None, gpu_names: tuple[str, ...],
                  transports: Mapping[str, int]) -> tuple[VmSide, tuple[str, ...]]:
    """vm_steps' results + the check's topology and NCCL transports -> the VM side, and what could not be read."""
    unread = []
    virt = readings["p2p: systemd-detect-virt"]
    dmi_result = readings["p2p: dmi"]
    dmi_lines = dmi_result.stdout.splitlines()
    dmi = (dmi_lines[0].strip(), dmi_lines[1].strip() if len(dmi_lines) > 1 else "") \
        if dmi_result.exit_code == 0 and dmi_lines else None
    cpuinfo = readings["p2p: cpuinfo hypervisor"]
    flag = None if cpuinfo.exit_code > 1 else cpuinfo.stdout.strip() not in ("", "0")
    kernel_log = readings["p2p: kernel log"]
    if kernel_log.exit_code != 0:
        unread.append("kernel log not readable (dmesg under sudo)")
    reading = vm.parse_vm(vm.parse_detect_virt(virt.stdout, virt.exit_code), dmi, flag,
                          readings.stdout("p2p: cmdline") or None, readings.stdout("p2p: kernel log") or None)
    gpu_links: list[links.GpuLink] = []
    try:
        gpu_links += links.parse_nvidia_smi_links(readings.stdout("p2p: links"))
    except ValueError as exc:
        unread.append(f"nvidia-smi links: {exc}")
    if "p2p: NCCL topology dump" in readings:
        try:
            gpu_links += links.parse_topo_dump(readings.stdout("p2p: NCCL topology dump"))
        except ValueError as exc:
            unread.append(f"NCCL topology dump: {exc}")
    if topology is None:
        unread.append("nvidia-smi topo -p2p not read: no pair judged")
    side = VmSide(reading, topology.p2p_read if topology else {}, topology.p2p_write if topology else {},
                  tuple(gpu_links), gpu_names, dict(transports))
    return side, tuple(unread)


def parse_node(name: str, vmid: int, readings: Readings) -> NodeReadings:
    """node_steps' results -> the node's readings; a missing lspci or qm is named instead of guessed around."""
    missing = [tool for tool, step in (("lspci (pciutils)", "node: lspci -vvv"), ("qm", "node: qm config"))
               if readings[step].exit_code == MISSING]
    if missing:
        return NodeReadings(name, vmid, f"{' and '.join(missing)} not found on {name} (is it a Proxmox VE node?)")
    qm_result = readings["node: qm config"]
    if qm_result.exit_code != 0:
        detail = (qm_result.stderr or qm_result.stdout).strip().splitlines()
        return NodeReadings(name, vmid, f"`qm config {vmid}` exited {qm_result.exit_code}: "
                                        f"{detail[-1] if detail else 'no output'}")
    try:
        tree = node.parse_lspci_tree(readings.stdout("node: lspci -t"))
        return NodeReadings(name, vmid, None, node.parse_cmdline(readings.stdout("node: cmdline")),
                            node.parse_iommu_groups(readings.stdout("node: iommu groups")),
                            node.parse_lspci_vvv(readings.stdout("node: lspci -vvv")), tree,
                            node.parse_qm_config(qm_result.stdout))
    except ValueError as exc:
        return NodeReadings(name, vmid, f"node output not understood: {exc}")


@dataclass(frozen=True)
class ProxmoxNode:
    target: Target
    vmid: int


def proxmox_node(inventory: Inventory, target: Target, accept_new_host_key: bool = False) -> ProxmoxNode | None:
    """The node the host's `proxmox_node` var names (an inventory host), with `proxmox_vmid`; None when unset."""
    host_vars = target.host.vars
    if host_vars.proxmox_node is None or host_vars.proxmox_vmid is None:
        return None
    if host_vars.proxmox_node not in inventory.hosts:
        raise ConfigError(f"{inventory.path}: {target.host.name}'s proxmox_node {host_vars.proxmox_node!r} is not a "
                          "host of the inventory", "add the Proxmox node as a host (its ansible_host, ansible_user)")
    return ProxmoxNode(resolve_target(inventory, host_vars.proxmox_node, accept_new_host_key), host_vars.proxmox_vmid)


def read_node(found: ProxmoxNode, connect: Callable[[Target], AbstractContextManager[Remote]]) -> NodeReadings:
    """The node's batch; a node that cannot be reached (or refuses a step) is reported, not raised."""
    name = found.target.host.name
    try:
        with connect(found.target) as remote:
            return parse_node(name, found.vmid, Readings(remote.run(node_steps(found.vmid))))
    except DeployError as exc:
        return NodeReadings(name, found.vmid, f"unreachable: {exc.message}")


NodeReader = Callable[[Target], NodeReadings | None]


def node_reader(inventory: Inventory, targets: Sequence[Target],
                connect: Callable[[Target], AbstractContextManager[Remote]], accept_new_host_key: bool = False
                ) -> NodeReader:
    """Each host's Proxmox node resolved now, so a wrong `proxmox_node` is a ConfigError before any connection; the
    reader returned reads a host's node when called (None: the host names no node)."""
    nodes = {target.host.name: proxmox_node(inventory, target, accept_new_host_key) for target in targets}

    def read(target: Target) -> NodeReadings | None:
        found = nodes.get(target.host.name)
        return read_node(found, connect) if found is not None else None
    return read


def with_unread(verdict: P2pVerdict, unread: Sequence[str]) -> P2pVerdict:
    """The verdict whose notes also say what could not be read in the VM, and why."""
    return replace(verdict, notes=(*verdict.notes, *(f"not read: {item}" for item in unread)))


def read_peer_to_peer(remote: Remote, topology: Topology | None, gpu_names: tuple[str, ...],
                      transports: Mapping[str, int], environment: Mapping[str, str], node_readings: NodeReadings | None,
                      topo_dump_path: str | None = None, measurement: Measurement | None = None
                      ) -> tuple[P2pVerdict, tuple[str, ...]]:
    """The VM-side batch on the inventory host, then the verdict (with the node's readings, when one is named, and
    gpu-check's copy measurement, when it ran)."""
    side, unread = parse_vm_side(Readings(remote.run(vm_steps(topo_dump_path))), topology, gpu_names, transports)
    return p2p_verdict(side, node_readings, environment, measurement), unread


def check_peer_to_peer(report: GpuCheckReport, remote: Remote, node_readings: NodeReadings | None,
                       gpu_names: tuple[str, ...] = (), topo_dump_path: str | None = None,
                       measurement: Measurement | None = None) -> P2pVerdict:
    """gpu-check's peer-to-peer section after its report: the VM batch on `remote` (NCCL's topology dump of the
    check's run at `topo_dump_path`), the verdict with the node's readings (None: no node named), the check's
    topology, transports and NCCL environment, and the per-pair copies of `measurement`; `gpu_names` when the check
    itself named none (it did not run)."""
    names = tuple(name for name in report.check.gpus if name) or gpu_names
    verdict, unread = read_peer_to_peer(remote, report.topology, names, report.check.transports,
                                        report.subject.environment, node_readings, topo_dump_path, measurement)
    return with_unread(verdict, unread)
