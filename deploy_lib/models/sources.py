"""Where a profile's weights come from on a host: a hub, this machine, or a directory already on the host."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from deploy_lib.inventory.model import HostVars
from deploy_lib.models.facts import FACT_MODEL, ModelFacts, ReleaseModel, Weights
from deploy_lib.models.hub import hub_model
from deploy_lib.models.pushed import pushed_model
from deploy_lib.profile import Profile
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK


@dataclass(frozen=True)
class HostPathModel:
    """`model.path` an absolute directory on the host: nothing to stage, only checked to hold a config.json."""

    path: str
    verb = "stage"

    @property
    def label(self) -> str:
        return f"model directory {self.path} on the host"

    def fact_steps(self, venv: str) -> list[Step]:
        return [Step(FACT_MODEL, ("test", "-f", str(PurePosixPath(self.path) / "config.json")), sudo=True,
                     ok=ABSENT_OK)]

    def parse(self, results: Sequence[StepResult]) -> ModelFacts:
        if results[0].exit_code != 0:
            return ModelFacts(error="not_found", message=f"{self.path}/config.json does not exist on the host")
        return ModelFacts(commit=None)

    def release_model(self, facts: ModelFacts) -> ReleaseModel:
        return ReleaseModel(self.path)


def weights(profile: Profile, host_vars: HostVars, secrets: Mapping[str, str]) -> Weights:
    """Where the profile's weights come from on this host; ConfigError before any SSH when that cannot work."""
    model = profile.model
    if model.source is not None:
        return pushed_model(model.path, Path(os.path.expanduser(model.source.rsync)))
    if model.is_local_path:
        return HostPathModel(model.path)
    hub = hub_model(profile, host_vars, secrets)
    assert hub is not None
    return hub
