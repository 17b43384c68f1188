"""A hand-started SGLang process as `adopt` reads it: its argv, environment and the profiles it is compared to."""

from __future__ import annotations

from pathlib import Path

from deploy_lib.facts.hand_process import (
    HandProcess,
)
from deploy_lib.profile import Profile, load_profile

PROFILES = Path(__file__).resolve().parents[2] / "inventory" / "profiles"


TOKEN = "hf_s3cr3t-value"


# Our reference user's launch (README: the reference profile is that command plus metrics), as typed in an activated
# venv.
HAND_0523 = (
    "python -m sglang.launch_server --model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 "
    "--reasoning-parser glm45 --tool-call-parser glm47 --trust-remote-code --tp 8 --mem-fraction-static 0.92 "
    "--max-running-requests 1024 --kv-cache-dtype auto --quantization modelopt_fp4 --attention-backend flashinfer "
    "--fp8-gemm-backend cutlass --dsa-decode-backend trtllm --dsa-prefill-backend trtllm "
    "--moe-runner-backend flashinfer_cutlass --disable-cuda-graph --disable-radix-cache --host 0.0.0.0 --port 8000"
).split()


HAND_ENV = {
    "NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "NCCL_MIN_NCHANNELS": "8", "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "8", "SAFETENSORS_FAST_GPU": "1", "CUDA_HOME": "/usr/local/cuda-12.8", "HF_TOKEN": TOKEN,
    "VIRTUAL_ENV": "/root/ml-env", "PATH": "/root/ml-env/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/root",
    "SHELL": "/bin/bash", "SSH_CONNECTION": "192.0.2.1 5000 192.0.2.10 22", "PWD": "/root", "TERM": "xterm",
}


def hand(argv: list[str], environ: dict[str, str] | None = None) -> HandProcess:
    return HandProcess(4242, tuple(argv), environ if environ is not None else HAND_ENV, "/root", "root")


def reference_as_hand_launched() -> Profile:
    """The reference profile less the one thing it adds to the hand launch: SGLang's metrics (features.metrics)."""
    reference = load_profile(PROFILES, "glm5-nvfp4").profile
    assert reference.features.metrics, "the reference profile serves /metrics (issue 42)"
    return reference.model_copy(update={"features": reference.features.model_copy(update={"metrics": False})})
