"""The per-pair GPU copy measurement: deploy_lib/host_scripts/p2p_measure.py run by the release venv's python on
the host under `timeout`, its JSON report parsed (bandwidth per size, the latency of a 4-byte copy, every element
compared), and where a pair's copies disagree with the driver's P2P verdict for it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ANY_EXIT

SCRIPT_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("p2p_measure.py").read_text(encoding="utf-8")
DEFAULT_SIZES = (1 << 20, 64 << 20, 256 << 20)
DEADLINE_S = 240  # 8 GPUs are 56 ordered pairs, each well under a second even through host memory
TIMED_OUT = frozenset({124, 137})  # timeout(1): the deadline passed (137: killed after the grace period)
NO_PYTHON = 127  # timeout(1) could not run the venv's python


@dataclass(frozen=True)
class PairMeasure:
    src: int
    dst: int
    peer_access: bool
    loopback: bool  # one GPU: the device-local copy on GPU0, the ceiling a peer copy is compared with
    gbps: tuple[tuple[int, float], ...]  # (size in bytes, GB/s)
    latency_us: float
    wrong: tuple[str, ...]

    @property
    def sums_verified(self) -> bool:
        """Every element of every copy arrived as sent."""
        return not self.wrong

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
    skipped: str | None = None  # why the script was not run at all (one GPU)

    def summary(self) -> str:
        """One line for the peer-to-peer section: measured, skipped and why, or not run and why."""
        if self.skipped:
            return f"P2P measurement skipped: {self.skipped}"
        if self.error:
            return f"P2P measurement not run: {self.error}"
        if not self.pairs:
            return f"P2P measurement: {len(self.gpus)} GPU, no pair to measure"
        sizes = ", ".join(_mib(size) for size, _ in self.pairs[0].gbps)
        wrong = sum(1 for pair in self.pairs if pair.wrong)
        return (f"P2P measurement: {len(self.pairs)} directed copies between {len(self.gpus)} GPUs at {sizes}, "
                + (f"{wrong} with WRONG elements" if wrong else "every element verified"))

    def lines(self) -> list[str]:
        if self.skipped or self.error or not self.pairs:
            return [self.summary()]
        return [pair.line() for pair in self.pairs]

    def of_pair(self, pair: tuple[int, int]) -> tuple[PairMeasure, ...]:
        """Both directions of an unordered pair, as measured."""
        return tuple(measured for measured in self.pairs if {measured.src, measured.dst} == set(pair)
                     and not measured.loopback)


def disagreements(driver_p2p: str, measured: Sequence[PairMeasure]) -> tuple[str, ...]:
    """Where the copies contradict the driver's verdict (`driver_p2p`: nvidia-smi's read status, "OK" or a code):
    the driver says P2P but torch copies through host memory, the driver says none but torch has peer access, or a
    copy arrived wrong."""
    out = []
    for pair in measured:
        name, rate = f"GPU{pair.src} -> GPU{pair.dst}", _largest(pair)
        if driver_p2p == "OK" and not pair.peer_access:
            out.append(f"nvidia-smi reports P2P, but the copy {name} went through host memory (torch sees no peer "
                       f"access): {rate}")
        elif driver_p2p != "OK" and pair.peer_access:
            out.append(f"nvidia-smi reports {driver_p2p}, but torch has peer access {name}: {rate}")
        if pair.wrong:
            out.append(f"the copy {name} arrived WRONG ({'; '.join(pair.wrong)}): keep NCCL off P2P on this pair "
                       "(nccl.p2p_disable: true) until it copies exactly")
    return tuple(out)


def _largest(pair: PairMeasure) -> str:
    size, rate = pair.gbps[-1] if pair.gbps else (0, 0.0)
    return f"{rate:.1f} GB/s at {_mib(size)}"


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


def measure_step(python: str, sizes: Sequence[int] = DEFAULT_SIZES, loopback: bool = False,
                 deadline_s: int = DEADLINE_S) -> Step:
    """The script on stdin under the venv's python, ended by timeout(1) at `deadline_s` (127: no python there);
    every exit is read, so a crashed measurement is reported in the section, never a failed gpu-check."""
    config = json.dumps({"sizes": list(sizes), "loopback": loopback})
    program = f"{SCRIPT_SOURCE}\nrun_measure_and_print({config!r})\n"
    return Step("p2p measure", ("timeout", "--kill-after=10", str(deadline_s), python, "-"), sudo=True,
                stdin=program.encode(), ok=ANY_EXIT, timeout_s=deadline_s + 60)


def parse_measure_result(result: StepResult) -> Measurement:
    if result.exit_code == NO_PYTHON:
        return Measurement("the release's venv has no python (needs torch with CUDA)")
    if result.exit_code in TIMED_OUT:
        deadline = result.step.argv[2] if isinstance(result.step, Step) else "?"
        return Measurement(f"the copies did not finish within {deadline} s (ended by timeout)")
    try:
        return parse_measure_output(json.loads(result.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, KeyError) as exc:
        return Measurement(f"the measurement printed no result ({exc}): {(result.stderr or result.stdout)[-300:]}")
