"""The read-only reports as tables: status, releases, venvs, models, patch sets, benchmarks, gpu-check, adoption."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from deploy_cli import present
from deploy_cli.present import _table

if TYPE_CHECKING:
    from deploy_lib.commands.adopt import Adopted
    from deploy_lib.commands.releases import ReleaseRow
    from deploy_lib.commands.status import StatusReport
    from deploy_lib.commands.uninstall import Uninstalled
    from deploy_lib.gpu_check import GpuCheckReport
    from deploy_lib.gpu_check.p2p import P2pVerdict
    from deploy_lib.host.models import StoredModel
    from deploy_lib.host.venv_lifecycle import VenvRecord
    from deploy_lib.host.venv_publish import VenvResult
    from deploy_lib.metrics.workload import Workload
    from deploy_lib.patches import AuditReport, CheckReport, PatchSet
    from deploy_lib.throughput import BenchResult, ComparisonRow


def _print(text: object, **options: Any) -> None:
    """On present.console, looked up at each call: the width is the terminal's, and a test may swap it."""
    present.console.print(text, **options)


def print_status(report: StatusReport) -> None:
    meta = report.metadata
    _print(f"host {report.host}, service {report.service}")
    if report.current_problem:
        _print(f"[bold red]{escape(report.current_problem)}[/bold red]")
    elif report.current:
        age = f"{report.current_age_s / 60:.0f} min" if report.current_age_s is not None else "?"
        _print(f"release {report.current} ({meta.get('profile_name')}), staged {age} ago")
        _print(f"SGLang {meta.get('sglang_version')}, FlashInfer {meta.get('flashinfer_version') or '?'}, "
                      f"venv {meta.get('venv')}, patches: {', '.join(meta.get('patches') or []) or 'none'}")
        if report.venv_versions:
            _print("installed: " + ", ".join(f"{k} {v}" for k, v in report.venv_versions.items()), markup=False)
        for distribution, where in report.venv_sources.items():
            _print(f"{distribution} {where}", markup=False)
        if report.venv_problem:
            _print(f"[yellow]{escape(report.venv_problem)}[/yellow]")
    else:
        _print("no release deployed")
    restarts = f" (NRestarts={report.restarts} since the deploy)" if report.current else ""
    _print(f"unit {report.unit_state}{restarts}; {report.readiness}")
    if report.last_start:
        _print(f"last start: {report.last_start}", markup=False)
    if report.last_downtime:
        _print(f"last switch: {report.last_downtime.line()}", markup=False)
    if report.endpoint:
        _print(f"endpoint {report.endpoint} (OpenAI API under {report.endpoint}/v1)", markup=False)
    if report.live_load is not None:
        _print(report.live_load.line(), markup=False)
    elif report.live_load_problem and report.current:
        _print(f"live load: {report.live_load_problem}", markup=False)
    if report.weights_cache:
        _print(report.weights_cache, markup=False)
    for item in report.drift:
        _print(f"[yellow]drift:[/yellow] {escape(item)}")
    if report.current and not report.drift:
        _print("no drift: the unit and env file are as deployed")
    crashes = report.crashes
    if crashes is not None and crashes.last is not None:
        _print(f"last crash {crashes.last.when:%Y-%m-%d %H:%M:%S} UTC: {escape(crashes.last.cause)}")
        _print(escape(crashes.verdict or ""), style="red" if crashes.down else "yellow")
    if report.advice:
        _print(f"[bold]{escape(report.advice)}[/bold]")
    if report.lock_holder:
        _print(f"[yellow]locked by {escape(report.lock_holder)}[/yellow]")
    if report.gpus is None:
        _print(f"GPUs: {report.gpu_error}")
        return
    names = sorted({f"{gpu.name} ({gpu.arch})" for gpu in report.gpus})
    _print(f"{len(report.gpus)} GPUs: {', '.join(names)}")
    if report.topology:
        _print(f"topology: {escape(report.topology)}")
    if report.peer_to_peer is not None:
        verdict = report.peer_to_peer
        _print(verdict.one_line(), markup=False)
        for note in verdict.notes:
            if note.startswith(("Proxmox node", "not read")):
                _print(f"  {note}", markup=False)
        if not all(pair.p2p for pair in verdict.pairs):
            _print("  each pair's cause and fix: `invoke gpu-check` (or `status --json`)", markup=False)
    table = _table("GPU", "memory used / total (MiB)", "power draw / limit (W)", "util %")
    for gpu in report.gpus:
        power = f"{gpu.power_draw_w:.0f} / {gpu.power_limit_w:.0f}" if gpu.power_draw_w is not None \
            and gpu.power_limit_w is not None else "n/a"
        table.add_row(str(gpu.index), f"{gpu.memory_used_mib:.0f} / {gpu.memory_total_mib:.0f}", power,
                      f"{gpu.utilization_pct:.0f}" if gpu.utilization_pct is not None else "n/a")
    _print(table)


def print_adopted_server(result: Adopted, path: Path) -> None:
    _print(f"adopted pid {result.pid} on {result.host} as release {result.release_id} (SGLang "
                  f"{result.sglang_version}, venv {result.venv}); profile written to {path}", markup=False)
    for note in result.notes:
        _print(f"  note: {note}", markup=False)
    if result.secret_names:
        _print(f"  secrets by reference: export {', '.join(result.secret_names)} before deploying "
                      "(their values are only in release 0's env file on the host)", markup=False)
    _print(f"next: `invoke plan --profile {result.profile_name}`, then deploy it; `invoke rollback --to "
                  f"{result.release_id}` returns to what ran before", markup=False)


