"""What the Proxmox node says about the GPUs it passes through: IOMMU flags on its kernel command line, ACS control
of the PCIe ports (`lspci -vvv`), the PCI tree (`lspci -t`), the IOMMU groups, and the VM's `qm config`
(`hostpciN`, `args` with or without `x-nv-gpudirect-clique`). Pure parsers of those outputs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BDF = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")
# ACS control bits that send peer-to-peer requests / completions up to the root complex (PCIe base spec, ACS)
REDIRECT_BITS = ("ReqRedir", "CmpltRedir")
ACS_FLAG = re.compile(r"(\w+)([+-])")
CLIQUE = re.compile(r"-set\s+device\.hostpci(\d+)\.x-nv-gpudirect-clique=(\d+)")


def normalize_bdf(text: str) -> str:
    """"41:00.0" / "0000:41:00.0" / "41:00" -> "0000:41:00.0" (a bare slot means its function 0)."""
    match = BDF.match(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a PCI address (domain:bus:device.function)")
    domain, bus, device, function = match.groups()
    return f"{domain or '0000'}:{bus}:{device}.{function or '0'}"


@dataclass(frozen=True)
class IommuFlags:
    intel_iommu: str | None  # "on", "off" or None when not given
    amd_iommu: str | None
    passthrough: bool  # iommu=pt
    acs_override: str | None  # pcie_acs_override= (a patched kernel's option that only splits IOMMU groups)
    pci_noacs: bool

    def mode(self, groups_present: bool) -> str:
        """"pass-through", "off" or "translated": what the IOMMU does with DMA of host-owned devices."""
        if self.passthrough:
            return "pass-through"
        if "off" in (self.intel_iommu, self.amd_iommu) or not groups_present:
            return "off"
        return "translated"


def parse_cmdline(cmdline: str) -> IommuFlags:
    words = {key: value for key, _, value in (word.partition("=") for word in cmdline.split())}
    pci_options = words.get("pci", "").split(",")
    return IommuFlags(words.get("intel_iommu"), words.get("amd_iommu"), words.get("iommu") == "pt",
                      words.get("pcie_acs_override"), "noacs" in pci_options)


@dataclass(frozen=True)
class PciDevice:
    bdf: str
    description: str
    acs_control: dict[str, bool] | None = None  # None: no ACS capability shown
    capabilities_hidden: bool = False  # `lspci` without root prints "Capabilities: <access denied>"
    driver: str | None = None

    @property
    def redirects(self) -> tuple[str, ...]:
        return tuple(bit for bit in REDIRECT_BITS if (self.acs_control or {}).get(bit))


def parse_acs_flags(line: str) -> dict[str, bool]:
    """"ACSCtl: SrcValid+ TransBlk- ReqRedir+ ..." -> {"SrcValid": True, "TransBlk": False, ...}."""
    return {name: sign == "+" for name, sign in ACS_FLAG.findall(line.split(":", 1)[1])}


def parse_lspci_vvv(text: str) -> dict[str, PciDevice]:
    """`lspci -vvv` (or -vv, or an edited excerpt of it): each device's ACS control and driver, by address."""
    devices: dict[str, PciDevice] = {}
    header = re.compile(r"^((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (.*)$")
    current: dict[str, object] | None = None

    def close() -> None:
        if current is not None:
            devices[str(current["bdf"])] = PciDevice(**current)  # type: ignore[arg-type]

    for line in text.splitlines():
        if match := header.match(line):
            close()
            current = {"bdf": normalize_bdf(match.group(1)), "description": match.group(2).strip()}
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("ACSCtl:"):
            current["acs_control"] = parse_acs_flags(stripped)
        elif stripped.startswith("Capabilities: <access denied>"):
            current["capabilities_hidden"] = True
        elif stripped.startswith("Kernel driver in use:"):
            current["driver"] = stripped.split(":", 1)[1].strip()
    close()
    return devices


TREE_ROOT = re.compile(r"\[([0-9a-f]{4}):([0-9a-f]{2})\]")
TREE_NODE = re.compile(r"(?<![0-9a-f:\[])([0-9a-f]{2})\.([0-7])(?:-\[([0-9a-f]{2})(?:-[0-9a-f]{2})?\])?")


@dataclass(frozen=True)
class PciTree:
    upstream: dict[str, tuple[str, ...]]  # device -> its bridges, root port first
    root_bus: dict[str, str]  # device -> "0000:40": the root bus (host bridge) it hangs from

    def path_ports(self, a: str, b: str) -> tuple[str, ...]:
        """The bridges a peer-to-peer transfer between a and b crosses (those not upstream of both)."""
        up_a, up_b = self.upstream.get(a, ()), self.upstream.get(b, ())
        return tuple([port for port in up_a if port not in up_b] + [port for port in up_b if port not in up_a])


