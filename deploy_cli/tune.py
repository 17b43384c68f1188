"""tune, tune.show: a sweep of profile settings and patch sets on one host, each candidate a release benchmarked over
a concurrency ladder; its table (`--json`: one JSON document on stdout, progress on stderr)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Collection, Context, Exit

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task

if TYPE_CHECKING:
    from deploy_lib.tune import Planned

HELP = {
    "vary": "KEY=V1,V2,...: a profile path (memory.max_running_requests=64,256,1024; features.cuda_graph=true,false) "
            "or patches=none,fusion-sm120; repeat for a grid",
    "spec": "a sweep spec file, tune/NAME.yaml: vary, bench, ladder, objective, level, sla, keep",
    "dry_run": "print the candidates, what differs flag by flag, the skipped ones and the time it takes; "
               "change nothing",
    "resume": "a sweep's id: run the candidates it did not finish (their figures are in history)",
    "keep": "winner (default): keep the winner when it beats the pre-sweep release beyond the noise; none: report only",
}


@task(name="tune", default=True, iterable=["vary"], help=HELP)
def tune(c: Context, profile: str | None = None, vary: list[str] | None = None, spec: str | None = None,
         host: str | None = None, inventory: str | None = None, dry_run: bool = False, resume: str | None = None,
         keep: str | None = None, yes: bool = False, accept_new_host_key: bool = False, json: bool = False,
         verbose: bool = False) -> None:
    """Sweep profile settings and patch sets on one host: each candidate a release, benchmarked over a ladder."""
    from deploy_lib import tune as tuning
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import list_patch_sets

    common.report_as(json, verbose)
    loaded, target = common.load(profile, inventory, host, accept_new_host_key)
    given = {"keep": keep} if keep else {}
    if resume is None:
        sweep_spec, sources = common.run(lambda: tuning.sweep_spec(Path(spec) if spec else None, vary or [], given))
    elif vary or spec or keep:
        raise Exit("error: --resume continues the sweep as it was started: drop --vary, --spec and --keep",
                   code=common.BAD_OPTION)
    else:
        sweep_spec, sources = None, {}
    if not dry_run:
        common.consent(f"tune {loaded.name} on {target.host.name}: each candidate restarts the server?", yes)
    request = tuning.Request(sweep_spec, sources, tuple(list_patch_sets(ROLES_DIR)), dict(os.environ),
                             dry_run=dry_run, resume=resume)
    with common.remote(target) as remote:
        result = common.run(lambda: tuning.tune(loaded, target, remote, common.progress(), request))
    common.show(result, lambda shown: ui.print_lines(
        _planned_lines(shown) if isinstance(shown, tuning.Planned) else tuning.table_lines(shown)))


def _planned_lines(planned: Planned) -> list[str]:
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
         service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """Print a sweep's table again, from the host's history."""
    from deploy_lib import tune as tuning
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        report = common.run(lambda: tuning.show(remote, target, common.service_name(service), tune_id))
    common.show(report, lambda shown: ui.print_lines(tuning.table_lines(shown)))


collection = Collection(tune, show)
