"""Model weights as part of a release: the revision resolved to a commit, the disk checked, the snapshot staged.

A hub model (`model.path` a repo id) is planned and staged on the host by the release's own venv: its python runs
`model_stage.py` (sent on stdin) with huggingface_hub, the library SGLang itself downloads with, into the host's HF
cache. The plan rides in the facts batch (one round trip: commit, files, what is missing, free disk); staging
happens under the lock before the switch, while the old release serves; the unit then runs with HF_HUB_OFFLINE=1 and
`--revision <commit>`, so a release never downloads at startup. Nothing here opens a connection.

    facts       what a source of weights reports (ModelFacts), the check before a deploy, what a release records
    script      model_stage.py run by the venv's python on the host, and its result line
    transfer    progress lines of a download or push (rate, ETA)
    hub         a hub model: planned by huggingface_hub on the host
    pushed      an rsync source: this machine's directory and the version directories on the host
    sources     where a profile's weights come from (hub, pushed, or a directory already on the host)

Staging, listing and pruning on the host are deploy_lib/host/models.py.
"""

from deploy_lib.models.facts import (
    FACT_MODEL,
    MIN_FREE_AFTER_BYTES,
    ModelFacts,
    ModelFile,
    ReleaseModel,
    Weights,
    check_model,
    size_text,
)
from deploy_lib.models.hub import STAGE_MODEL, HubModel, hub_model
from deploy_lib.models.pushed import PushedModel, parse_versions
from deploy_lib.models.script import BOOTSTRAP, parse_model_result
from deploy_lib.models.sources import HostPathModel, weights
from deploy_lib.models.transfer import TransferMeter

__all__ = [
    "BOOTSTRAP", "FACT_MODEL", "MIN_FREE_AFTER_BYTES", "STAGE_MODEL", "HostPathModel", "HubModel", "ModelFacts",
    "ModelFile", "PushedModel", "ReleaseModel", "TransferMeter", "Weights", "check_model", "hub_model",
    "parse_model_result", "parse_versions", "size_text", "weights",
]
