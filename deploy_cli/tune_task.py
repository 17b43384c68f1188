"""`invoke tune` and `invoke tune.show`: options in, one call of deploy_lib.tune, the table out (`--json`: one JSON
document on stdout, progress on stderr). Mounted by tasks.py as the `tune` collection (`tune` is its default)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from invoke import Collection, Context, Exit

import deploy_cli as ui
from deploy_cli.options import task
from deploy_lib.errors import DeployError
from deploy_lib.project import Project, Target, load_for_host, resolve_target

PROJECT = Project(Path(__file__).resolve().parent.parent)
T = TypeVar("T")

HELP = {
    "vary": "KEY=V1,V2,...: a profile path (memory.max_running_requests=64,256,1024; features.cuda_graph=true,false) "
            "or patches=none,fusion-sm120; repeat for a grid",
    "spec": "a sweep spec file, tune/NAME.yaml: vary, bench, ladder, objective, level, sla, keep",
    "dry_run": "print the candidates, what differs flag by flag, the skipped ones and the time it takes; "
               "change nothing",
    "resume": "a sweep's id: run the candidates it did not finish (their figures are in history)",
    "keep": "winner (default): keep the winner when it beats the pre-sweep release beyond the noise; none: report only",
}


def _run(action: Callable[[], T], as_json: bool) -> T:
    try:
        return action()
    except DeployError as error:
        if as_json:
            ui.print_json(ui.failure_json(error))
        ui.print_error(error)
        raise Exit(code=error.exit_code) from None


def _remote(target: Target):  # type: ignore[no-untyped-def]
    from deploy_lib.remote import FabricRemote
    return FabricRemote(target.ssh)


def _inventory(given: str | None) -> str | None:
    return given or os.environ.get("SGLANG_DEPLOY_INVENTORY")


@task(name="tune", default=True, iterable=["vary"], help=HELP)
def tune(c: Context, profile: str | None = None, vary: list[str] | None = None, spec: str | None = None,
         host: str | None = None, inventory: str | None = None, dry_run: bool = False, resume: str | None = None,
         keep: str | None = None, yes: bool = False, accept_new_host_key: bool = False, json: bool = False) -> None:
    """Sweep profile settings and patch sets on one host: each candidate a release, benchmarked over a ladder."""
    from deploy_lib import tune as tuning
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import list_patch_sets

    loaded, target = _run(lambda: load_for_host(PROJECT, profile, _inventory(inventory), host,
                                                accept_new_host_key), json)
    ui.print_warnings(target.host.warnings)
    given = {"keep": keep} if keep else {}
    if resume is None:
        sweep_spec, sources = _run(lambda: tuning.sweep_spec(Path(spec) if spec else None, vary or [], given), json)
    elif vary or spec or keep:
        raise Exit("error: --resume continues the sweep as it was started: drop --vary, --spec and --keep", code=2)
    else:
        sweep_spec, sources = None, {}
    if not dry_run and not yes and not _run(lambda: ui.confirm(f"tune {loaded.name} on {target.host.name}: "
                                                               "each candidate restarts the server?"), json):
        raise Exit("cancelled: nothing was changed", code=1)
    request = tuning.Request(sweep_spec, sources, tuple(list_patch_sets(ROLES_DIR)), dict(os.environ),
                             dry_run=dry_run, resume=resume)
    progress = ui.TerminalProgress(ui.errors if json else ui.console, "")
    with _remote(target) as remote:
        result = _run(lambda: tuning.tune(loaded, target, remote, progress, request), json)
    if json:
        ui.print_json(result)
    elif isinstance(result, tuning.Planned):
        ui.print_lines(_planned_lines(result))
    else:
        ui.print_lines(tuning.table_lines(result))


def _planned_lines(planned: object) -> list[str]:
    from deploy_lib.tune import Planned
    assert isinstance(planned, Planned)
    lines = [f"{len(planned.sweep.candidates)} candidates against release {planned.original}, benchmark "
             f"{planned.sweep.bench.describe()}:"]
    for candidate in planned.sweep.candidates:
        lines.append(f"  {candidate.label}")
        lines += [f"      {change}" for change in planned.changes[candidate.label]] or ["      (as the release)"]
    lines += [f"skipped {item.label}: {item.reason}" for item in planned.sweep.skipped]
    lines += [*planned.sweep.notes, f"estimate: {planned.estimate.line()}"]
    return lines


@task(name="show", help={"tune_id": "the sweep's id (`invoke tune` prints it)"})
def show(c: Context, tune_id: str, host: str | None = None, inventory: str | None = None,
         service: str | None = None, json: bool = False) -> None:
    """Print a sweep's table again, from the host's history."""
    from deploy_lib import tune as tuning
    from deploy_lib.profile import ServiceSpec

    target = _run(lambda: resolve_target(PROJECT.inventory(_inventory(inventory)), host), json)
    with _remote(target) as remote:
        report = _run(lambda: tuning.show(remote, target, service or ServiceSpec().name, tune_id), json)
    if json:
        ui.print_json(report)
    else:
        ui.print_lines(tuning.table_lines(report))


collection = Collection(tune, show)
