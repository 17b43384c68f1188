"""The per-pair GPU copy measurement: deploy_lib/gpu_check/p2p/measure_script.py run by the release venv's python on
the host, and its JSON report parsed (bandwidth per size, the latency of a 4-byte copy, every element compared)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from deploy_lib.remote import Step, StepResult

SCRIPT_SOURCE = resources.files("deploy_lib.gpu_check.p2p").joinpath("measure_script.py").read_text(encoding="utf-8")
DEFAULT_SIZES = (1 << 20, 64 << 20, 256 << 20)


@dataclass(frozen=True)
class PairMeasure:
    src: int
    dst: int
    peer_access: bool
    loopback: bool  # one GPU: the device-local copy on GPU0, the ceiling a peer copy is compared with
    gbps: tuple[tuple[int, float], ...]  # (size in bytes, GB/s)
    latency_us: float
    wrong: tuple[str, ...]

    def line(self) -> str:
        name = f"GPU{self.src} (device-local copy)" if self.loopback else f"GPU{self.src} -> GPU{self.dst}"
        access = "" if self.loopback else (", peer access" if self.peer_access else ", no peer access (via host)")
        rates = ", ".join(f"{_mib(size)} {rate:.1f} GB/s" for size, rate in self.gbps)
        verdict = "every element as sent" if not self.wrong else "WRONG: " + "; ".join(self.wrong)
        return f"{name}{access}: {rates}; 4-byte copy {self.latency_us:.1f} us; {verdict}"


def _mib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"


@dataclass(frozen=True)
class Measurement:
    error: str | None
    gpus: tuple[str, ...] = ()
    pairs: tuple[PairMeasure, ...] = ()

    def lines(self) -> list[str]:
        if self.error:
            return [f"P2P measurement not run: {self.error}"]
        if not self.pairs:
            return [f"P2P measurement: {len(self.gpus)} GPU, no pair to measure"]
        return [pair.line() for pair in self.pairs]


def parse_measure_output(payload: dict[str, Any]) -> Measurement:
    if payload.get("error"):
        return Measurement(str(payload["error"]))
    pairs = tuple(PairMeasure(int(p["src"]), int(p["dst"]), bool(p["peer_access"]), bool(p.get("loopback")),
                              tuple((int(s["size_bytes"]), float(s["gbps"])) for s in p["sizes"]),
                              float(p["latency_us"]),
                              tuple(f"{_mib(int(w['size_bytes']))}: element {w['element']} expected {w['expected']}, "
                                    f"got {w['got']} ({w['count']} wrong)" for w in p.get("wrong") or ()))
                  for p in payload.get("pairs") or ())
    return Measurement(None, tuple(payload.get("gpus") or ()), pairs)


def measure_step(python: str, sizes: Sequence[int] = DEFAULT_SIZES, loopback: bool = False) -> Step:
    """The script on stdin under the venv's python (127: no python there)."""
    config = json.dumps({"sizes": list(sizes), "loopback": loopback})
    program = f"{SCRIPT_SOURCE}\nrun_measure_and_print({config!r})\n"
    return Step("p2p measure", (python, "-"), sudo=True, stdin=program.encode(), ok=frozenset({0, 127}), timeout_s=300)


def parse_measure_result(result: StepResult) -> Measurement:
    if result.exit_code == 127:
        return Measurement("the release's venv has no python (needs torch with CUDA)")
    try:
        return parse_measure_output(json.loads(result.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, KeyError) as exc:
        return Measurement(f"the measurement printed no result ({exc}): {(result.stderr or result.stdout)[-300:]}")
