"""The simulated GPUs, asked from nvidia-smi the way a real program asks the driver."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_major: int
    memory_mib: int


def query_gpus() -> list[Gpu]:
    """Empty when there is no nvidia-smi (then the simulated server fails like CUDA without a GPU)."""
    tool = os.environ.get("SGLANG_SIM_NVIDIA_SMI") or shutil.which("nvidia-smi")
    if tool is None:
        return []
    out = subprocess.run(
        [tool, "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout
    gpus = []
    for line in out.splitlines():
        index, name, compute_cap, memory = (part.strip() for part in line.split(","))
        gpus.append(Gpu(int(index), name, int(compute_cap.split(".")[0]), int(memory)))
    return gpus
