"""Gate-only edits of installed SGLang files, as a patch set would make them (for the sim's tests)."""

from __future__ import annotations

from pathlib import Path

from sglang_sim.upstream import InstalledUpstream

# sglang 0.5.23: (e) backend resolver, (f) preflight multicast probe, (a) runtime gate
RESOLVER_0_5_23 = ("if not (get_platform().is_sm90 or get_platform().is_sm100):",
                   "if not (get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120):")
PREFLIGHT = ("cuMulticastGetGranularity(", "cuMemGetAllocationGranularity(")
RUNTIME = ("(_is_sm90_supported or _is_sm100_supported)",
           "(_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)")


def replace(path: Path, edit: tuple[str, str]) -> None:
    old, new = edit
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def patch_sglang_0_5_23_gates(upstream: InstalledUpstream) -> None:
    replace(upstream.fusion_module, RESOLVER_0_5_23)
    replace(upstream.fusion_module, PREFLIGHT)
    replace(upstream.runtime_gate_module, RUNTIME)
