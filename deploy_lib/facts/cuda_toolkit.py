"""The CUDA toolkit at the release's CUDA_HOME, read as a host fact, and whether FlashInfer's JIT accepts it for an
SM 12.x GPU.

FlashInfer finds the toolkit as CUDA_HOME, else CUDA_PATH, else nvcc on PATH, else /usr/local/cuda
(flashinfer/jit/cpp_ext.py get_cuda_path) and reads its version from `nvcc --version`; it maps the GPU's compute
capability to an nvcc target in flashinfer/compilation_context.py (CompilationContext._normalize_cuda_arch). For
SM 12.x that mapping depends on the toolkit; read from the flashinfer-python wheels 0.6.3 - 0.7.4 on PyPI:

- before 0.6.7: no toolkit check (12.0 becomes compute_120a);
- 0.6.7 - 0.7.0.post1: "SM 12.x requires CUDA >= 12.9" is raised and swallowed in CompilationContext.__init__ (a
  logged warning), leaving an empty arch list, so every JIT build, the fusion's trtllm_comm included, fails with
  "No supported CUDA architectures found for major versions [...]";
- from 0.7.1: SM 12.0 accepts CUDA 12.8 (compute_120a, "SM 120 requires CUDA >= 12.8" below it); SM 12.1+ needs
  CUDA 12.9.

An entry of FLASHINFER_CUDA_ARCH_LIST that carries its suffix (e.g. `12.0a`) is taken as given, with no toolkit
check, in every one of these versions; `a` targets build with nvcc 12.8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import TOOL_ABSENT_OK, Readings
from deploy_lib.versions import version_key

DEFAULT_CUDA_HOME = "/usr/local/cuda"
FACT_VERSION_JSON = "host facts: CUDA toolkit version.json"
FACT_NVCC = "host facts: CUDA toolkit nvcc"
_NVCC_RELEASE = re.compile(r"release (\d+\.\d+),")  # FlashInfer's own pattern (jit/cpp_ext.py get_cuda_version)
_MISSING_OK = TOOL_ABSENT_OK | {126}  # 126: an nvcc that is there but cannot be executed
FIX_HINT = ("point CUDA_HOME (the profile's env) at a CUDA >= 12.9 toolkit, or add `FLASHINFER_CUDA_ARCH_LIST: "
            "'12.0a'` to the profile's env (FlashInfer then takes the arch as given and builds it with nvcc 12.8)")


@dataclass(frozen=True)
class ToolkitRule:
    """What one range of FlashInfer versions needs for SM 12.x JIT builds, and what it does below that."""

    first: str             # first FlashInfer version of the range
    end: str | None        # first version after it (None: open)
    minimum_sm120: str
    minimum_sm12x: str     # SM 12.1 and later
    below: str

    def covers(self, flashinfer_version: str) -> bool:
        key = version_key(flashinfer_version)
        return version_key(self.first) <= key and (self.end is None or key < version_key(self.end))


SM12X_RULES = (
    ToolkitRule("0.6.7", "0.7.1", "12.9", "12.9",
                'it raises "SM 12.x requires CUDA >= 12.9" and swallows it, so its JIT arch list is empty and the '
                "fusion's kernels fail with \"No supported CUDA architectures found\""),
    ToolkitRule("0.7.1", None, "12.8", "12.9",
                "it refuses the GPU's architecture, so its JIT arch list is empty"),
)


@dataclass(frozen=True)
class CudaToolkit:
    home: str
    version: str | None   # major.minor, e.g. "12.8"; None: no toolkit found there
    source: str           # where the version was read, or why there is none


def cuda_home(environment: Mapping[str, str]) -> str:
    """The toolkit FlashInfer uses for this environment (without a CUDA_HOME it would search PATH for nvcc first)."""
    return environment.get("CUDA_HOME") or environment.get("CUDA_PATH") or DEFAULT_CUDA_HOME


def toolkit_steps(home: str) -> list[Step]:
    """Read-only: the toolkit's version.json and `nvcc --version` (either may be missing)."""
    root = PurePosixPath(home)
    return [Step(FACT_VERSION_JSON, ("cat", "--", str(root / "version.json")), ok=_MISSING_OK, timeout_s=30),
            Step(FACT_NVCC, (str(root / "bin" / "nvcc"), "--version"), ok=_MISSING_OK, timeout_s=60)]