def parse_lspci_tree(text: str) -> PciTree:
    """`lspci -t` (or -tv): the chain of bridges above every device, and the root bus each one hangs from."""
    upstream: dict[str, tuple[str, ...]] = {}
    root_bus: dict[str, str] = {}
    # open buses as (column, domain, bus, bridges above it, root bus); a token belongs to the nearest bus left of it
    open_buses: list[tuple[int, str, str, tuple[str, ...], str]] = []
    for line in text.splitlines():
        tree_part = re.split(r"\s{2}(?=[A-Za-z])", line, maxsplit=1)[0]  # -tv: drop the names after two spaces
        tokens = sorted([(m.start(), "root", m) for m in TREE_ROOT.finditer(tree_part)]
                        + [(m.start(), "node", m) for m in TREE_NODE.finditer(tree_part)], key=lambda t: t[0])
        for column, kind, match in tokens:
            while open_buses and open_buses[-1][0] >= column:
                open_buses.pop()
            if kind == "root":
                open_buses.append((column, match.group(1), match.group(2), (), f"{match.group(1)}:{match.group(2)}"))
                continue
            if not open_buses:
                raise ValueError(f"lspci -t: device {match.group(0)!r} before any [domain:bus] root")
            _, domain, bus, above, root = open_buses[-1]
            bdf = f"{domain}:{bus}:{match.group(1)}.{match.group(2)}"
            upstream[bdf], root_bus[bdf] = above, root
            if match.group(3):
                open_buses.append((column, domain, match.group(3), (*above, bdf), root))
    if not upstream:
        raise ValueError("lspci -t printed no devices")
    return PciTree(upstream, root_bus)


def parse_iommu_groups(find_output: str) -> dict[str, int]:
    """`find /sys/kernel/iommu_groups -mindepth 3 -maxdepth 3`: device -> group number (empty: no IOMMU)."""
    groups = {}
    for line in find_output.splitlines():
        parts = line.strip().split("/")
        if len(parts) >= 6 and parts[-2] == "devices" and parts[-3].isdigit():
            groups[normalize_bdf(parts[-1])] = int(parts[-3])
    return groups


@dataclass(frozen=True)
class HostPci:
    index: int
    devices: tuple[str, ...]  # host addresses, normalized
    options: dict[str, str]
    bare_slot: bool  # "0000:41:00" without a function: all functions, where the clique hint is lost
    mapping: str | None = None  # "mapping=NAME": a cluster resource mapping, resolved on the node


@dataclass(frozen=True)
class QmConfig:
    hostpci: dict[int, HostPci]
    args: str | None
    cliques: dict[int, int]  # hostpci index -> clique id, from `args`
    cpu: str | None
    other: dict[str, str] = field(default_factory=dict)

    @property
    def cpu_hidden(self) -> bool:
        """`cpu: host,hidden=1` makes QEMU emit kvm=off, and the driver then skips the hypervisor's P2P hint."""
        return "hidden=1" in (self.cpu or "").split(",")


def _names_function(address: str) -> bool:
    match = BDF.match(address.strip().lower())
    return match is not None and match.group(4) is not None


def parse_qm_config(text: str) -> QmConfig:
    """`qm config VMID`: one `key: value` per line (the running config; a [snapshot] section ends it)."""
    entries: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("["):
            break
        if ":" in line and not line.startswith("#"):
            key, value = line.split(":", 1)
            entries[key.strip()] = value.strip()
    hostpci = {}
    for key, value in entries.items():
        if not (match := re.fullmatch(r"hostpci(\d+)", key)):
            continue
        first, *rest = value.split(",")
        options = {key: value for key, _, value in (item.partition("=") for item in rest)}
        if first.startswith("mapping="):
            hostpci[int(match.group(1))] = HostPci(int(match.group(1)), (), options, False, first.split("=", 1)[1])
            continue
        addresses = first.removeprefix("host=").split(";")
        bare = any(not _names_function(address) for address in addresses)
        hostpci[int(match.group(1))] = HostPci(int(match.group(1)), tuple(normalize_bdf(a) for a in addresses),
                                               options, bare)
    args = entries.get("args")
    cliques = {int(index): int(clique) for index, clique in CLIQUE.findall(args or "")}
    known = {"args", "cpu", *(f"hostpci{i}" for i in hostpci)}
    return QmConfig(dict(sorted(hostpci.items())), args, cliques, entries.get("cpu"),
                    {k: v for k, v in entries.items() if k not in known})
