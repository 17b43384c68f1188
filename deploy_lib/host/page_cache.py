"""A release's weights and the host's page cache, through a Remote: how much of them is resident, and the read that
brings the new release's weights in while the old release serves (deploy_lib/models/page_cache.py decides)."""

from __future__ import annotations

from collections.abc import Callable

from deploy_lib.host_scripts.page_cache import PROGRESS_PREFIX
from deploy_lib.models.facts import size_text
from deploy_lib.models.page_cache import (
    Residency,
    Warm,
    WarmDecision,
    files_text,
    measure_step,
    parse_read,
    parse_residency,
    read_step,
)
from deploy_lib.models.transfer import TransferMeter, show_end
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote


def read_residency(remote: Remote, root: str) -> Residency | str:
    """One read-only round trip: the weights under `root`, how much of them is resident, MemAvailable."""
    return parse_residency(remote.run([measure_step(root)])[0])


def warm_weights(remote: Remote, decision: WarmDecision, progress: Progress, clock: Callable[[], float]) -> int:
    """Read the decided files once (Warm.read); progress as a transfer (bytes/s, files). The bytes read: 0 for any
    other decision, and for a read that did not complete (a note says why: the deploy goes on, the server reads from
    disk what is not in memory)."""
    if decision.warm is not Warm.read:
        return 0
    meter = TransferMeter(clock())
    files = len(decision.files)

    def on_line(line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            done, total, files_done, _ = (int(part) for part in line[len(PROGRESS_PREFIX):].split())
            shown = meter.sample(done, total, clock())
            if shown is not None:
                progress.transfer(f"page cache: {shown}, file {min(files_done + 1, files)} of {files}")

    result = remote.run([read_step(decision.files)], on_output=on_line)[0]
    show_end(meter, progress, "page cache", clock())
    read = parse_read(result)
    if isinstance(read, str):
        progress.note(f"page cache: the weights were not read in ({read}); the server reads them from disk")
        return 0
    progress.note(f"page cache: {size_text(read)} of weights read in {files_text(files)}")
    return read
