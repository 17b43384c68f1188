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
    from deploy_lib.commands.tune_request import Planned, Request
    from deploy_lib.ops.tune_group import GroupTune
    from deploy_lib.tune import TuneReport
    from deploy_lib.tune.estimate import Estimate

HELP = {
    "vary": "KEY=V1,V2,...: a profile path (memory.max_running_requests=64,256,1024; features.cuda_graph=true,false) "
            "or patches=none,fusion-sm120; repeat for a grid",
    "spec": "a sweep spec file, tune/NAME.yaml: vary, bench, ladder, objective, level, sla, keep",
    "dry_run": "print the candidates, what differs flag by flag, the skipped ones and the time it takes; "
               "change nothing",
    "resume": "a sweep's id: run the candidates it did not finish (their figures are in history)",
    "keep": "winner (default): keep the winner when it beats the pre-sweep release beyond the noise; none: report only",
    "group": "a group of replicas: its hosts run different candidates at once (dealt round-robin), the winner is "
             "rolled out to all one host at a time",
    "search": "grid (default): every candidate the full benchmark; halving: every candidate a short benchmark "
              "(a quarter of the output tokens), the best half the full one (spec `halving:` sets eta, the length)",
}


@task(name="tune", default=True, iterable=["vary"], help=HELP)
def tune(c: Context, profile: str | None = None, vary: list[str] | None = None, spec: str | None = None,
         host: str | None = None, group: str | None = None, inventory: str | None = None, dry_run: bool = False,
         resume: str | None = None, keep: str | None = None, search: str | None = None, yes: bool = False,
         accept_new_host_key: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Sweep profile settings and patch sets on one host (or a group's replicas at once): each candidate a release,
    benchmarked over a ladder."""
    from deploy_lib import tune as tuning
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.commands import tune_request
    from deploy_lib.patches import list_patch_sets

    common.report_as(json, verbose)
    given = {key: value for key, value in (("keep", keep), ("search", search)) if value}
    if resume is None:
        sweep_spec, sources = common.run(lambda: tuning.sweep_spec(Path(spec) if spec else None, vary or [], given,
                                                                       common.project().workloads_dir))
    elif vary or spec or given:
        raise Exit("error: --resume continues the sweep as it was started: drop --vary, --spec, --keep and --search",
                   code=common.BAD_OPTION)
    else:
        sweep_spec, sources = None, {}
    patches_dir = common.project().patches_dir
    patch_sets = common.run(lambda: tuple(list_patch_sets(ROLES_DIR, patches_dir)))
    request = tune_request.Request(sweep_spec, sources, patch_sets, dict(os.environ),
                             dry_run=dry_run, resume=resume)
    if group is not None:
        _tune_group(profile, host, group, inventory, accept_new_host_key, request, yes)
        return
    from deploy_lib.ops import dispatch
    loaded, target = common.load(profile, inventory, host, accept_new_host_key)
    result = common.run(lambda: dispatch.tune(common.one_host_scope(target, inventory), loaded, request,
                                              common.reach(yes)))
    common.show(result, lambda shown: ui.print_lines(_result_lines(shown)))


def _tune_group(profile: str | None, host: str | None, group: str, inventory: str | None,
                accept_new_host_key: bool, request: Request, yes: bool) -> None:
    from deploy_lib.deploy.project import load_for_target
    from deploy_lib.ops import dispatch
    from deploy_lib.ops.tune_group import GroupTune

    chosen = common.scope(inventory, host, group, accept_new_host_key)
    loaded = common.run(lambda: load_for_target(common.project(), profile, chosen.inventory, chosen.targets[0]))
    result = common.run(lambda: dispatch.tune(chosen, loaded, request, common.reach(yes)))
    failed = result.exit_code if isinstance(result, GroupTune) else 0
    common.show(result, lambda shown: ui.print_lines(_result_lines(shown)), exit_code=failed)
    if failed:
        raise Exit(code=failed)


def _result_lines(shown: GroupTune | TuneReport | Planned) -> list[str]:
    """A group's table and what each host serves; a multi-node group's (one server) as one host's."""
    from deploy_lib import tune as tuning
    from deploy_lib.commands import tune_request
    if isinstance(shown, tune_request.Planned):
        return planned_lines(shown)
    if isinstance(shown, tuning.TuneReport):
        return table_lines(shown)
    return [*table_lines(shown.report), *(f"{host}: serving {release}"
                                                 for host, release in (shown.serving or {}).items())]


def planned_lines(planned: Planned) -> list[str]:
    """A dry run as text: each candidate with its differences, the skipped ones, the notes and the estimate."""
    lines = [f"{len(planned.sweep.candidates)} candidates against release {planned.original}, benchmark "
             f"{planned.sweep.bench.describe()}:"]
    for candidate in planned.sweep.candidates:
        lines.append(f"  {candidate.label}")
        lines += [f"      {change}" for change in planned.changes[candidate.label]] or ["      (as the release)"]
    lines += [f"skipped {item.label}: {item.reason}" for item in planned.sweep.skipped]
    lines += [*planned.sweep.notes, f"estimate: {estimate_line(planned.estimate)}"]
    return lines


def estimate_line(estimate: Estimate) -> str:
    """`about 38-43 min: 4-7 starts of ~300 s (median of 3 recorded), 6 benchmarks and up to 2 re-runs of ~99 s
    (level 64: 320 prompts ~14 s, level 1024: 1024 prompts ~95 s; each ~5 s of it around the timed requests, from
    2 recorded)`, and which figures are defaults and what would replace them."""
    start = (f"~{estimate.start_s:,.0f} s (median of {estimate.start_samples} recorded)" if estimate.start_samples
             else f"~{estimate.start_s:,.0f} s (default: no start recorded on this host)")
    levels = ", ".join(f"level {level.concurrency}: {level.prompts} prompts ~{level.seconds:,.0f} s"
                       + ("" if level.recorded else " (default pace: never run here at these lengths)")
                       for level in estimate.levels)
    overhead = estimate.levels[0].overhead_s if estimate.levels else 0.0
    around = (f"from {estimate.overhead_samples} recorded" if estimate.overhead_samples
              else "default: no benchmark's wall time recorded on this host")
    reruns = "" if not estimate.reruns.most else f" and up to {estimate.reruns.most} re-runs"
    bench = (f"{estimate.runs} benchmarks{reruns} of ~{estimate.bench_s:,.0f} s ({levels}; each level "
             f"~{overhead:,.0f} s of it around the timed requests, {around})")
    if estimate.short_runs:
        bench += f", {estimate.short_runs} short ones of ~{estimate.short_s:,.0f} s"
    fewest, most = round(estimate.fewest_s / 60), round(estimate.most_s / 60)
    about = f"about {fewest:,} min" if fewest == most else f"about {fewest:,}-{most:,} min"
    line = f"{about}: {estimate.starts.text()} starts of {start}, {bench}"
    if estimate.defaults:
        line += "; defaults stand where this host has no record: a deploy, `invoke bench` or a sweep records them"
    return line


def table_lines(report: TuneReport) -> list[str]:
    """The table as text lines (for `tune.show` and the end of a sweep): one row per candidate and level."""
    head = (f"tune {report.tune_id}: {report.profile}, objective {report.spec.objective.value}"
            f"{f' at {report.spec.level}' if report.spec.level else ''}, SLA {report.spec.sla.describe()}"
            f"{f', workload {shape}' if (shape := report.spec.bench and report.spec.bench.workload_name) else ''}")
    lines = [head, f"{'candidate':<44} {'outcome':<10} {'level':>6} {'out tok/s':>10} {'req/s':>7} "
                   f"{'TTFT p99':>9} {'TPOT p99':>9} {'SLA':<4} power"]
    for row in ([report.base] if report.base else []) + list(report.rows):
        levels = row.levels or (None,)
        for index, level in enumerate(levels):
            first = index == 0
            cells = (f"{level.concurrency:>6} {level.output_tok_s:>10,.1f} {level.request_rate:>7.2f} "
                     f"{_ms(level.ttft.p99_ms):>9} {_ms(level.tpot.p99_ms):>9}") if level else f"{'':>45}"
            lines.append(f"{row.label if first else '':<44} {row.outcome if first else '':<10} {cells} "
                         f"{('yes' if row.sla_met else 'no') if first else '':<4} {row.power if first else ''}")
        if row.changes:
            lines.append(f"    {row.changes}")
        if row.downtime:
            lines.append(f"    {row.downtime.line()}")
        if row.cause and not row.sla_met:
            lines.append(f"    {row.cause}")
    if report.finished:
        lines.append(f"winner: {report.winner or 'none'}; serving: {report.serving}; {report.reason}")
    else:
        lines.append(f"not finished: `invoke tune --resume {report.tune_id}` runs the rest")
    return lines


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms"


@task(name="show", help={"tune_id": "the sweep's id (`tune` prints it)"})
def show(c: Context, tune_id: str, host: str | None = None, inventory: str | None = None,
         service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """Print a sweep's table again, from the host's history."""
    from deploy_lib.commands import tune as tuning
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        report = common.run(lambda: tuning.show(remote, target, common.service_name(service), tune_id))
    common.show(report, lambda shown: ui.print_lines(table_lines(shown)))


collection = Collection(tune, show)
