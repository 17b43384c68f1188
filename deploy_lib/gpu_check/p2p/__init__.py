"""gpu-check's peer-to-peer section: why P2P between GPUs is missing inside a VM and on its Proxmox node, and how
to get it back. Pure parsers of real outputs and a verdict with advice; deploy_lib/host/p2p_reading.py runs the
read-only steps, the measurement's script is deploy_lib/host_scripts/p2p_measure.py.

    vm        whether the host is a VM and which hypervisor (systemd-detect-virt, DMI, cpuinfo, kernel lines)
    links     each GPU's PCIe link (nvidia-smi, sysfs) and NCCL's topology dump (NCCL_TOPO_DUMP_FILE)
    node      the Proxmox node: /proc/cmdline IOMMU flags, lspci -vvv ACS, lspci -t, IOMMU groups, qm config
    verdict   per pair: P2P or not, the cause, the fix as a command or config line, what to run until then
"""

from deploy_lib.gpu_check.p2p.verdict import Cause, NodeReadings, P2pVerdict, VmSide, p2p_verdict

__all__ = ["Cause", "NodeReadings", "P2pVerdict", "VmSide", "p2p_verdict"]
