"""`workload`: the serving release's /metrics read over a window on one host (a scrape every `every_s` seconds, so
that the peak of running requests is seen, not only the two ends), and the workload written as a file in the project
(deploy_lib/metrics/workload.py decides its figures; nothing is written when the window says too little)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from deploy_lib.deploy.project import Target
from deploy_lib.errors import PreflightError
from deploy_lib.host.store import read_store_facts
from deploy_lib.host.switch import probe_target
from deploy_lib.host.watch import metrics_served
from deploy_lib.metrics.exposition import Scrape
from deploy_lib.metrics.live import metrics_step, parse_metrics_result
from deploy_lib.metrics.workload import Workload, workload_of, workload_text
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote


@dataclass(frozen=True)
class HostScrapes:
    """One host's scrapes of its current release over the window, in time order."""

    host: str
    release: str
    sglang_version: str
    scrapes: tuple[Scrape, ...]


def scrape_times(window_s: float, every_s: float) -> tuple[float, ...]:
    """When to scrape, in seconds from the first: every `every_s`, the last at `window_s` exactly."""
    if window_s <= 0 or every_s <= 0:
        raise ValueError("the window and the interval are positive")
    steps = max(1, int(-(-window_s // every_s)))  # ceil: no gap longer than every_s
    return tuple(window_s * i / steps for i in range(steps + 1))


def read_host_scrapes(target: Target, service: str, remote: Remote, window_s: float, every_s: float,
                      progress: Progress, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> HostScrapes:
    """The current release's /metrics read at `scrape_times`; PreflightError when no release serves metrics, or a
    read fails (the window is then unusable: nothing is written)."""
    layout = target.layout(service)
    store = read_store_facts(remote, layout)
    record = store.release(store.current) if store.current else None
    if record is None:
        raise PreflightError(f"no release of {service} is current on {target.host.name}: no workload to read")
    if not metrics_served(record.metadata):
        raise PreflightError(f"release {record.id} serves no /metrics: its profile has features.metrics off",
                             "deploy it with `features: {metrics: true}` (init's profiles have it), then read again")
    probe = probe_target(layout, record.metadata, environ={}, generation=False)  # /metrics needs no API key
    progress.note(f"workload: reading release {record.id}'s /metrics for {window_s:g} s")
    scrapes: list[Scrape] = []
    start = clock()
    for at in scrape_times(window_s, every_s):
        wait = start + at - clock()
        if wait > 0:
            sleep(wait)
        [result] = remote.run([metrics_step(probe)])
        scrape = parse_metrics_result(result, clock())
        if isinstance(scrape, str):
            raise PreflightError(f"release {record.id} on {target.host.name}: {scrape}; nothing written")
        scrapes.append(scrape)
    return HostScrapes(target.host.name, record.id, str(record.metadata.get("sglang_version", "unknown")),
                       tuple(scrapes))


def record_workload(name: str, per_host: Sequence[HostScrapes], workloads_dir: Path,
                    now: datetime | None = None) -> tuple[Workload, Path]:
    """The workload the hosts' scrapes show, written to `workloads_dir/<name>.yaml`; the hosts serve one release."""
    releases = {h.release for h in per_host}
    if len(releases) != 1:
        raise PreflightError(f"the hosts serve different releases ({', '.join(sorted(releases))}): a workload is "
                             "read from one release; give --host, or deploy the group first")
    versions = {h.sglang_version for h in per_host}
    workload = workload_of([h.scrapes for h in per_host], name, releases.pop(), [h.host for h in per_host],
                           ", ".join(sorted(versions)), (now or datetime.now(UTC)).isoformat(timespec="seconds"))
    path = workloads_dir / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(workload_text(workload))
    return workload, path
