"""The reference project, a host's facts and a first plan: what the deploy-planning tests start from."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from deploy_lib.deploy.plan import plan_deploy, release_tags
from deploy_lib.deploy.project import Project, Target, resolve_target
from deploy_lib.facts.host import (
    Gpu,
    HostFacts,
    SGLangInstall,
    UnitFacts,
)
from deploy_lib.inventory.model import HostVars
from deploy_lib.store import (
    HEALTHY,
    UNIT_FILE,
    ReleaseRecord,
    StoreFacts,
    StoreLayout,
    Tags,
    history_entry,
    release_json,
)

REPO = Path(__file__).resolve().parents[2]


PROJECT = Project(REPO)


NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


RTX = Gpu(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", 97887, 0, 30.0, 600.0, 0.0)


def option(*flags: str, action: str = "store", choices: list[str] | None = None) -> dict[str, object]:
    return {"option_strings": list(flags), "dest": flags[0].lstrip("-").replace("-", "_"), "action": action,
            "nargs": 0 if action == "store_true" else None, "choices": choices, "type": None,
            "deprecated": False, "required": False, "error": None}


def options_accepting(args: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """An option table that knows exactly the flags of `args` (switches are the flags followed by a flag)."""
    table = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            is_switch = index + 1 == len(args) or args[index + 1].startswith("--")
            table[arg] = option(arg, action="store_true" if is_switch else "store")
    return table


def target(gpu_count: int | None = 8) -> Target:
    inventory = PROJECT.inventory(None)
    resolved = resolve_target(inventory, None)
    return replace(resolved, host=resolved.host.model_copy(update={"vars": HostVars(
        ansible_host="192.0.2.10", gpu_count=gpu_count, gpu_arch="sm120")}))


def facts(args_known: tuple[str, ...] = (), gpus: int = 8, current: ReleaseRecord | None = None,
          active: str = "inactive", sums: dict[str, str] | None = None, listeners: tuple[str, ...] = (),
          link: str | None = None, verified: bool = True, venv_versions: dict[str, str] | None = None) -> HostFacts:
    """What preflight reads; `current` was deployed and, with `verified`, history records it healthy;
    `venv_versions`: the venv's torch_version and nccl_version (none by default)."""
    history = (history_entry("deploy", HEALTHY, Tags.from_dict(current.metadata["tags"]), NOW),) \
        if current is not None and verified else ()
    store = StoreFacts(current=current.id if current else None, releases=(current,) if current else (),
                       incomplete=(), history=history, lock=None)
    if current is not None:  # by default the host holds exactly what was deployed
        link = link or str(StoreLayout("sglang").current / UNIT_FILE)
        sums = current.metadata["files"] if sums is None else sums
    return HostFacts(store=store, gpus=tuple(replace(RTX, index=i) for i in range(gpus)), gpu_error=None,
                     unit=UnitFacts(active, "dead" if active == "inactive" else "running", 0, 0,
                                    "loaded" if current else "not-found"),
                     unit_link=link, file_sums=sums or {}, port_listeners=listeners, free_bytes=10**10,
                     sglang=SGLangInstall(True, "0.5.23", "0.7.2", options_accepting(args_known), None,
                                          **(venv_versions or {})))


def first_plan(profile: str = "glm5-nvfp4"):
    loaded = PROJECT.profile(profile)
    probe = plan_deploy(loaded, target(), facts(), {}, False, NOW)
    return loaded, probe


def deployed(plan) -> ReleaseRecord:
    """The release of `plan` as the host's current release (what the store facts would read back)."""
    metadata = json.loads(release_json(plan.release.record(), release_tags(target(), plan.release), NOW))
    return ReleaseRecord(plan.release.id, "2026-11-29T11:00:00+00:00", metadata)
