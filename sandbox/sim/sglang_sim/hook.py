"""Import hook installed by sglang_sim.pth: `python -m sglang.launch_server` runs the simulation.

Only two module names are intercepted. `sglang` becomes a bare package over the real directory (its
__init__ imports torch, which the sandbox does not have), and `sglang.launch_server` gets code that calls
sglang_sim.main.run(). Every other `sglang.*` module loads from the real, unmodified files.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from collections.abc import Sequence

SIM_ENTRY = "import sglang_sim.main\nsglang_sim.main.run()\n"


class _BarePackageLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            module.__version__ = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            module.__version__ = "0.0.0.dev0"


class _SimLaunchLoader(importlib.abc.InspectLoader):
    def get_source(self, fullname: str) -> str:
        return SIM_ENTRY

    def exec_module(self, module: types.ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)


class SimFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ("sglang", "sglang.launch_server"):
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None:
            return None
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
