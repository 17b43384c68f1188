"""Each GPU's PCIe link as the VM sees it (`nvidia-smi --query-gpu=...pcie.link...`, sysfs current_link_*) and as
NCCL saw it (the NCCL_TOPO_DUMP_FILE XML). A width of 0 is a VM sign (NVIDIA/nccl#428): NCCL reads the link from
the emulated PCI tree, which has none, while nvidia-smi asks the GPU itself."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

# transfer rate per lane -> PCIe generation (PCI-SIG: 2.5, 5, 8, 16, 32, 64 GT/s)
GEN_OF_SPEED = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
SPEED = re.compile(r"([\d.]+)\s*GT/s")
NVIDIA_VENDOR = "0x10de"


@dataclass(frozen=True)
class GpuLink:
    bus_id: str  # as the source wrote it, lower case ("00000000:00:06.0" from nvidia-smi, "0000:00:06.0" elsewhere)
    gen: int | None
    width: int | None
    source: str  # "nvidia-smi", "sysfs", "NCCL topology"
    gen_max: int | None = None
    width_max: int | None = None
    index: int | None = None

    def text(self) -> str:
        gen = f"gen {self.gen}" if self.gen is not None else "gen ?"
        width = f"x{self.width}" if self.width is not None else "x?"
        return f"{self.bus_id} {gen} {width} ({self.source})"


def generation(speed_text: str) -> int | None:
    """"32.0 GT/s PCIe" -> 5; "" or "Unknown" -> None."""
    match = SPEED.search(speed_text)
    return GEN_OF_SPEED.get(float(match.group(1))) if match else None


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_nvidia_smi_links(csv_text: str) -> list[GpuLink]:
    """`nvidia-smi --query-gpu=index,pci.bus_id,pcie.link.gen.current,... --format=csv`, columns found by header."""
    lines = [line for line in csv_text.splitlines() if line.strip()]
    if not lines or "pci.bus_id" not in lines[0]:
        raise ValueError("no nvidia-smi CSV header with pci.bus_id")
    header = [cell.strip() for cell in lines[0].split(",")]
    links = []
    for line in lines[1:]:
        row = dict(zip(header, (cell.strip() for cell in line.split(",")), strict=False))
        links.append(GpuLink(row["pci.bus_id"].lower(), _int(row.get("pcie.link.gen.current", "")),
                             _int(row.get("pcie.link.width.current", "")), "nvidia-smi",
                             _int(row.get("pcie.link.gen.max", "")), _int(row.get("pcie.link.width.max", "")),
                             _int(row.get("index", ""))))
    return links


def parse_sysfs_link(bus_id: str, speed_text: str, width_text: str) -> GpuLink:
    """/sys/bus/pci/devices/BDF/current_link_speed and current_link_width (absent files read as "")."""
    return GpuLink(bus_id.lower(), generation(speed_text), _int(width_text), "sysfs")


def parse_topo_dump(xml_text: str) -> list[GpuLink]:
    """NCCL's topology dump: each <pci> holding a <gpu>, with the link_speed / link_width NCCL read."""
    try:
        root = ElementTree.fromstring(xml_text)
    except ElementTree.ParseError as exc:
        raise ValueError(f"NCCL topology dump is not XML ({exc})") from None
    links = []
    for pci in root.iter("pci"):
        gpu = pci.find("gpu")
        if gpu is None:
            continue
        links.append(GpuLink(pci.get("busid", "").lower(), generation(pci.get("link_speed", "")),
                             _int(pci.get("link_width", "")), "NCCL topology", index=_int(gpu.get("dev", ""))))
    return links


def vm_signs(links: list[GpuLink]) -> list[str]:
    """Links that read width 0 or no speed: what an emulated PCI tree shows."""
    return [f"{link.source} reads {link.bus_id} at width {link.width}" + ("" if link.gen else " with no link speed")
            for link in links if link.width == 0 or (link.source == "NCCL topology" and link.gen is None)]
