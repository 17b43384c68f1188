"""A hub model: its revision planned (resolved to a commit, what the cache lacks, free disk) and staged into the
host's HF cache by huggingface_hub."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deploy_lib.errors import ConfigError
from deploy_lib.inventory.model import HostVars
from deploy_lib.models.facts import FACT_MODEL, ModelFacts, ReleaseModel
from deploy_lib.models.script import kept_plan_name, parse_model_result, script_step
from deploy_lib.profile import Profile
from deploy_lib.remote import Step, StepResult

STAGE_MODEL = "model: stage"
STAGE_TIMEOUT_S = 48 * 3600  # several hundred GB over a slow link; Ctrl-C or a dropped connection stops it sooner


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
DEFAULT_HUB = "https://huggingface.co"


@dataclass(frozen=True)
class HubModel:
    """A hub model to plan or stage on one host: what the profile and the host's vars say, plus the token."""

    repo: str
    revision: str
    allow: tuple[str, ...]
    ignore: tuple[str, ...]
    hf_home: str | None        # None: the service user's ~/.cache/huggingface, resolved on the host
    endpoint: str | None       # None: huggingface_hub's default hub
    user: str
    token: str | None = field(default=None, repr=False)

    verb = "download"

    @property
    def hub(self) -> str:
        return self.endpoint or DEFAULT_HUB

    @property
    def label(self) -> str:
        return f"model {self.repo} at {self.revision} from {self.hub}"

    def fact_steps(self, venv: str) -> list[Step]:
        return [self.step(venv, "plan")]

    def parse(self, results: Sequence[StepResult]) -> ModelFacts:
        return parse_model_result(results[0])

    def release_model(self, facts: ModelFacts) -> ReleaseModel:
        return ReleaseModel(self.repo, self.revision, facts.commit, facts.hf_home)

    def step(self, venv: str, action: str, revision: str | None = None) -> Step:
        """The venv's python, as the service user, running model_stage.py; the token only ever on stdin."""
        request = {"action": action, "repo": self.repo, "revision": revision or self.revision,
                   "allow": list(self.allow), "ignore": list(self.ignore), "hf_home": self.hf_home,
                   "endpoint": self.endpoint, "user": self.user, "token": self.token}
        if action == "plan":  # a pinned commit staged before: the shell answers while the kept plan verifies
            return script_step(FACT_MODEL, venv, self.user, request, 120, kept_plan_name(request))
        return script_step(STAGE_MODEL, venv, self.user, request, STAGE_TIMEOUT_S)


def hub_model(profile: Profile, host_vars: HostVars, secrets: Mapping[str, str]) -> HubModel | None:
    """The profile's hub model on this host, or None when `model.path` is an absolute path (nothing to stage)."""
    model = profile.model
    if model.is_local_path:
        return None
    if not _REPO_ID.match(model.path):
        raise ConfigError(f"model.path: {model.path!r} is neither an absolute path nor a hub repo id (org/name)",
                          "give the repo id as the hub shows it, or the absolute path of the weights on the host")
    return HubModel(repo=model.path, revision=model.revision or "main", allow=tuple(model.allow_patterns),
                    ignore=tuple(model.ignore_patterns),
                    hf_home=host_vars.hf_home or profile.env.get("HF_HOME"),
                    endpoint=host_vars.hf_endpoint or profile.env.get("HF_ENDPOINT"),
                    user=profile.service.user, token=secrets.get("HF_TOKEN"))
