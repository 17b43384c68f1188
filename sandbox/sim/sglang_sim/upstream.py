"""Facts read from the installed upstream files: where they are, their version, and the fusion gates.

Gate detection looks for the exact gated text of the real wheels (roles/fusion-sm120/targets/) in the installed
files, so a patch that removes or widens that text is what lets the simulated server pass the gate.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# (e) backend resolver, (a) runtime gate, (f) preflight probe, (c) FlashInfer JIT gate
RESOLVER_GATES = (
    "if not (get_platform().is_sm90 or get_platform().is_sm100):",
    "if not (is_sm90_supported() or is_sm100_supported()):",
)
RESOLVER_MESSAGE = "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."
RUNTIME_GATES = ("(_is_sm90_supported or _is_sm100_supported)", "(_is_sm100_supported or _is_sm90_supported)")
PREFLIGHT_PROBE = "cuMulticastGetGranularity("
JIT_GATE = "supported_major_versions=[9, 10]\n"
JIT_MESSAGE = "No supported CUDA architectures found for major versions [9, 10]."


def real_spec(fullname: str, path: Sequence[str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system would give without the sim's finders: sys.path first, then the other finders
    on sys.meta_path, such as the one an editable install (setuptools' `__editable__` finder) appends."""
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    for finder in sys.meta_path:
        if spec is not None:
            break
        # PathFinder was asked first; the sim's own finders never answer (setuptools' finder is a class)
        if finder is importlib.machinery.PathFinder or getattr(finder, "__module__", "").startswith("sglang_sim"):
            continue
        spec = finder.find_spec(fullname, path) if hasattr(finder, "find_spec") else None
    return spec


def package_dir(name: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    spec = real_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0.dev0"


def function_body(source: str, name: str) -> str | None:
    """Text of a top-level `def name(` up to the next top-level statement; None if not defined."""
    start = source.find(f"\ndef {name}(")
    if start < 0:
        return None
    end = len(source)
    for marker in ("\ndef ", "\nclass ", "\n@"):
        found = source.find(marker, start + 1)
        if found >= 0:
            end = min(end, found)
    return source[start:end]


def line_of(path: Path, text: str) -> int:
    """1-based line of the first occurrence of text in path (1 if absent), for realistic tracebacks."""
    if not path.is_file():
        return 1
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number
    return 1


class Fusion(enum.Enum):
    OFF = "off"              # fusion not requested
    NO_OP = "no-op"          # requested, silently not applied (runtime gate)
    SKIPPED = "skipped"      # requested, preflight probe failed: fusion disabled with a warning
    CRASH_RESOLVER = "crash-resolver"  # ValueError at startup from the backend resolver (e)
    CRASH_JIT = "crash-jit"  # RuntimeError from FlashInfer's JIT gate (c)
    FUSED = "fused"          # applied


@dataclass(frozen=True)
class InstalledUpstream:
    sglang_dir: Path
    flashinfer_dir: Path | None
    sglang_version: str

    @classmethod
    def find(cls) -> InstalledUpstream:
        sglang_dir = package_dir("sglang")
        if sglang_dir is None:
            raise FileNotFoundError("sglang is not installed in this environment")
        return cls(sglang_dir, package_dir("flashinfer"), dist_version("sglang"))

    @property
    def fusion_module(self) -> Path:
        return self.sglang_dir / "srt/layers/flashinfer_comm_fusion.py"

    @property
    def runtime_gate_module(self) -> Path:
        add_norm = self.sglang_dir / "srt/layers/layer_boundary/residual/add_norm.py"
        return add_norm if add_norm.exists() else self.sglang_dir / "srt/layers/communicator.py"

    @property
    def jit_module(self) -> Path | None:
        return self.flashinfer_dir / "jit/comm.py" if self.flashinfer_dir else None

    @property
    def flashinfer_version(self) -> str:
        return dist_version("flashinfer-python")

    def jit_library(self, module: str, compute_major: int, base: Path) -> Path:
        """Where FlashInfer's JIT keeps a built module (flashinfer/jit/env.py): <workspace base>/.cache/flashinfer/
        <version>/<archs>/cached_ops/<module>/<module>.so (the base: compile_caches.CacheLayout.flashinfer_base)."""
        return (base / ".cache" / "flashinfer" / self.flashinfer_version / f"{compute_major}0a" / "cached_ops" / module
                / f"{module}.so")

    @property
    def has_ready_endpoint(self) -> bool:
        http_server = self.sglang_dir / "srt/entrypoints/http_server.py"
        return http_server.exists() and '@app.get("/ready")' in http_server.read_text()

    def _fusion_source(self, function: str) -> str | None:
        if not self.fusion_module.exists():
            return None
        return function_body(self.fusion_module.read_text(), function)

    def resolver_gated(self) -> bool | None:
        """None: this version has no backend resolver (e)."""
        body = self._fusion_source("_resolve_backend")
        return None if body is None else any(gate in body for gate in RESOLVER_GATES)

    def preflight_probes_multicast(self) -> bool | None:
        body = self._fusion_source("_flashinfer_trtllm_workspace_allocation_sizes")
        return None if body is None else PREFLIGHT_PROBE in body

    def runtime_gated(self) -> bool:
        module = self.runtime_gate_module
        return module.exists() and any(gate in module.read_text() for gate in RUNTIME_GATES)

    def jit_gated(self) -> bool:
        if self.jit_module is None or not self.jit_module.exists():
            return False
        body = function_body(self.jit_module.read_text(), "gen_trtllm_comm_module") or ""
        return JIT_GATE in body

    def fusion_outcome(self, fusion_requested: bool, compute_major: int) -> Fusion:
        """What the real server does with allreduce fusion on this GPU generation and these files."""
        if not fusion_requested:
            return Fusion.OFF
        if compute_major in (9, 10):
            return Fusion.FUSED
        resolver_gated = self.resolver_gated()
        if resolver_gated is None:  # <= 0.5.9: the JIT build is only reached through the runtime gate
            if self.runtime_gated():
                return Fusion.NO_OP
            return Fusion.CRASH_JIT if self.jit_gated() else Fusion.FUSED
        # >= 0.5.15: the workspace is pre-initialised at startup, before the runtime gate matters
        if resolver_gated:
            return Fusion.CRASH_RESOLVER
        if self.preflight_probes_multicast():
            return Fusion.SKIPPED
        if self.jit_gated():
            return Fusion.CRASH_JIT
        return Fusion.NO_OP if self.runtime_gated() else Fusion.FUSED
