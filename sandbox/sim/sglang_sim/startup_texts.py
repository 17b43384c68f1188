"""SGLang's own startup log lines and torch's out-of-memory message, at the texts of the installed wheel (0.5.23's,
or 0.5.9's where they differ; sources named per function), with the simulation's figures filled in. A report reads
startup phases from these lines."""

from __future__ import annotations

import enum
from pathlib import Path

GIB = 1024.0
# sglang srt/utils/common.py BAR_FORMAT (0.5.9 at 129 ends each update with a newline; 0.5.23 at 1414 does not)
SHARDS_DESC = "Loading safetensors checkpoint shards"


class LogStyle(enum.Enum):
    """Which SGLang wrote the lines: the capture's texts changed with the runner split of 0.5.15."""

    V0_5_9 = "0.5.9"    # sglang 0.5.9 srt/model_executor/model_runner.py "Capture {graph_backend[...]} begin."
    V0_5_23 = "0.5.23"

    @classmethod
    def of(cls, sglang_dir: Path) -> LogStyle:
        runner = sglang_dir / "srt/model_executor/model_runner.py"
        old = runner.is_file() and 'f"Capture {graph_backend[self.device]} begin.' in runner.read_text()
        return cls.V0_5_9 if old else cls.V0_5_23

# sglang/srt/model_executor/runner_backend_utils/__init__.py (0.5.23), CUDA_GRAPH_CAPTURE_FAILED_MSG
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
READY = "The server is fired up and ready to roll!"  # sglang/srt/entrypoints/http_server.py


def gb(mib: float) -> str:
    return f"{mib / GIB:.2f} GB"


def load_weight_begin(avail_mib: float) -> str:
    """sglang/srt/model_executor/model_runner.py, ModelRunner.load_model."""
    return f"Load weight begin. avail mem={gb(avail_mib)}"


def init_distributed_end(style: LogStyle, elapsed_s: float, usage_mib: float) -> str:
    """model_runner.py, ModelRunner.init_torch_distributed (0.5.9 at 850 also gives the elapsed time)."""
    elapsed = f"elapsed={elapsed_s:.2f} s, " if style is LogStyle.V0_5_9 else ""
    return f"Init torch distributed ends. {elapsed}mem usage={gb(usage_mib)}"


def shard_progress(style: LogStyle, done: int, total: int, elapsed_s: float) -> str:
    """One update of tqdm's bar over the shards (sglang srt/model_loader/weight_utils.py
    safetensors_weights_iterator, BAR_FORMAT), as tqdm writes it to stderr: a carriage return first."""
    rate = done / elapsed_s if done and elapsed_s > 0 else None
    remaining = clock((total - done) / rate) if rate else "?"
    rate_text = "?it/s" if rate is None else f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
    line = (f"\r{SHARDS_DESC}: {100 * done // total:3d}% Completed | {done}/{total} "
            f"[{clock(elapsed_s)}<{remaining}, {rate_text}]")
    return line + "\n" if style is LogStyle.V0_5_9 else line


def clock(seconds: float) -> str:
    """tqdm's format_interval below an hour."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def load_weight_end(style: LogStyle, elapsed_s: float, architecture: str, quantization: str | None,
                    avail_mib: float, usage_mib: float) -> str:
    """model_runner.py, ModelRunner.load_model (0.5.23: quant= from ModelConfig.get_quantization_config_log_str;
    0.5.9 at 1041: the dtype instead)."""
    quant = f"quant={quantization}, " if quantization else ""
    if style is LogStyle.V0_5_9:
        quant = "dtype=torch.bfloat16, "
    return (f"Load weight end. elapsed={elapsed_s:.2f} s, type={architecture}, {quant}avail mem={gb(avail_mib)}, "
            f"mem usage={gb(usage_mib)}.")


def kv_cache_allocated(style: LogStyle, num_tokens: int, kv_mib: float) -> str:
    """sglang/srt/mem_cache/memory_pool.py, the KV pool's size log (0.5.9 at 658 without the dtype)."""
    dtype = "" if style is LogStyle.V0_5_9 else "dtype: torch.bfloat16, "
    return f"KV Cache is allocated. {dtype}#tokens: {num_tokens}, KV size: {gb(kv_mib)}"


