"""`invoke report`: a host's (or each host of a group's) history as a self-contained HTML page plus CSV and JSON.
Options in, `deploy_lib.report.read_report` and `write_report`, the paths written out; mounted by tasks.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from invoke import Context, Exit

import deploy_cli as ui
from deploy_cli.options import task
from deploy_lib.errors import EXIT_CODES, ConfigError, DeployError
from deploy_lib.profile import ServiceSpec

if TYPE_CHECKING:
    from deploy_lib.project import Target

PROJECT_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def _mapped(action: Callable[[], T]) -> T:
    """One library call; a DeployError becomes its message and its exit code (as every task's)."""
    try:
        return action()
    except DeployError as error:
        ui.print_error(error)
        raise Exit(code=error.exit_code) from None


@task(iterable=["release"], help={
    "group": "inventory group: a report for each host of it, one after the other; exclusive with --host",
    "out": "directory for the page, its CSV files and JSON document (default: report)",
    "release": "a release whose throughput against concurrency is drawn; repeat for several (default: every "
               "benchmarked release)"})
def report(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
           service: str | None = None, out: str = "report", release: list[str] | None = None,
           verbose: bool = False) -> None:
    """Write the host's story in pictures from its history: throughput, power, start phases, crashes."""
    from deploy_lib.project import Project, resolve_group, resolve_target

    if host is not None and group is not None:
        raise Exit("error: --host and --group are exclusive: give one host (--host) or one group (--group)",
                   code=EXIT_CODES[ConfigError])
    hosts = _mapped(lambda: Project(PROJECT_ROOT).inventory(inventory or os.environ.get("SGLANG_DEPLOY_INVENTORY")))
    targets = _mapped(lambda: resolve_group(hosts, group) if group else [resolve_target(hosts, host)])
    name = service or ServiceSpec().name
    for target in targets:
        ui.print_warnings(target.host.warnings)
        paths = _mapped(partial(_write_one, target, name, release or (), Path(out), verbose))
        ui.console.print(f"{target.host.name}: report written to {paths[0]} (tables: "
                         f"{', '.join(path.name for path in paths[1:])})", markup=False)


def _write_one(target: Target, service: str, releases: Sequence[str], out: Path, verbose: bool) -> tuple[Path, ...]:
    from deploy_lib.remote import FabricRemote
    from deploy_lib.report import read_report, write_report

    with FabricRemote(target.ssh, on_result=ui.step_printer() if verbose else None) as remote:
        data = read_report(target, service, remote, releases)
    return write_report(data, out)
