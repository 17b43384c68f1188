"""The profile's enums. Backend and parser choices are those some release in versions.KNOWN_SGLANG accepts
(versions.CHOICE_FLAGS names the flag each is checked against; tests/test_versions.py checks them against the real
wheels); preflight checks the chosen value against the parser of the version installed on the host."""

from __future__ import annotations

from enum import StrEnum


class AttentionBackend(StrEnum):
    aiter = "aiter"
    ascend = "ascend"
    compressed = "compressed"
    cutedsl_mla = "cutedsl_mla"
    cutlass_mla = "cutlass_mla"
    dsa = "dsa"
    dsv4 = "dsv4"
    dual_chunk_flash_attn = "dual_chunk_flash_attn"
    fa3 = "fa3"
    fa4 = "fa4"
    flashinfer = "flashinfer"
    flashmla = "flashmla"
    flex_attention = "flex_attention"
    hpc_ops = "hpc_ops"
    intel_amx = "intel_amx"
    intel_xpu = "intel_xpu"
    nsa = "nsa"
    qsa = "qsa"
    torch_native = "torch_native"
    triton = "triton"
    trtllm_mha = "trtllm_mha"
    trtllm_mla = "trtllm_mla"
    wave = "wave"


class MoeRunnerBackend(StrEnum):
    aiter = "aiter"
    auto = "auto"
    cutlass = "cutlass"
    deep_gemm = "deep_gemm"
    flashinfer_cutedsl = "flashinfer_cutedsl"
    flashinfer_cutlass = "flashinfer_cutlass"
    flashinfer_megamoe = "flashinfer_megamoe"
    flashinfer_mxfp4 = "flashinfer_mxfp4"
    flashinfer_trtllm = "flashinfer_trtllm"
    flashinfer_trtllm_routed = "flashinfer_trtllm_routed"
    marlin = "marlin"
    triton = "triton"
    triton_kernel = "triton_kernel"


class Fp8GemmBackend(StrEnum):
    aiter = "aiter"
    auto = "auto"
    cutlass = "cutlass"
    deep_gemm = "deep_gemm"
    flashinfer_cutedsl = "flashinfer_cutedsl"
    flashinfer_cutlass = "flashinfer_cutlass"
    flashinfer_deepgemm = "flashinfer_deepgemm"
    flashinfer_trtllm = "flashinfer_trtllm"
    triton = "triton"


class DsaBackend(StrEnum):
    """Sparse-attention (NSA, renamed DSA in 0.5.15) decode/prefill kernels."""

    aiter = "aiter"
    fa3 = "fa3"
    flashinfer_sparse_mla = "flashinfer_sparse_mla"
    flashmla_auto = "flashmla_auto"
    flashmla_kv = "flashmla_kv"
    flashmla_sparse = "flashmla_sparse"
    flashmla_sparse_q8 = "flashmla_sparse_q8"
    intel_xpu = "intel_xpu"
    tilelang = "tilelang"
    triton = "triton"
    triton_sparse_mla = "triton_sparse_mla"
    trtllm = "trtllm"


class KvCacheDtype(StrEnum):
    auto = "auto"
    bf16 = "bf16"
    bfloat16 = "bfloat16"
    fp4_e2m1 = "fp4_e2m1"
    fp4_mx_block16 = "fp4_mx_block16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"


class Quantization(StrEnum):
    awq = "awq"
    awq_marlin = "awq_marlin"
    bitsandbytes = "bitsandbytes"
    compressed_tensors = "compressed-tensors"
    fp8 = "fp8"
    gguf = "gguf"
    gptq = "gptq"
    gptq_marlin = "gptq_marlin"
    modelopt = "modelopt"
    modelopt_fp4 = "modelopt_fp4"
    modelopt_fp8 = "modelopt_fp8"
    moe_wna16 = "moe_wna16"
    mxfp4 = "mxfp4"
    w4afp8 = "w4afp8"
    w8a8_fp8 = "w8a8_fp8"
    w8a8_int8 = "w8a8_int8"


class P2PLevel(StrEnum):
    """NCCL_P2P_LEVEL: a name or its number (0 LOC .. 5 SYS), as NCCL documents."""

    LOC = "LOC"
    NVL = "NVL"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    SYS = "SYS"
    L0 = "0"
    L1 = "1"
    L2 = "2"
    L3 = "3"
    L4 = "4"
    L5 = "5"


class NcclDebug(StrEnum):
    VERSION = "VERSION"
    WARN = "WARN"
    INFO = "INFO"
    TRACE = "TRACE"


class RestartPolicy(StrEnum):
    no = "no"
    on_failure = "on-failure"
    always = "always"
