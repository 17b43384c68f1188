"""The verified all-reduce: deploy_lib/host_scripts/gpu_check.py run by the venv's python on the host, the sizes it
sends, and its JSON report parsed (a wrong sum names the GPU pair and the size)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from deploy_lib.errors import ConfigError
from deploy_lib.remote import Step, StepResult

SCRIPT_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("gpu_check.py").read_text(encoding="utf-8")
DEFAULT_SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)  # 1 KiB .. 256 MiB


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
