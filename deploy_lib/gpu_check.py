"""gpu-check: the GPUs' topology and peer-to-peer support, NCCL advice from them, and a verified all-reduce.

Pure parts (parsers of `nvidia-smi topo -m` / `topo -p2p r|w`, the advisor, the report of the all-reduce script's
JSON) are tested on real recorded output; `check_host` is the one place that runs steps. The all-reduce runs
on the host as deploy_lib/gpu_check_script.py under the release venv's python, with the release's NCCL
environment; it needs torch with CUDA there and says so when it is missing, never faking a result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts import read_host_facts
from deploy_lib.profile import LoadedProfile, ParallelSpec, read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.project import Target
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.server_args import launch_environment
from deploy_lib.store import host_lock

SCRIPT_SOURCE = resources.files("deploy_lib").joinpath("gpu_check_script.py").read_text(encoding="utf-8")
DEFAULT_SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)  # 1 KiB .. 256 MiB
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


SIZE_UNITS = {"": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}
SIZE_TEXT = re.compile(r"^(\d+)\s*([A-Za-z]*)$")
MAX_SIZE = 4 << 30


def parse_sizes(texts: Sequence[str]) -> tuple[int, ...]:
    """`--sizes` values (bytes, or with K/KiB, M/MiB, G/GiB) -> bytes, multiples of 4 (float32 elements)."""
    sizes = []
    for text in texts:
        match = SIZE_TEXT.match(text.strip())
        unit = SIZE_UNITS.get(match.group(2).upper()) if match else None
        if match is None or unit is None:
            raise ConfigError(f"--sizes {text!r} is not a size", "give bytes, or a number with K, M or G (KiB, MiB)")
        size = int(match.group(1)) * unit
        if not 4 <= size <= MAX_SIZE or size % 4:
            raise ConfigError(f"--sizes {text!r} is {size} bytes; each size must be a multiple of 4 from 4 bytes "
                              f"to {MAX_SIZE >> 30} GiB")
        sizes.append(size)
    return tuple(sorted(set(sizes))) or DEFAULT_SIZES


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
    ok = frozenset(range(256))
    return [Step("topology", ("nvidia-smi", "topo", "-m"), ok=ok, timeout_s=30),
            Step("p2p read", ("nvidia-smi", "topo", "-p2p", "r"), ok=ok, timeout_s=30),
            Step("p2p write", ("nvidia-smi", "topo", "-p2p", "w"), ok=ok, timeout_s=30)]


def parse_topology_results(results: Sequence[StepResult]) -> tuple[Topology | None, str | None]:
    if any(r.exit_code == 127 for r in results):
        return None, "nvidia-smi not found on the host"
    failed = next((r for r in results if r.exit_code != 0), None)
    if failed is not None:
        return None, f"`{' '.join(failed.step.argv)}` exited {failed.exit_code}"
    try:
        return parse_topology(*(r.stdout for r in results)), None
    except ValueError as exc:
        return None, f"nvidia-smi topo printed no GPU matrix ({exc})"


# ---------------------------------------------------------------------------------------------------------
# the all-reduce check


@dataclass(frozen=True)
class SizeResult:
    size_bytes: int
    algbw_gbps: float
    busbw_gbps: float
    wrong: tuple[str, ...]  # "rank R: element ...": a verification failure


@dataclass(frozen=True)
class CheckResult:
    world_size: int
    error: str | None
    gpus: tuple[str | None, ...] = ()
    sizes: tuple[SizeResult, ...] = ()
    transports: dict[str, int] = field(default_factory=dict)  # "P2P/CUMEM" -> channel connections using it
    nccl_version: str | None = None
    hung: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # ranks that exited with an error (NCCL's, CUDA's) before the end
    verified: bool = False

    def summary(self) -> str:
        """One line for a deploy's progress: verified or not, the transports and the largest size's bandwidth."""
        transports = ", ".join(self.transports) or "no transport reported"
        largest = f"; busbw {self.sizes[-1].busbw_gbps:.1f} GB/s at {_size(self.sizes[-1].size_bytes)}" \
            if self.sizes else ""
        verdict = "verified exactly at every size" if self.verified else "FAILED"
        return f"all-reduce over {self.world_size} GPUs {verdict} ({transports}{largest})"

    def lines(self) -> list[str]:
        """The report a user reads: transports, a row per size, and every failure named."""
        if self.error:
            return [f"all-reduce not run: {self.error}"]
        out = [f"NCCL {self.nccl_version or '?'}, {self.world_size} ranks on {', '.join(map(str, self.gpus))}",
               "transports: " + (", ".join(f"{via} ({n} channel links)" for via, n in self.transports.items())
                                 or "none reported")]
        out += [f"{_size(s.size_bytes):>8}: algbw {s.algbw_gbps:8.2f} GB/s, busbw {s.busbw_gbps:8.2f} GB/s"
                + ("" if not s.wrong else "  WRONG RESULT") for s in self.sizes]
        out += [f"verification failed at {_size(s.size_bytes)}: {w}" for s in self.sizes for w in s.wrong]
        out += [f"error: {f}" for f in self.failed]
        out += [f"hang: {h}" for h in self.hung]
        out.append("all-reduce verified exactly at every size" if self.verified else "all-reduce check FAILED")
        return out


def _size(size_bytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes} B"


def parse_check_output(payload: Mapping[str, Any]) -> CheckResult:
    """The script's JSON object -> CheckResult; a wrong sum names the GPU pair (ring neighbours) and the size."""
    world = int(payload.get("world_size") or 0)
    if payload.get("error"):
        return CheckResult(world, str(payload["error"]))
    gpus = tuple(payload.get("gpus") or ())
    transports: dict[str, int] = {}
    for link in payload.get("transports") or ():
        transports[str(link["via"])] = transports.get(str(link["via"]), 0) + 1
    sizes = tuple(SizeResult(int(s["size_bytes"]), float(s["algbw_gbps"]), float(s["busbw_gbps"]),
                             tuple(f"GPU{w['rank']} (received from GPU{(int(w['rank']) - 1) % world}): "
                                   f"{w['detail']}" for w in s.get("wrong") or ()))
                  for s in payload.get("sizes") or ())
    hung = tuple(f"rank {h['rank']} (GPU{h['rank']}) did not finish: {h['where']}" for h in payload.get("hung") or ())
    failed = tuple(_rank_error(f) for f in payload.get("failed") or ())
    return CheckResult(world, None, gpus, sizes, transports, payload.get("nccl_version"), hung, failed,
                       bool(payload.get("verified")))


