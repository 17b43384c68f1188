"""The peer-to-peer section's recorded outputs (tests/data/p2p) and the composed node they make."""

from __future__ import annotations

from pathlib import Path

from helpers.fake_remote import FakeRemote

DATA = Path(__file__).resolve().parents[1] / "data"


H200_VM = DATA / "p2p/h200-1gpu-2026-12-01"


COMPOSED = DATA / "p2p/composed-node"


def read(path: Path) -> str:
    return path.read_text()


def h200_vm(remote: FakeRemote | None = None) -> FakeRemote:
    """`remote` (default: a new one) answering the VM-side batch as the lent H200 VM did."""
    remote = FakeRemote() if remote is None else remote
    remote.reply("p2p: systemd-detect-virt", exit_code=127, stderr="bash: systemd-detect-virt: command not found")
    remote.reply("p2p: dmi", exit_code=1, stderr=read(H200_VM / "dmi-ls.txt"))
    remote.reply("p2p: cpuinfo hypervisor", stdout="16\n")
    remote.reply("p2p: cmdline", stdout=read(H200_VM / "proc-cmdline.txt"))
    remote.reply("p2p: kernel log", stdout=read(H200_VM / "dmesg-hypervisor-lines.txt"))
    remote.reply("p2p: links", stdout=read(H200_VM / "nvidia-smi-query.csv"))
    remote.reply("p2p: NCCL topology dump", stdout=read(H200_VM / "nccl-topo-dump.xml"))
    return remote


def composed_node() -> FakeRemote:
    remote = FakeRemote("root@pve1:22")
    remote.reply("node: cmdline", stdout=read(COMPOSED / "proc-cmdline.txt"))
    remote.reply("node: iommu groups", stdout=read(COMPOSED / "iommu-groups-find.txt"))
    remote.reply("node: lspci -t", stdout=read(COMPOSED / "lspci-t.txt"))
    remote.reply("node: lspci -vvv", stdout=read(COMPOSED / "lspci-vvv.txt"))
    remote.reply("node: qm config", stdout=read(COMPOSED / "qm-config-no-clique.conf"))
    return remote
