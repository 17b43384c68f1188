"""`invoke report`: a host's story in pictures, from its history: throughput and p99 TTFT of every benchmark over
time (failed releases and rollbacks marked with their cause), throughput against concurrency per release, GPU power
and utilisation against the power limit, start phases per release, and crashes and restarts on a time line; or, with
`--tune ID`, one tuning sweep: its candidates' table, their throughput against concurrency and power against the
limit, the winner and why. One self-contained HTML page plus CSV and JSON of the same tables.

    data    the host's tables, collected from history (pure)
    sweep   a tuning sweep's tables, collected from history (pure)
    charts  matplotlib figures as inline SVG (matplotlib loads only here)
    page    the HTML page (Jinja2), the CSV files and the JSON document, written
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from deploy_lib.deploy.project import Target
from deploy_lib.host.store import read_store_facts
from deploy_lib.metrics.workload import Workload
from deploy_lib.remote import Remote
from deploy_lib.report.data import ReportData, collect
from deploy_lib.report.sweep import SweepData, collect_sweep
from deploy_lib.store import iso_time


def read_report(target: Target, service: str, remote: Remote, releases: Sequence[str] = (),
                now: datetime | None = None, workloads: Sequence[Workload] = ()) -> ReportData:
    """The report's tables from the host's history (one read of its store, nothing written), and the served traffic
    of the project's `workloads` read on it."""
    store = read_store_facts(remote, target.layout(service))
    return collect(store.history, target.host.name, service, iso_time(now or datetime.now(UTC)), releases, workloads)


def read_sweep(target: Target, service: str, remote: Remote, tune: str, now: datetime | None = None,
               workloads: Sequence[Workload] = ()) -> SweepData:
    """The tables of the tuning sweep `tune` from the host's history (one read of its store, nothing written);
    ConfigError naming the sweep and those the history holds when it has no such sweep."""
    store = read_store_facts(remote, target.layout(service))
    return collect_sweep(store.history, target.host.name, service, iso_time(now or datetime.now(UTC)), tune,
                         [workload.name for workload in workloads])


def write_report(data: ReportData | SweepData, out_dir: Path) -> tuple[Path, ...]:
    """The page, its JSON and a CSV per table in `out_dir`; the paths written, the page first."""
    from deploy_lib.report.page import write_report as write  # Jinja2 and matplotlib load only to write one

    return write(data, out_dir)


__all__ = ["ReportData", "SweepData", "collect", "collect_sweep", "read_report", "read_sweep", "write_report"]
