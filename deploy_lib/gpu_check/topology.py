"""The GPUs' topology from `nvidia-smi topo -m` and `topo -p2p r|w`, and the NCCL advice it gives
(NCCL_P2P_LEVEL, or NCCL_P2P_DISABLE where the driver reports peer-to-peer not supported)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ANY_EXIT

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GPU_NAME = re.compile(r"^GPU(\d+)$")
# nvidia-smi's link types, nearest first; NCCL_P2P_LEVEL's names for the same distances (NODE counts as PHB:
# both cross a PCIe host bridge inside one NUMA node).
LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
LEVEL_FOR_LINK = {"NV": "NVL", "PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
# NCCL_P2P_LEVEL: how far P2P may reach (the NCCL environment-variable docs; integers are the legacy spelling,
# above 4 meaning SYS)
LEVEL_REACH = {"LOC": -1, "NVL": 0, "PIX": 1, "PXB": 2, "PHB": 3, "SYS": 5}
LEGACY_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS", "5": "SYS"}
P2P_STATUS = {"OK": "supported", "CNS": "chipset not supported", "GNS": "GPU not supported",
              "TNS": "topology not supported", "NS": "not supported", "U": "unknown"}


def _link_rank(link: str) -> int:
    return LINK_ORDER.index("NV" if link.startswith("NV") else link)


def parse_gpu_matrix(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -m` or `topo -p2p r|w`: {(gpu_i, gpu_j): cell} for every pair of GPUs, i != j."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    # the header's first cell is empty and each row's first cell is its name, so the columns line up
    header = next((line.split("\t") for line in lines if not line.split("\t")[0].strip()
                   and any(GPU_NAME.match(cell.strip()) for cell in line.split("\t"))), None)
    if header is None:
        raise ValueError("no GPU header line")
    columns = {i: int(m.group(1)) for i, cell in enumerate(header) if (m := GPU_NAME.match(cell.strip()))}
    matrix: dict[tuple[int, int], str] = {}
    for line in lines:
        cells = line.split("\t")
        first = GPU_NAME.match(cells[0].strip()) if cells else None
        if first is None:
            continue
        for index, gpu in columns.items():
            if index < len(cells) and gpu != int(first.group(1)):
                matrix[(int(first.group(1)), gpu)] = cells[index].strip()
    if not matrix:
        raise ValueError("no GPU rows")
    return matrix


@dataclass(frozen=True)
class Topology:
    links: dict[tuple[int, int], str]  # topo -m: NV18, PIX, PXB, PHB, NODE, SYS
    p2p_read: dict[tuple[int, int], str]  # topo -p2p r: OK, NS, CNS, ...
    p2p_write: dict[tuple[int, int], str]

    @property
    def gpu_count(self) -> int:
        return len({i for i, _ in self.links}) if self.links else 0

    def one_line(self) -> str:
        """For `status`: the links and peer-to-peer support in one line."""
        kinds = sorted({link for link in self.links.values()}, key=_link_rank)
        unsupported = self.p2p_unsupported()
        p2p = "P2P supported" if not unsupported else \
            f"P2P not supported on {len(unsupported)} of {len(self.links) // 2} pairs"
        return f"{self.gpu_count} GPUs, links {'/'.join(kinds)}, {p2p}"

    def p2p_unsupported(self) -> list[tuple[int, int, str]]:
        """Pairs (i < j) where the driver reports peer-to-peer reads or writes not supported, with the status."""
        found = []
        for (i, j), read in sorted(self.p2p_read.items()):
            if i < j:
                write = self.p2p_write.get((i, j), "U")
                bad = read if read != "OK" else write
                if bad != "OK":
                    found.append((i, j, bad))
        return found


def parse_topology(topo_m: str, p2p_read: str, p2p_write: str) -> Topology:
    return Topology(parse_gpu_matrix(topo_m), parse_gpu_matrix(p2p_read), parse_gpu_matrix(p2p_write))


@dataclass(frozen=True)
class Advice:
    environment: dict[str, str]  # what the host's NCCL settings should be
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]  # where the profile's values disagree with the host


def _profile_level(nccl_env: Mapping[str, str]) -> str | None:
    level = nccl_env.get("NCCL_P2P_LEVEL")
    return LEGACY_LEVELS.get(level, level) if level is not None else None


def advise(topology: Topology, nccl_env: Mapping[str, str]) -> Advice:
    """NCCL_P2P_LEVEL / NCCL_P2P_DISABLE for this host, and where the profile's NCCL environment disagrees."""
    unsupported = topology.p2p_unsupported()
    level, disabled = _profile_level(nccl_env), nccl_env.get("NCCL_P2P_DISABLE") == "1"
    warnings = []
    if unsupported:
        pairs = ", ".join(f"GPU{i}-GPU{j} ({P2P_STATUS.get(status, status)})" for i, j, status in unsupported[:4])
        more = f" and {len(unsupported) - 4} more" if len(unsupported) > 4 else ""
        reasons = (f"the driver reports peer-to-peer not supported between {pairs}{more}: NCCL must not use P2P "
                   "there (in a VM it can corrupt data or hang); it falls back to shared memory",)
        if not disabled and level != "LOC":
            allowed = f"NCCL_P2P_LEVEL={nccl_env['NCCL_P2P_LEVEL']} permits" if level else "NCCL's default permits"
            warnings.append(f"{allowed} P2P where the driver reports it not supported; set NCCL_P2P_DISABLE=1 "
                            "(profile: nccl.p2p_disable: true)")
        return Advice({"NCCL_P2P_DISABLE": "1"}, reasons, tuple(warnings))
    farthest = max(topology.links.values(), key=_link_rank)
    wanted = LEVEL_FOR_LINK["NV" if farthest.startswith("NV") else farthest]
    reasons = (f"peer-to-peer is supported between every pair of GPUs and the farthest link is {farthest}: "
               f"NCCL_P2P_LEVEL={wanted} lets NCCL use P2P on every pair",)
    if disabled:
        warnings.append("NCCL_P2P_DISABLE=1 turns off P2P the driver supports on every pair (slower all-reduce)")
    elif level is not None and LEVEL_REACH.get(level, 5) < LEVEL_REACH[wanted]:
        warnings.append(f"NCCL_P2P_LEVEL={nccl_env['NCCL_P2P_LEVEL']} stops P2P short of {farthest} links that "
                        f"support it; {wanted} would use them")
    return Advice({"NCCL_P2P_LEVEL": wanted}, reasons, tuple(warnings))


def topology_steps() -> list[Step]:
    # any exit is a fact for parse_topology_results (127: no nvidia-smi; a driver without `topo -p2p` prints usage)
    ok = ANY_EXIT
    return [Step("topology", ("nvidia-smi", "topo", "-m"), ok=ok, timeout_s=30),
            Step("p2p read", ("nvidia-smi", "topo", "-p2p", "r"), ok=ok, timeout_s=30),
            Step("p2p write", ("nvidia-smi", "topo", "-p2p", "w"), ok=ok, timeout_s=30)]


def parse_topology_results(results: Sequence[StepResult]) -> tuple[Topology | None, str | None]:
    if any(r.exit_code == 127 for r in results):
        return None, "nvidia-smi not found on the host"
    failed = next((r for r in results if r.exit_code != 0), None)
    if failed is not None:
        command = failed.step.argv if isinstance(failed.step, Step) else (failed.step.name,)
        return None, f"`{' '.join(command)}` exited {failed.exit_code}"
    try:
        return parse_topology(*(r.stdout for r in results)), None
    except ValueError as exc:
        return None, f"nvidia-smi topo printed no GPU matrix ({exc})"