def _major_minor(version: str) -> str | None:
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    return f"{match[1]}.{match[2]}" if match else None


def parse_toolkit(home: str, results: Readings | Mapping[str, StepResult]) -> CudaToolkit:
    """The version from version.json (`cuda.version`), else from `nvcc --version`."""
    version_json = results.get(FACT_VERSION_JSON)
    if version_json is not None and version_json.exit_code == 0:
        try:
            version = _major_minor(str(json.loads(version_json.stdout)["cuda"]["version"]))
        except (ValueError, KeyError, TypeError):
            version = None
        if version:
            return CudaToolkit(home, version, f"{home}/version.json")
    nvcc = results.get(FACT_NVCC)
    if nvcc is not None and nvcc.exit_code == 0:
        found = _NVCC_RELEASE.search(nvcc.stdout)
        if found:
            return CudaToolkit(home, found[1], f"{home}/bin/nvcc --version")
    return CudaToolkit(home, None, f"neither {home}/version.json nor {home}/bin/nvcc answers")


def _arch_given(environment: Mapping[str, str], compute_cap: str) -> bool:
    """FLASHINFER_CUDA_ARCH_LIST names this GPU with an `a` suffix (split on spaces, as FlashInfer does)."""
    return f"{compute_cap}a" in environment.get("FLASHINFER_CUDA_ARCH_LIST", "").split(" ")


def sm12x_problem(flashinfer_version: str | None, compute_cap: str, toolkit: CudaToolkit | None,
                  environment: Mapping[str, str]) -> str | None:
    """Why this FlashInfer cannot JIT-build for this SM 12.x GPU with this toolkit, or None (also when unknown)."""
    if not compute_cap.startswith("12.") or flashinfer_version is None or toolkit is None or toolkit.version is None:
        return None
    rule = next((r for r in SM12X_RULES if r.covers(flashinfer_version)), None)
    if rule is None or _arch_given(environment, compute_cap):
        return None
    minimum = rule.minimum_sm120 if compute_cap == "12.0" else rule.minimum_sm12x
    if version_key(toolkit.version) >= version_key(minimum):
        return None
    arch = "sm" + compute_cap.replace(".", "")
    return (f"FlashInfer {flashinfer_version} needs CUDA >= {minimum} to build kernels for {arch} "
            f"and CUDA_HOME={toolkit.home} is CUDA {toolkit.version} (read from {toolkit.source}): {rule.below}")


def describe(flashinfer_version: str | None, compute_cap: str, toolkit: CudaToolkit | None,
             environment: Mapping[str, str]) -> str:
    """One line for `patch-fusion --check/--audit`: the toolkit and FlashInfer's verdict on it."""
    if toolkit is None or toolkit.version is None:
        where = toolkit.source if toolkit else "not read"
        return f"CUDA toolkit: unknown ({where}); FlashInfer's SM 12.x toolkit check not applied"
    problem = sm12x_problem(flashinfer_version, compute_cap, toolkit, environment)
    if problem is not None:
        return f"CUDA toolkit: REFUSED: {problem}; fix: {FIX_HINT}"
    given = " (FLASHINFER_CUDA_ARCH_LIST names the arch)" if _arch_given(environment, compute_cap) else ""
    return (f"CUDA toolkit: CUDA {toolkit.version} at {toolkit.home} ({toolkit.source}): FlashInfer "
            f"{flashinfer_version or '(not installed)'} accepts it for sm{compute_cap.replace('.', '')}{given}")