def _rank_error(report: Mapping[str, Any]) -> str:
    """A rank that exited by itself: its exit status, its error and NCCL's first warning."""
    code = report.get("exit_code")
    status = f"killed by signal {-int(code)}" if isinstance(code, int) and code < 0 else f"exited {code}"
    detail = re.sub(r"^\[rank\d+\]:\s*", "", str(report.get("error") or "")) or \
        "; ".join(report.get("log_tail") or ()) or "no output"
    warning = next(iter(report.get("nccl_warnings") or ()), None)
    nccl = f" (NCCL WARN {warning.split('NCCL WARN', 1)[1].strip()})" if warning else ""
    return f"rank {report['rank']} (GPU{report['rank']}) {status} {report['where']}: {detail}{nccl}"


def check_step(python: str, world_size: int, environment: Mapping[str, str], sizes: Sequence[int],
               deadline_s: float) -> Step:
    """The all-reduce script under the release venv's python; workers re-run the same source with `-c`."""
    config = {"world_size": world_size, "sizes": list(sizes), "env": dict(environment), "deadline_s": deadline_s}
    program = f"{SCRIPT_SOURCE}\nrun_check_and_print({json.dumps(config)!r}, {SCRIPT_SOURCE!r})\n"
    return Step("all-reduce check", (python, "-"), sudo=True, stdin=program.encode(), ok=frozenset({0, 127}),
                timeout_s=deadline_s + 180)


