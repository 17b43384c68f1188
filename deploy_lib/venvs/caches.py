"""The JIT and compile caches of the processes that run from a venv, in cache/<venv-hash>/: a kernel built from
one venv's sources is never loaded by another, and a restart on the same venv starts warm.

The list is what the SGLang versions we support and the kernel libraries they pin read, taken from their published
wheels (sglang 0.5.23 pins flashinfer-python 0.7.2, apache-tvm-ffi 0.1.11, sgl-deep-gemm, tilelang; sglang 0.5.9
pins flashinfer-python 0.6.3 and apache-tvm-ffi >= 0.1.5): each entry names the files that read its variable, and
tests/test_venv_caches.py checks each name against those files in the real wheels. Line numbers are 1-based, in the
file inside the wheel.

Left out on purpose:
- DG_JIT_CACHE_DIR (DeepGEMM's own): SGLang overwrites it with SGLANG_DG_CACHE_DIR when it imports its DeepGEMM
  wrapper (sglang 0.5.23 srt/layers/deep_gemm_wrapper/compile_utils.py:51, 0.5.9 the same file at 33-35), so that is
  the variable to set.
- FLASHINFER_CUBIN_DIR: FlashInfer's downloaded cubins default to FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/cubins
  (flashinfer-python 0.7.2 flashinfer/jit/env.py:66-70 and _get_cubin_dir at 93), so they follow the workspace.
- sglang 0.5.9's custom all-reduce P2P table (`~/.cache/sglang/gpu_p2p_access_cache_for_*.json`, srt/distributed/
  device_communicators/custom_all_reduce_utils.py:262): a fact of the GPUs, not a compiled artefact, and read from
  the home directory with no variable to move it.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy_lib.remote import Put, Step
from deploy_lib.store import StoreLayout
from deploy_lib.venvs.paths import cache_path


@dataclass(frozen=True)
class ReadBy:
    """A file of a published wheel that reads (or sets, for what it starts) a cache variable."""

    dist: str      # the PyPI name
    version: str
    path: str      # inside the wheel
    lines: str     # where, for a reader of this list


@dataclass(frozen=True)
class CacheVariable:
    """One environment variable pointed at a directory of cache/<venv-hash>/."""

    name: str
    subdir: str
    what: str
    read_by: tuple[ReadBy, ...]  # empty only for what the interpreter itself reads


SGLANG_NEW, SGLANG_OLD = "0.5.23", "0.5.9"


def _sglang(version: str, path: str, lines: str) -> ReadBy:
    return ReadBy("sglang", version, path, lines)


CACHES: tuple[CacheVariable, ...] = (
    # Bytecode too: uv does not compile at install (compiling a whole venv costs about a minute for the sandbox's and
    # more for a real one), so the server compiles what it imports on its first start and keeps it here, never in the
    # published venv, whose files are hard links shared with uv's cache and other venvs. CPython reads it itself
    # (sys.pycache_prefix, Python 3.8+): no wheel does.
    CacheVariable("PYTHONPYCACHEPREFIX", "pycache", "Python bytecode", ()),
    CacheVariable("FLASHINFER_WORKSPACE_BASE", "flashinfer", "FlashInfer's JIT modules (it adds .cache/flashinfer)", (
        ReadBy("flashinfer-python", "0.7.2", "flashinfer/jit/env.py", "66-68"),
        ReadBy("flashinfer-python", "0.6.3", "flashinfer/jit/env.py", "51-53"),
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "2320 third_party_cache_defaults"))),
    CacheVariable("TRITON_CACHE_DIR", "triton", "Triton's compiled kernels", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "2311"),
        _sglang(SGLANG_NEW, "sglang/srt/compilation/compiler_interface.py", "199-201"),
        _sglang(SGLANG_OLD, "sglang/srt/compilation/compiler_interface.py", "193-195"))),
    CacheVariable("TORCHINDUCTOR_CACHE_DIR", "torchinductor", "TorchInductor's compiled graphs", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "2312"),
        _sglang(SGLANG_NEW, "sglang/srt/compilation/compiler_interface.py", "196-198"),
        _sglang(SGLANG_OLD, "sglang/srt/compilation/compiler_interface.py", "190-192"))),
    # torch.compile's piecewise CUDA graphs point Triton and Inductor below this one (compiler_interface.py above),
    # and 0.5.23 keeps DeepGEMM's default, CuTe AOT kernels and FlashInfer's autotune results under it
    CacheVariable("SGLANG_CACHE_DIR", "sglang", "SGLang's own cache root (torch.compile cache, CuTe AOT, autotune)", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "1383"),
        _sglang(SGLANG_NEW, "sglang/srt/model_executor/runner/flashinfer_autotune.py", "193"),
        _sglang(SGLANG_OLD, "sglang/srt/compilation/backend.py", "398-400"))),
    # 0.5.9's default is ~/.cache/deep_gemm, outside SGLANG_CACHE_DIR: set on its own
    CacheVariable("SGLANG_DG_CACHE_DIR", "deep_gemm", "DeepGEMM's JIT kernels (SGLang sets DG_JIT_CACHE_DIR from it)", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "1373"),
        _sglang(SGLANG_NEW, "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py", "51"),
        _sglang(SGLANG_OLD, "sglang/srt/environ.py", "357"),
        _sglang(SGLANG_OLD, "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py", "33-35"))),
    # its default is ~/.cache/sglang/jit, outside SGLANG_CACHE_DIR
    CacheVariable("SGLANG_JIT_CACHE_DIR", "sglang-jit", "SGLang's JIT kernels (sglang.kernels.jit, 0.5.23)", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "1397"),
        _sglang(SGLANG_NEW, "sglang/kernels/jit/utils/compile/cache.py", "317-319"))),
    # sglang 0.5.9's jit_kernel builds with tvm_ffi.cpp.load_inline and no build_directory (jit_kernel/utils.py
    # 135-170): its kernels land in tvm-ffi's default cache
    CacheVariable("TVM_FFI_CACHE_DIR", "tvm-ffi", "TVM-FFI's JIT builds (sglang 0.5.9's jit_kernel)", (
        ReadBy("apache-tvm-ffi", "0.1.11", "tvm_ffi/cpp/extension.py", "682, 933"),)),
    CacheVariable("TILELANG_CACHE_DIR", "tilelang", "TileLang's compiled kernels (DeepSeek-V4's MHC prenorm)", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "2317 third_party_cache_defaults"),)),
    CacheVariable("CUDA_CACHE_PATH", "nv", "the CUDA driver's PTX JIT cache", (
        _sglang(SGLANG_NEW, "sglang/srt/environ.py", "2313 third_party_cache_defaults"),)),
    # torch's cpp_extension builds (torch_extensions, via torch/_appdirs.py) and what else follows the XDG base
    CacheVariable("XDG_CACHE_HOME", "xdg", "caches that follow the XDG base directory (torch_extensions)", (
        _sglang(SGLANG_NEW, "sglang/srt/model_loader/expert_pack_runtime.py", "29"),
        _sglang(SGLANG_OLD, "sglang/multimodal_gen/envs.py", "62-64"))),
)

# Environment variable -> subdirectory of cache/<venv-hash>/.
CACHE_VARIABLES = {cache.name: cache.subdir for cache in CACHES}


def cache_environment(layout: StoreLayout, venv_hash: str) -> dict[str, str]:
    """Env-file entries pointing the JIT and compile caches at cache/<venv-hash>/: a kernel built from one venv's
    sources is never loaded by another, and an old release finds its own warm cache."""
    base = cache_path(layout, venv_hash)
    return {variable: str(base / subdir) for variable, subdir in CACHE_VARIABLES.items()}


def cache_dir_steps(layout: StoreLayout, venv_hash: str, owner: str) -> list[Step | Put]:
    """Create the cache directories, owned by the user the server runs as."""
    base = cache_path(layout, venv_hash)
    dirs = [str(base), *(str(base / subdir) for subdir in CACHE_VARIABLES.values())]
    return [Step("venv cache: directories", ("mkdir", "-p", "--", *dirs), sudo=True),
            Step("venv cache: owner", ("chown", "--", f"{owner}:", *dirs), sudo=True)]
