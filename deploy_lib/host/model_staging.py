"""Moving a release's weights onto the host (host actions, through a Remote): a hub model staged into the HF cache
by the venv's huggingface_hub, an rsync source pushed into a new version directory; progress every few seconds."""

from __future__ import annotations

from collections.abc import Callable

from deploy_lib.errors import RemoteError
from deploy_lib.models.facts import FACT_MODEL, ModelFacts
from deploy_lib.models.hub import HubModel
from deploy_lib.models.pushed import FACT_MODEL_DISK, PushedModel
from deploy_lib.models.script import PROGRESS_PREFIX, parse_model_result
from deploy_lib.models.transfer import TransferMeter, show_end
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.store import STAGING_SUFFIX


def stage_model(remote: Remote, model: HubModel, venv: str, commit: str, progress: Progress,
                clock: Callable[[], float]) -> ModelFacts:
    """Download what the cache lacks of `commit`; progress every few seconds; RemoteError if it fails."""
    meter = TransferMeter(clock())

    def on_line(line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            done, total = (int(part) for part in line[len(PROGRESS_PREFIX):].split())
            shown = meter.sample(done, total, clock())
            if shown is not None:
                progress.transfer(f"model {model.repo}: {shown}")

    result = remote.run([model.step(venv, "stage", commit)], on_output=on_line)[0]
    facts = parse_model_result(result)
    show_end(meter, progress, f"model {model.repo}", clock())
    if facts.error is not None:
        raise RemoteError(f"staging model {model.repo} at {commit} from {model.hub} failed: {facts.message}; "
                          "nothing was switched, the current release keeps serving",
                          "rerun the deploy: files already downloaded are kept and a partial file is resumed")
    return facts


def _rsync_done_bytes(line: str) -> int | None:
    """Bytes done from an rsync --info=progress2 line: `   1,234,567  12%   10.00MB/s    0:00:10 ...`."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    digits = first.replace(",", "")
    return int(digits) if digits.isdigit() and "%" in line else None


def push_model(remote: Remote, model: PushedModel, listing: str, progress: Progress,
               clock: Callable[[], float]) -> ModelFacts:
    """rsync the local directory into <base>/<digest>.tmp (unchanged files hard-linked from the newest version,
    a partial earlier push resumed), then rename it to <base>/<digest>: a version directory is complete or absent."""
    facts = model.parse([StepResult(Step(FACT_MODEL, ("true",)), 0, listing, "", 0.0),
                         StepResult(Step(FACT_MODEL_DISK, ("true",)), 0, "", "", 0.0)])
    staging = model.base / (model.digest + STAGING_SUFFIX)
    meter = TransferMeter(clock())

    def on_line(line: str) -> None:
        done = _rsync_done_bytes(line)
        shown = meter.sample(done, facts.missing_bytes, clock()) if done is not None else None
        if shown is not None:
            progress.transfer(f"push {model.local_dir}: {shown}")

    remote.run([Step("model: version directory", ("mkdir", "-p", "--", str(staging)), sudo=True)])
    remote.push_directory(model.local_dir, staging, model.link_dest(listing), on_output=on_line)
    show_end(meter, progress, f"push {model.local_dir}", clock())
    remote.run([Step("model: publish version", ("mv", "-T", "--", str(staging), str(model.version_dir)), sudo=True)])
    return facts