def print_uninstalled(result: Uninstalled) -> None:
    for item in result.removed:
        _print(f"removed {item}", markup=False)
    for item in result.kept_on_host:
        _print(f"kept {item}", markup=False)
    _print(f"history and release records of {result.host}/{result.service} copied to {result.copy}",
                  markup=False)


def print_gpu_check(report: GpuCheckReport) -> None:
    subject = report.subject
    _print(f"gpu-check with {subject.source}: venv {subject.venv}, TP {subject.world_size}")
    _print(f"topology: {report.topology.one_line() if report.topology else report.topology_error}")
    if report.advice:
        for name, value in report.advice.environment.items():
            _print(f"advice: {name}={value}")
        for reason in report.advice.reasons:
            _print(f"  because {escape(reason)}")
        for warning in report.advice.warnings:
            _print(f"[yellow]warning: {escape(warning)}[/yellow]")
    lines = report.check.lines()
    for line in lines[:-1]:
        _print(escape(line))
    _print(lines[-1], style="green" if report.check.verified else "red")
    if report.peer_to_peer is not None:
        print_peer_to_peer(report.peer_to_peer)


def print_peer_to_peer(verdict: P2pVerdict) -> None:
    """gpu-check's "peer-to-peer" section: per pair P2P or not, each cause with its fix and trade-off, the advice
    until then; the verdict's own lines, coloured by what they say."""
    for line in verdict.lines():
        text = line.strip()
        style = "bold" if text == "peer-to-peer:" else "green" if text.startswith("GPU") and ": P2P" in text else \
            "red" if text.startswith("GPU") else "yellow" if text.startswith("cause:") else \
            "bold" if text.startswith("fix:") else "red" if text.startswith("disagrees:") else None
        _print(line, style=style, markup=False)


def print_releases(rows: list[ReleaseRow]) -> None:
    table = _table("", "release", "staged", "profile", "SGLang", "outcome", "output tok/s", "GPU power (bench)")
    for column in table.columns[1:4]:
        column.no_wrap = True
    for row in rows:
        table.add_row("*" if row.is_current else "", row.id, row.staged_at[:16].replace("T", " "), row.profile,
                      row.sglang_version, row.outcome, row.throughput, row.gpu_power)
    _print(table)
    for row in rows:  # one line each: the phases do not fit the table's width
        if row.last_start:
            _print(f"{row.id} last start: {row.last_start}", markup=False)
        if row.last_downtime:
            _print(f"{row.id} last switch: {row.last_downtime.line()}", markup=False)


def print_workload(workload: Workload, path: Path) -> None:
    for line in workload.lines():
        _print(line, markup=False)
    _print(f"written to {path}; name it in a profile's bench: (workload: {workload.name}) to benchmark this shape",
           markup=False)


def print_bench(result: BenchResult) -> None:
    _print(f"release {result.release_id}: {result.settings.describe()}")
    _print(result.summary())
    for gpu in result.gpus:
        _print(f"  {gpu.line()}")


def print_comparison(results: list[BenchResult], rows: list[ComparisonRow]) -> None:
    first = results[0].release_id
    table = _table("", *(r.release_id for r in results), *(f"{r.release_id} / {first}" for r in results[1:]))
    for row in rows:
        table.add_row(row.label, *map(_figure, row.values),
                      *(f"{value:.2f}" if value is not None else "" for value in row.ratios[1:]))
    _print(table)


def _figure(value: float | None) -> str:
    return f"{value:,.1f}" if value is not None else ""


def print_built(result: VenvResult) -> None:
    _print(f"venv {result.hash} at {result.path}: {'reused' if result.reused else 'built'}, "
           f"{len(result.wheels_sent)} wheels ({result.bytes_sent} bytes) sent", markup=False)


def print_adopted(result: VenvResult) -> None:
    _print(f"adopted as venv {result.hash} at {result.path} ({'already managed' if result.reused else 'new'})")
    for distribution, directory in result.editable.items():
        _print(f"{distribution} editable: {directory} (its files stay there; the managed venv imports them "
                      "from the checkout)")
    for distribution, files in result.drift.items():
        _print(f"[yellow]drift[/yellow] {distribution}: {len(files)} file(s) differ from its RECORD, e.g. "
                      f"{files[0][0]}")


def print_venvs(records: list[VenvRecord]) -> None:
    table = _table("venv", "kind", "size (MiB)", "releases", "derived", "versions")
    for record in records:
        size = f"{record.size_bytes / 2**20:.0f}" if record.size_bytes is not None else "?"
        versions = ", ".join(f"{k} {v}" for k, v in record.versions().items())
        table.add_row(record.hash, record.kind, size, ", ".join(record.releases), ", ".join(record.derived),
                      versions)
    _print(table)


def print_models(models: list[StoredModel]) -> None:
    table = _table("model", "revision", "where", "size (MiB)", "files", "staged by deploy", "releases")
    for item in models:
        table.add_row(item.name, item.version, item.location, f"{item.size_bytes / 2**20:.1f}", str(item.files),
                      "yes" if item.staged else "no (kept)", ", ".join(item.releases))
    _print(table)


def print_patch_sets(patch_sets: list[PatchSet]) -> None:
    table = _table("patch set", "from", "packages", "GPUs", "targets", "description")
    for patch_set in patch_sets:
        meta = patch_set.meta
        table.add_row(meta.name, f"{patch_set.origin}: {patch_set.directory}", ", ".join(meta.packages),
                      ", ".join(meta.applies_to) or "any", ", ".join(meta.targets), meta.description)
    _print(table)


def print_check(report: CheckReport) -> None:
    _print(f"{report.patch_set}: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    present.print_lines(report.summary_lines())
    for warning in report.warnings:
        _print(f"[yellow]![/yellow] {escape(warning)}")


def print_audit(report: AuditReport) -> None:
    present.print_lines(report.summary_lines())
