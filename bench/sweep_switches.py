"""`make bench`'s sweep-ordering figures (issue 41): how many times a sweep changes its venv or patch set (each change
can start on cold caches) in the grid's order and in the order `tune` runs (deploy_lib/tune/sweep.py groups the
candidates by venv and patch set). Pure: the candidates are built as `tune --dry-run` builds them, on a host view
of the sandbox's SGLang and GPUs; nothing is started."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.figures import Figure
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.deploy.project import Project
from deploy_lib.patches import list_patch_sets
from deploy_lib.store import StoreLayout
from deploy_lib.tune import sweep_spec
from deploy_lib.tune.spec import Value
from deploy_lib.tune.sweep import Candidate, HostView, build_sweep, environment_switches

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4-sandbox"
# the README's first sweep on the sandbox profile, and a bigger one whose patch set changes every second candidate
GRIDS = {
    "the README's first sweep": ("memory.max_running_requests=64,1024", "patches=none,fusion-sm120"),
    "3 caps x 2 patch sets x 2 chunk sizes": ("memory.max_running_requests=64,256,1024", "patches=none,fusion-sm120",
                                              "memory.chunked_prefill_size=null,4096"),
}
# the sandbox's versions and GPUs (SM120, what fusion-sm120 patches); no options read: every flag is accepted
SANDBOX_HOST = HostView(StoreLayout("sglang"), "0.5.23", "0.7.2", {}, "sm120")


@dataclass(frozen=True)
class SwitchCount:
    grid: str            # the grid's name in the table
    candidates: int
    grid_order: int      # switches of venv or patch set running the grid's product as given
    grouped: int         # running the candidates in the order tune runs them
    environments: int    # distinct venv and patch set pairs: the fewest switches is one less

    def figure(self) -> Figure:
        fewest = self.environments - 1
        return Figure(f"sweep's switches of venv or patch set, grid order -> tune's: {self.grid} ({self.candidates} "
                      "candidates)", f"{self.grid_order} -> {self.grouped}", 1,
                      f"{fewest} (one per venv and patch set after the first)", self.grouped == fewest)


def grid_order(candidates: Sequence[Candidate], vary: Mapping[str, Sequence[Value]]) -> list[Candidate]:
    """The candidates in the grid's product order: by their values' places in the order --vary gave them."""
    return sorted(candidates, key=lambda c: [vary[key].index(value) for key, value in c.settings])


def count_switches(grid: str, vary: Sequence[str]) -> SwitchCount:
    spec, sources = sweep_spec(None, vary)
    sweep = build_sweep(Project(REPO).profile(PROFILE), spec, sources, tuple(list_patch_sets(ROLES_DIR)),
                        SANDBOX_HOST)
    candidates = sweep.candidates
    return SwitchCount(grid, len(candidates), environment_switches(grid_order(candidates, spec.vary)),
                       environment_switches(candidates), len({c.environment for c in candidates}))


def switch_figures() -> list[Figure]:
    return [count_switches(grid, vary).figure() for grid, vary in GRIDS.items()]
