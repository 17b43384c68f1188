"""report: each host's story in pictures from its history (throughput, power against the limit, start phases,
crashes), or one tuning sweep's (`--tune ID`: its candidates, their throughput and power), written as a page, CSV and
JSON."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task


@task(iterable=["release"], help={
    "group": "inventory group: a report for each host of it; exclusive with --host",
    "out": "directory for the page, its CSV files and JSON document (default: report)",
    "release": "a release whose throughput against concurrency is drawn; repeat for several (default: every "
               "benchmarked release)",
    "tune": "a tuning sweep's id (`tune` prints it): the page of its candidates instead of the host's story"})
def report(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
           service: str | None = None, out: str = "report", release: list[str] | None = None,
           tune: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """Write the host's story in pictures from its history: throughput, power, start phases, crashes; or a sweep's."""
    from deploy_lib.metrics.workload import read_workloads
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    common.release_ids("--release", release or [])
    hosts = common.scope(inventory, host, group)
    workloads = common.run(lambda: read_workloads(common.project().workloads_dir))
    fleet = common.run(lambda: dispatch.report(hosts, common.service_name(service), release or (), Path(out),
                                               common.reach(), tune, workloads))
    common.show_each(fleet, _print_written, hosts.one_host)


def _print_written(paths: tuple[Path, ...]) -> None:
    ui.print_lines([f"report written to {paths[0]} (tables: {', '.join(path.name for path in paths[1:])})"])
