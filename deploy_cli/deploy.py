"""deploy, rollback, plan, render, schema: what a profile becomes, and taking hosts to it or back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from invoke import Context

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task
from deploy_lib.versions import NEWEST_SGLANG


@task(help={"sglang_version": f"SGLang version to render for (default {NEWEST_SGLANG})"})
def render(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
           sglang_version: str = NEWEST_SGLANG) -> None:
    """Print the unit, the env file (secrets redacted) and the argv of a profile, without touching any host."""
    from deploy_lib.release.model import build_release
    from deploy_lib.release.server_args import secret_environment
    loaded, target = common.load(profile, inventory, host)

    def build() -> object:
        placeholders = {name: "<secret>" for name in secret_environment(loaded.profile)}
        layout = target.layout(loaded.profile.service.name)
        return build_release(loaded, layout, sglang_version, placeholders, venv=target.venv_override)
    ui.print_release(common.run(build))  # type: ignore[arg-type]


@task(help={"against": "compare with this profile instead of the host's release",
            "sglang_version": "SGLang version for --against renders"})
def plan(c: Context, profile: str | None = None, against: str | None = None, host: str | None = None,
         inventory: str | None = None, sglang_version: str = NEWEST_SGLANG, accept_new_host_key: bool = False,
         verbose: bool = False) -> None:
    """Semantic diff (flags, environment, secrets, venv, patches) of a profile against the host or another profile."""
    from deploy_lib.release.model import build_release, diff_releases
    from deploy_lib.release.server_args import secret_environment
    if against is None:
        deploy(c, profile, host=host, inventory=inventory, dry_run=True, accept_new_host_key=accept_new_host_key,
               verbose=verbose)
        return

    loaded_pair = [common.load(name, inventory, host) for name in (against, profile)]

    def compare() -> list[str]:
        releases = []
        for loaded, target in loaded_pair:
            layout = target.layout(loaded.profile.service.name)
            releases.append(build_release(loaded, layout, sglang_version,
                                          {n: "<secret>" for n in secret_environment(loaded.profile)}))
        changes = diff_releases(releases[0].metadata(), releases[1].metadata())
        names = " -> ".join(loaded.name for loaded, _ in loaded_pair)
        return [f"{names}: {len(changes) or 'no'} change(s)", *(f"  {c}" for c in changes)]
    ui.print_lines(common.run(compare))


@task(help={"output": "write the schema to this file instead of printing it"})
def schema(c: Context, output: str | None = None) -> None:
    """Print the JSON Schema of a profile (for editor completion and checking)."""
    from deploy_lib.profile import profile_json_schema
    text = json.dumps(profile_json_schema(), indent=2)
    if output:
        Path(output).write_text(text + "\n")
    else:
        ui.console.print(text, markup=False)


@task(iterable=["serial"], help={"dry_run": "print the plan and stop (reads the host only)",
                                 "gate": "benchmark the new release and roll it back if slower than the last good one"})
def deploy(c: Context, profile: str | None = None, host: str | None = None, group: str | None = None,
           serial: list[str] | None = None, max_fail: str | None = None, inventory: str | None = None,
           dry_run: bool = False, yes: bool = False, force: bool = False, accept_new_host_key: bool = False,
           gate: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Deploy a profile: plan, preflight, stage, switch, restart, verify; roll back automatically on failure."""
    from deploy_lib.deploy import Options
    from deploy_lib.ops import commands
    common.report_as(json, verbose)
    options = Options(dry_run=dry_run, force=force, environ=dict(os.environ), gate=gate)
    hosts = common.scope(inventory, host, group, accept_new_host_key, common.rollout(serial, max_fail))
    fleet = common.run(lambda: commands.deploy(common.project(), hosts, profile, options, common.reach(yes)))
    common.show_outcomes(fleet, hosts.one_host)


@task(iterable=["serial"], help={"to": "release id (default: the last healthy release before the current one)"})
def rollback(c: Context, to: str | None = None, host: str | None = None, group: str | None = None,
             serial: list[str] | None = None, max_fail: str | None = None, inventory: str | None = None,
             service: str | None = None, accept_new_host_key: bool = False, json: bool = False,
             verbose: bool = False, yes: bool = False) -> None:
    """Switch back to an earlier release on the host and verify it."""
    from deploy_lib.ops import commands
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host, group, accept_new_host_key, common.rollout(serial, max_fail))
    fleet = common.run(lambda: commands.rollback(hosts, common.service_name(service), to, common.reach(yes)))
    common.show_outcomes(fleet, hosts.one_host)
