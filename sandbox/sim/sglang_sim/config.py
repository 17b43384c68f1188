"""Per-guest settings of the simulation: phase durations, the fault to inject, where state goes.

Read once at startup from $SGLANG_SIM_CONFIG (default /etc/sglang-sim/config.json; missing file =
defaults) and the fault from $SGLANG_SIM_FAULT (default /etc/sglang-sim/fault, one line such as
`die-after 3`), which wins over a "fault" key in the config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path("/etc/sglang-sim/config.json")
DEFAULT_FAULT = Path("/etc/sglang-sim/fault")
FAULTS = frozenset({"oom", "hang-loading", "die-after", "generation-hang", "nccl-timeout", "port-in-use"})
# seconds per startup phase; short so the sandbox starts in seconds (a real rig takes minutes). "weights" is the copy
# to the GPUs, after the shards' real read; "deep_gemm" and "triton" are paid only while their cache is cold.
DEFAULT_PHASES = {"init": 0.3, "weights": 1.0, "kv_cache": 0.3, "cuda_graph": 0.6, "warmup": 0.8,
                  "deep_gemm": 1.0, "triton": 0.4}


@dataclass(frozen=True)
class Fault:
    name: str
    count: int = 0  # die-after: requests served before dying

    @classmethod
    def parse(cls, text: str) -> Fault | None:
        words = text.split()
        if not words:
            return None
        if words[0] not in FAULTS:
            raise ValueError(f"unknown fault {words[0]!r}; known: {', '.join(sorted(FAULTS))}")
        if words[0] == "die-after":
            if len(words) != 2 or not words[1].isdigit():
                raise ValueError("fault die-after needs a request count, e.g. `die-after 3`")
            return cls(words[0], int(words[1]))
        return cls(words[0])


@dataclass(frozen=True)
class SimConfig:
    phases_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PHASES))
    fault: Fault | None = None
    throughput_scale: float = 1.0  # multiplies every rate; > 1 makes long tests quicker
    nccl_timeout_s: float = 2.0    # how long the warmup hangs before the NCCL watchdog fires
    rendezvous_timeout_s: float = 60.0  # how long a multi-node rank waits for the others at --dist-init-addr
    state_dir: Path = Path("/dev/shm/sglang-sim")  # read by the nvidia-smi stand-in
    architecture: str = "GlmMoeDsaForCausalLM"
    context_length: int = 202752

    @classmethod
    def load(cls, environ: dict[str, str] | None = None) -> SimConfig:
        env = os.environ if environ is None else environ
        config_path = Path(env.get("SGLANG_SIM_CONFIG", DEFAULT_CONFIG))
        raw: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        unknown = set(raw) - set(SCALAR_KEYS) - {"phases_s", "fault", "gpus"}
        if unknown:
            raise ValueError(f"{config_path}: unknown keys {sorted(unknown)}")
        fault_path = Path(env.get("SGLANG_SIM_FAULT", DEFAULT_FAULT))
        fault_text = fault_path.read_text() if fault_path.exists() else raw.get("fault") or ""
        return cls(
            phases_s={**DEFAULT_PHASES, **raw.get("phases_s", {})},
            fault=Fault.parse(fault_text),
            **{key: convert(raw[key]) for key, convert in SCALAR_KEYS.items() if key in raw},
        )

    def has_fault(self, name: str) -> bool:
        return self.fault is not None and self.fault.name == name


# config keys with a plain value, and how to read each ("gpus" belongs to the nvidia-smi stand-in)
SCALAR_KEYS = {"throughput_scale": float, "nccl_timeout_s": float, "rendezvous_timeout_s": float, "state_dir": Path,
               "architecture": str, "context_length": int}