def memory_pool_end(avail_mib: float) -> str:
    """sglang/srt/mem_cache/kv_cache_configurator.py."""
    return f"Memory pool end. avail mem={gb(avail_mib)}"


def capture_bs(max_bs: int) -> list[int]:
    """The decode batch sizes captured up to max_bs (the shape of SGLang's default list, not its exact steps)."""
    return [bs for bs in (1, 2, 4, 8) if bs <= max_bs] + list(range(16, max_bs + 1, 16))


def capture_decode_begin(style: LogStyle, backend: str, avail_mib: float) -> str:
    """sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py, capture_decode_graph (0.5.9:
    model_runner.py init_device_graphs at 2147)."""
    if style is LogStyle.V0_5_9:
        return f"Capture cuda graph begin. This can take up to several minutes. avail mem={gb(avail_mib)}"
    return (f"Capture target decode CUDA graph begin. backend={backend}, num_tokens_per_req=1, "
            f"avail mem={gb(avail_mib)}")


def capture_decode_end(style: LogStyle, max_bs: int, elapsed_s: float, usage_mib: float, avail_mib: float) -> str:
    """cuda_graph_setup.py, capture_decode_graph (0.5.9: model_runner.py init_device_graphs at 2161)."""
    if style is LogStyle.V0_5_9:
        return (f"Capture cuda graph end. Time elapsed: {elapsed_s:.2f} s. mem usage={gb(usage_mib)}. "
                f"avail mem={gb(avail_mib)}.")
    return (f"Capture target decode CUDA graph end. bs={capture_bs(max_bs)}, elapsed={elapsed_s:.2f} s, "
            f"mem usage={gb(usage_mib)}, avail mem={gb(avail_mib)}.")


def deep_gemm_precompile(kernel: str, n: int, k: int) -> list[str]:
    """sglang srt/layers/deep_gemm_wrapper/compile_utils.py _maybe_compile_deep_gemm_one_type_all (0.5.23 at 169 and
    179, 0.5.9 at 125 and 135): logged at every start, warm cache or not; only the compile behind them differs."""
    return ["Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) if you have "
            "not run `sglang.compile_deep_gemm`. It is recommended to run `sglang.compile_deep_gemm` with same args "
            "as `sglang.launch_server` for pre-compilation to reduce the overhead if you have not run it before. "
            "For example: `python3 -m sglang.compile_deep_gemm --model deepseek-ai/DeepSeek-V3 --tp 8 "
            "--trust-remote-code`",
            f"Try DeepGEMM JIT Compiling for <{kernel}> N={n}, K={k}, num_groups=1 with all Ms. It only takes a "
            "little time (typically 1 sec) if you have run `python3 -m sglang.compile_deep_gemm`. "]


def cuda_out_of_memory(tried_mib: float, total_mib: float, free_mib: float) -> str:
    """torch.OutOfMemoryError's message (c10/cuda/CUDACachingAllocator.cpp) for one GPU of `total_mib`."""
    in_use = (total_mib - free_mib) / GIB
    return (f"CUDA out of memory. Tried to allocate {tried_mib / GIB:.2f} GiB. GPU 0 has a total capacity of "
            f"{total_mib / GIB:.2f} GiB of which {max(free_mib, 0) / GIB:.2f} GiB is free. Including non-PyTorch "
            f"memory, this process has {in_use:.2f} GiB memory in use. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def capture_failed(oom: str) -> str:
    """sglang/srt/model_executor/runner/decode_cuda_graph_runner.py (0.5.23): the capture's exception, re-raised."""
    return f"Exception: Capture cuda graph failed: {oom}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}"
