"""Import hook installed by sglang_sim.pth: `python -m sglang.launch_server` runs the simulation.

Three module names are intercepted. `sglang` becomes a bare package over the real directory (its
__init__ imports torch, which the sandbox does not have), and `sglang.launch_server` gets code that calls
sglang_sim.main.run(). `sglang.benchmark.serving` (SGLang's serving benchmark, >= 0.5.15) runs its real file
unmodified, but when torch is missing two GPU-runtime modules it imports for one name each are put in
sys.modules first (see `_benchmark_stand_ins`). Every other `sglang.*` module loads from the real files.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from sglang_sim.upstream import real_spec

SIM_ENTRY = "import sglang_sim.main\nsglang_sim.main.run()\n"


class _BarePackageLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        # typeshed's ModuleType declares no attribute a module may be given at runtime (as below)
        try:
            module.__version__ = importlib.metadata.version("sglang")  # type: ignore[attr-defined]
        except importlib.metadata.PackageNotFoundError:
            module.__version__ = "0.0.0.dev0"  # type: ignore[attr-defined]


class _SimLaunchLoader(importlib.abc.InspectLoader):
    def get_source(self, fullname: str) -> str:
        return SIM_ENTRY

    def exec_module(self, module: types.ModuleType) -> None:
        code = self.get_code(module.__name__)
        assert code is not None  # compiled from get_source's text, which is always there
        exec(code, module.__dict__)


def _benchmark_stand_ins(sglang_dir: Path) -> None:
    """The benchmark imports FAKE_BOOTSTRAP_HOST from sglang.srt.disaggregation.utils and resolve_* from
    sglang.srt.utils.network; both packages import torch at the top. Without torch: `sglang.srt.utils` is a bare
    package over the real directory (network.py then loads from its real file) and the disaggregation module
    carries only that constant, read from the installed file's text."""
    if importlib.util.find_spec("torch") is not None:
        return
    utils = types.ModuleType("sglang.srt.utils")
    utils.__path__ = [str(sglang_dir / "srt" / "utils")]
    sys.modules.setdefault("sglang.srt.utils", utils)
    source = (sglang_dir / "srt" / "disaggregation" / "utils.py").read_text(encoding="utf-8")
    match = re.search(r'^FAKE_BOOTSTRAP_HOST = "([^"]*)"$', source, re.MULTILINE)
    disaggregation = types.ModuleType("sglang.srt.disaggregation.utils")
    disaggregation.FAKE_BOOTSTRAP_HOST = match.group(1) if match else ""  # type: ignore[attr-defined]
    sys.modules.setdefault("sglang.srt.disaggregation.utils", disaggregation)


class _BenchmarkLoader(importlib.machinery.SourceFileLoader):
    # runpy (`python -m`) calls get_code, an import calls exec_module -> get_code: both pass here
    def get_code(self, fullname: str) -> types.CodeType | None:
        _benchmark_stand_ins(Path(self.path).parents[1])
        return super().get_code(fullname)


class SimFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ("sglang", "sglang.launch_server", "sglang.benchmark.serving"):
            return None
        real = real_spec(fullname, path)
        if real is None:
            return None
        if fullname == "sglang.benchmark.serving":
            assert real.origin is not None
            return importlib.util.spec_from_file_location(fullname, real.origin,
                                                          loader=_BenchmarkLoader(fullname, real.origin))
        if fullname == "sglang":
            spec = importlib.machinery.ModuleSpec(fullname, _BarePackageLoader(), is_package=True)
            spec.submodule_search_locations = list(real.submodule_search_locations or [])
        else:
            spec = importlib.machinery.ModuleSpec(fullname, _SimLaunchLoader(), origin=real.origin)
            spec.has_location = True
        return spec


def install() -> None:
    if not any(isinstance(finder, SimFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SimFinder())
