"""SGLang's own startup log lines and torch's out-of-memory message, at the texts of the 0.5.23 wheel (sources named
per function), with the simulation's figures filled in. A report reads startup phases from these lines."""

from __future__ import annotations

GIB = 1024.0

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


def load_weight_end(elapsed_s: float, architecture: str, quantization: str | None, avail_mib: float,
                    usage_mib: float) -> str:
    """model_runner.py, ModelRunner.load_model (quant= from ModelConfig.get_quantization_config_log_str)."""
    quant = f"quant={quantization}, " if quantization else ""
    return (f"Load weight end. elapsed={elapsed_s:.2f} s, type={architecture}, {quant}avail mem={gb(avail_mib)}, "
            f"mem usage={gb(usage_mib)}.")


def kv_cache_allocated(num_tokens: int, kv_mib: float) -> str:
    """sglang/srt/mem_cache/memory_pool.py, the KV pool's size log."""
    return f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {num_tokens}, KV size: {gb(kv_mib)}"


def memory_pool_end(avail_mib: float) -> str:
    """sglang/srt/mem_cache/kv_cache_configurator.py."""
    return f"Memory pool end. avail mem={gb(avail_mib)}"


def capture_bs(max_bs: int) -> list[int]:
    """The decode batch sizes captured up to max_bs (the shape of SGLang's default list, not its exact steps)."""
    return [bs for bs in (1, 2, 4, 8) if bs <= max_bs] + list(range(16, max_bs + 1, 16))


def capture_decode_begin(backend: str, avail_mib: float) -> str:
    """sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py, capture_decode_graph."""
    return (f"Capture target decode CUDA graph begin. backend={backend}, num_tokens_per_req=1, "
            f"avail mem={gb(avail_mib)}")


def capture_decode_end(max_bs: int, elapsed_s: float, usage_mib: float, avail_mib: float) -> str:
    """cuda_graph_setup.py, capture_decode_graph."""
    return (f"Capture target decode CUDA graph end. bs={capture_bs(max_bs)}, elapsed={elapsed_s:.2f} s, "
            f"mem usage={gb(usage_mib)}, avail mem={gb(avail_mib)}.")


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
