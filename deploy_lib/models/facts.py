"""What a source of weights reports about one host (ModelFacts), the check that they can be staged there, and what
a release records of the weights it runs (ReleaseModel)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from deploy_lib.errors import PreflightError
from deploy_lib.remote import Step, StepResult

FACT_MODEL = "host facts: model weights"


MIN_FREE_AFTER_BYTES = 1024 ** 3  # what must stay free in the cache's filesystem once the weights are in


class Weights(Protocol):
    """Where a release's weights come from: a hub (HubModel), this machine (PushedModel), the host (HostPathModel)."""

    verb: str  # what staging does: download, push

    @property
    def label(self) -> str: ...

    def fact_steps(self, venv: str) -> list[Step]: ...

    def parse(self, results: Sequence[StepResult]) -> ModelFacts: ...

    def release_model(self, facts: ModelFacts) -> ReleaseModel: ...


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    blob: str


@dataclass(frozen=True)
class ModelFacts:
    """What the host's cache holds of one revision, as model_stage.py reported it (or why it could not)."""

    commit: str | None = None
    files: tuple[ModelFile, ...] = ()
    missing: tuple[str, ...] = ()      # files of the revision not yet in the snapshot
    missing_bytes: int = 0             # bytes still to download (a blob shared with another revision is not)
    free_bytes: int | None = None      # in the cache's filesystem
    hf_home: str | None = None
    asked_hub: bool = False
    error: str | None = None           # unreachable, not_found, gated, no_library, disk_full, hub_error, script
    message: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    @property
    def complete(self) -> bool:
        return self.error is None and not self.missing


def size_text(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


_HINTS = {
    "unreachable": "check the host's network to the hub (or its `hf_endpoint` host var); nothing was changed and the "
                   "current release keeps serving",
    "not_found": "check model.path and model.revision (a commit, tag or branch of that repo)",
    "gated": "give a token with access: `secrets: {HF_TOKEN: {env: HF_TOKEN}}`",
    "no_library": "the release's venv needs huggingface_hub (SGLang depends on it)",
}


def check_model(model: Weights, facts: ModelFacts, where: str) -> None:
    """PreflightError when the weights cannot be planned (hub, revision, directory) or do not fit on the disk."""
    if facts.error is not None:
        raise PreflightError(f"{where}: cannot plan {model.label}: {facts.message}",
                             _HINTS.get(facts.error, "see the message above"))
    if facts.free_bytes is not None and facts.missing_bytes + MIN_FREE_AFTER_BYTES > facts.free_bytes:
        raise PreflightError(
            f"{where}: {model.label} ({facts.commit}): {size_text(facts.missing_bytes)} still to {model.verb} "
            f"into {facts.hf_home}, but only {size_text(facts.free_bytes)} is free there "
            f"({size_text(MIN_FREE_AFTER_BYTES)} must stay free)",
            "free disk space on the host, prune old revisions (`invoke model.list`), or point the weights "
            "(host var `hf_home`, model.path) at a larger disk")


@dataclass(frozen=True)
class ReleaseModel:
    """The weights a release runs: a hub repo at a resolved commit in a host cache, or a path on the host."""

    path: str                     # repo id, or absolute path on the host
    revision: str | None = None   # as the profile asked (hub only)
    commit: str | None = None     # what it resolved to at plan time (hub only)
    hf_home: str | None = None    # the host cache holding the snapshot (hub only)

    pushed_from: str | None = None  # the local directory an rsync source was pushed from

    def metadata(self) -> dict[str, str]:
        fields = {"path": self.path, "revision": self.revision, "commit": self.commit, "hf_home": self.hf_home,
                  "pushed_from": self.pushed_from}
        return {name: value for name, value in fields.items() if value is not None}

    def environment(self) -> dict[str, str]:
        """The server reads what was staged and never downloads: the hub is switched off, the cache named."""
        return {**({"HF_HOME": self.hf_home} if self.hf_home else {}), "HF_HUB_OFFLINE": "1"}
