"""The compile caches a start fills, found from the environment as the installed SGLang finds them: a cold one costs
its modelled time and is then marked warm, so the next start on the same cache skips that time.

Where each lives (sglang 0.5.23 srt/environ.py: SGLANG_CACHE_DIR at 1383, default ~/.cache/sglang;
third_party_cache_defaults at 2308 puts TRITON_CACHE_DIR and FLASHINFER_WORKSPACE_BASE under it when unset;
SGLANG_DG_CACHE_DIR at 1373, default SGLANG_CACHE_DIR/deep_gemm. sglang 0.5.9 srt/environ.py:357:
SGLANG_DG_CACHE_DIR default ~/.cache/deep_gemm, and no redirect: Triton keeps its own default ~/.triton/cache,
FlashInfer the home directory).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sglang_sim.environ import env_bool


class CompileCache(enum.Enum):
    """A cache whose cold state costs a start time; the value is its phase in SimConfig.phases_s."""

    DEEP_GEMM = "deep_gemm"  # DeepGEMM's JIT kernels, built while the decode graphs are captured
    TRITON = "triton"        # Triton's kernels, compiled on their first launch (the capture's forward passes)


@dataclass(frozen=True)
class CacheLayout:
    """Where the installed SGLang points each cache: redirects_to_sglang_cache is 0.5.23's
    third_party_cache_defaults (0.5.15 on), absent from 0.5.9."""

    redirects_to_sglang_cache: bool

    @classmethod
    def of(cls, sglang_dir: Path) -> CacheLayout:
        environ_py = sglang_dir / "srt/environ.py"
        return cls(environ_py.is_file() and "def third_party_cache_defaults(" in environ_py.read_text())

    def sglang_cache(self, environ: Mapping[str, str]) -> Path:
        return Path(os.path.expanduser(environ.get("SGLANG_CACHE_DIR") or "~/.cache/sglang"))

    def directory(self, cache: CompileCache, environ: Mapping[str, str]) -> Path:
        if cache is CompileCache.DEEP_GEMM:
            default = self.sglang_cache(environ) / "deep_gemm" if self.redirects_to_sglang_cache \
                else Path(os.path.expanduser("~/.cache/deep_gemm"))
            return Path(os.path.expanduser(environ.get("SGLANG_DG_CACHE_DIR") or default))
        default = self.sglang_cache(environ) / "triton" if self.redirects_to_sglang_cache \
            else Path(os.path.expanduser("~/.triton/cache"))
        return Path(os.path.expanduser(environ.get("TRITON_CACHE_DIR") or default))

    def flashinfer_base(self, environ: Mapping[str, str]) -> Path:
        """FLASHINFER_WORKSPACE_BASE, which FlashInfer extends with .cache/flashinfer (flashinfer/jit/env.py)."""
        default = self.sglang_cache(environ) if self.redirects_to_sglang_cache else Path.home()
        return Path(os.path.expanduser(environ.get("FLASHINFER_WORKSPACE_BASE") or default))


def uses_deep_gemm(compute_major: int, environ: Mapping[str, str]) -> bool:
    """sglang 0.5.23 srt/layers/deep_gemm_wrapper/configurer.py _compute_enable_deep_gemm: SGLANG_ENABLE_JIT_DEEPGEMM
    (default on) and SM90 or newer; SM120 only with DeepGEMM's SM120 kernels, which the pinned build lacks."""
    return compute_major in (9, 10) and env_bool(environ, "SGLANG_ENABLE_JIT_DEEPGEMM", True)


@dataclass(frozen=True)
class KernelSet:
    """The kernels one model at one TP size builds: what a warm cache holds for it."""

    architecture: str
    tp_size: int

    def marker(self, directory: Path) -> Path:
        return directory / f"sglang-sim-{self.architecture}-tp{self.tp_size}"

    def is_warm(self, directory: Path) -> bool:
        return self.marker(directory).is_file()

    def mark_warm(self, directory: Path) -> None:
        """A cache the server may not write (a read-only home) stays cold: every start pays again, as a real one."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.marker(directory).write_text("simulated kernels\n")
        except OSError:
            pass
