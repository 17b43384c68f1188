"""gpu-check's host answered with the recorded outputs of the lent 2 x H200 machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deploy_lib.commands import deploy as engine
from deploy_lib.facts import host as host_facts
from deploy_lib.profile import LoadedProfile, Profile
from deploy_lib.store import UNIT_FILE
from helpers.deploy_plan import PROJECT, first_plan, options_accepting, target
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT, READY, ScriptedHost

H200 = Path(__file__).resolve().parents[1] / "data/gpu_check/h200x2-2026-11-30"


TORCH = {"torch_version": "2.11.0+cu130", "nccl_version": "2.28.9"}


def recorded_stdout(name: str) -> str:
    return (H200 / f"{name}.json").read_text()


def checked(tp: int = 2, gpu_check: bool = True, **nccl: Any) -> LoadedProfile:
    """The reference profile at `tp` with weights on the host (nothing to stage), preflight.gpu_check and `nccl`."""
    loaded = PROJECT.profile("glm5-nvfp4")
    data = loaded.profile.model_dump(mode="json")
    data["model"]["path"] = "/models/glm5"
    data["parallel"]["tp"] = tp
    data["preflight"] = {"gpu_check": gpu_check}
    data["nccl"].update(nccl)
    return loaded.model_copy(update={"profile": Profile.model_validate(data)})


class CheckHost(ScriptedHost):
    """ScriptedHost (B current and serving) that deploys: its venv has torch, its unit file is the tool's link, the
    check step answers `check_stdout`, and every release but A and B probes as `new` does."""

    def __init__(self, check_stdout: str, new: list[object], torch: bool = True) -> None:
        class Probes(dict[str, list[object]]):
            def __missing__(self, key: str) -> list[object]:
                return new

        super().__init__(Probes({"A": [READY], "B": [READY]}))
        _, plan = first_plan()  # what A and B are
        self.reply(host_facts.FACT_UNIT_LINK, stdout=f"{LAYOUT.current / UNIT_FILE}\n")
        self.reply(host_facts.FACT_FILE_SUMS, stdout="".join(f"{digest}  /x/{name}\n" for name, digest
                                                             in plan.release.record()["files"].items()))
        self.reply(host_facts.FACT_SGLANG, stdout=json.dumps({
            "sglang_version": "0.5.23", "flashinfer_version": "0.7.2", "options": options_accepting(plan.release.args),
            **(TORCH if torch else {})}))
        for kind, argv in (("m", ("-m",)), ("p2p-r", ("-p2p", "r")), ("p2p-w", ("-p2p", "w"))):
            self.reply(("nvidia-smi", "topo", *argv), stdout=(H200 / f"topo-{kind}.txt").read_text())
        self.reply("all-reduce check", stdout=check_stdout)

    def deploy(self, loaded: LoadedProfile) -> engine.Outcome:
        self.progress = RecordingProgress()
        return engine.deploy(loaded, target(), self, self.progress, engine.Options(grace_s=0))