def parse_check_result(result: StepResult, world_size: int) -> CheckResult:
    if result.exit_code == 127:
        return CheckResult(world_size, "the release's venv has no python (needs torch with CUDA)")
    try:
        return parse_check_output(json.loads(result.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, KeyError) as exc:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return CheckResult(world_size, f"the check printed no result ({exc}): {tail}")


@dataclass(frozen=True)
class CheckSubject:
    """What the check runs with: a release's (or a profile's) venv, TP size and non-secret environment."""

    source: str  # "release 1a2b3c4d5e6f" or "profile glm5-nvfp4"
    venv: str
    world_size: int
    environment: dict[str, str]


def ranks_on_this_node(parallel: ParallelSpec) -> int:
    """One rank per GPU of a TP group, on this host's GPUs: a TP group spread over nodes checks this node's part."""
    return min(parallel.tp, parallel.gpus_per_node)


def subject_of_release(release_id: str, metadata: Mapping[str, Any]) -> CheckSubject:
    """A release as release.json records it (a deploy's new release: its metadata())."""
    return CheckSubject(f"release {release_id}", str(metadata["venv"]),
                        ranks_on_this_node(read_stored_profile(metadata.get("profile")).parallel),
                        dict(metadata.get("environment") or {}))


def subject_of_profile(loaded: LoadedProfile) -> CheckSubject:
    profile = loaded.profile
    return CheckSubject(f"profile {loaded.name}", profile.service.venv, ranks_on_this_node(profile.parallel),
                        launch_environment(profile))


@dataclass(frozen=True)
class GpuCheckReport:
    subject: CheckSubject
    topology: Topology | None
    topology_error: str | None
    advice: Advice | None
    check: CheckResult


def venv_python(venv: str) -> str:
    return str(PurePosixPath(venv) / "bin" / "python3")


def subject_step(subject: CheckSubject, sizes: Sequence[int], deadline_s: float) -> Step:
    return check_step(venv_python(subject.venv), subject.world_size, subject.environment, sizes, deadline_s)


def check_host(remote: Remote, progress: Progress, subject: CheckSubject, sizes: Sequence[int] = DEFAULT_SIZES,
               deadline_s: float = 300) -> GpuCheckReport:
    """Topology + advice, then the all-reduce; the GPUs must already be free (the caller stops the server)."""
    progress.phase_started("topology")
    topology, topology_error = parse_topology_results(remote.run(topology_steps()))
    if topology is not None and topology.gpu_count < subject.world_size:
        raise PreflightError(f"{subject.source} runs TP {subject.world_size} but the host has "
                             f"{topology.gpu_count} GPUs")
    advice = advise(topology, subject.environment) if topology else None
    progress.phase_started(f"all-reduce over {subject.world_size} GPUs")
    [result] = remote.run([subject_step(subject, sizes, deadline_s)])
    return GpuCheckReport(subject, topology, topology_error, advice, parse_check_result(result, subject.world_size))


def run_gpu_check(target: Target, service: str, remote: Remote, progress: Progress, loaded: LoadedProfile | None,
                  stop_server: bool, environ: Mapping[str, str], sizes: Sequence[int] = DEFAULT_SIZES
                  ) -> GpuCheckReport:
    """gpu-check on one host: refuse while the server holds the GPUs unless told to stop it; then restart the
    current release through the readiness ladder (deploy.start), whatever the check found."""
    from deploy_lib import deploy  # here: deploy imports this module for preflight.gpu_check

    layout = target.layout(service)
    facts = read_host_facts(remote, layout, venv=None, port=None)
    record = facts.store.release(facts.store.current) if facts.store.current else None
    if loaded is not None:
        subject = subject_of_profile(loaded)
    elif record is not None:
        subject = subject_of_release(record.id, record.metadata)
    else:
        raise ConfigError(f"{target.host.name}: no release is deployed for {service}, so there is no venv or NCCL "
                          "environment to check with", "give --profile P")
    running = facts.unit.active_state in ("active", "activating", "reloading")
    if running and not stop_server:
        raise PreflightError(f"{target.host.name}: {layout.unit_name} is running and holds the GPUs; the check needs "
                             "them free", "`invoke gpu-check --stop-server` stops it and restarts the current release "
                             "through the readiness ladder afterwards")
    # held from the stop to the restart, so no deploy starts a server on the GPUs while the check runs
    with host_lock(remote, layout, "gpu-check", target.host.name):
        if running:
            progress.note(f"stopping {layout.unit_name} for the check")
            deploy.stop(target, service, remote)
        try:
            return check_host(remote, progress, subject, sizes)
        finally:
            if running:
                progress.note(f"restarting {layout.unit_name}")
                deploy.start(target, service, remote, progress, environ, restart=False)


# ---------------------------------------------------------------------------------------------------------
# in a deploy (preflight.gpu_check): when it runs, and the batch that runs it

# what the all-reduce depends on besides the GPUs and the venv: NCCL's variables, torch's for NCCL, the GPUs a rank sees
CHECKED_ENV = re.compile(r"^(?:NCCL_|TORCH_NCCL_)|^CUDA_VISIBLE_DEVICES$")
REPORT_PREFIX = "gpu-check: "  # the report's lines as deploy's diagnosis reads them (diagnose.py: nccl_check)


def checked_setup(metadata: Mapping[str, Any]) -> dict[str, str | None]:
    """What a passed check proves of a release, from its release.json: TP size, torch, NCCL, NCCL environment."""
    environment = {f"env {name}": str(value) for name, value in sorted(dict(metadata.get("environment") or {}).items())
                   if CHECKED_ENV.match(name)}
    return {"TP": str(read_stored_profile(metadata.get("profile")).parallel.tp),
            "torch": metadata.get("torch_version"), "NCCL": metadata.get("nccl_version"), **environment}


def check_reasons(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> tuple[str, ...]:
    """Why a deploy from `current` to `new` (release.json forms) runs the check: what differs; () when nothing."""
    if current is None:
        return ("no current release to compare with",)
    before, after = checked_setup(current), checked_setup(new)
    return tuple(f"{key} {before.get(key) or '(none)'} -> {after.get(key) or '(none)'}"
                 for key in dict.fromkeys([*before, *after]) if before.get(key) != after.get(key))


def check_batch(subject: CheckSubject, sizes: Sequence[int] = DEFAULT_SIZES, deadline_s: float = 300) -> list[Step]:
    """Topology and the all-reduce in one round trip (the GPUs already free); read_check_batch reads it."""
    return [*topology_steps(), subject_step(subject, sizes, deadline_s)]


def read_check_batch(subject: CheckSubject, results: Sequence[StepResult]) -> GpuCheckReport:
    """check_batch's results (its last four) -> the report."""
    *topology_results, check = results[-4:]
    topology, topology_error = parse_topology_results(topology_results)
    advice = advise(topology, subject.environment) if topology else None
    return GpuCheckReport(subject, topology, topology_error, advice, parse_check_result(check, subject.world_size))
