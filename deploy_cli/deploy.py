"""deploy, rollback, plan, render, schema: what a profile becomes, and taking hosts to it or back."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context, Exit

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task
from deploy_lib.versions import NEWEST_SGLANG

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.ops.fleet import FleetRun, Rollout


SET_HELP = {"set_": "override a profile value: --set path.to.key=value (repeatable; checked by the profile's schema "
                    "like the file, shown in the plan, recorded in the release)"}


@task(operand="profile", iterable=["set_"],
      help={"sglang_version": f"SGLang version to render for (default {NEWEST_SGLANG})", **SET_HELP})
def render(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
           sglang_version: str = NEWEST_SGLANG, set_: list[str] | None = None, json: bool = False) -> None:
    """Print the unit, the env file (secrets redacted) and the argv of a profile, without touching any host."""
    from deploy_lib.release.model import build_release, placeholder_secrets
    from deploy_lib.release.server_args import parse_version
    common.report_as(json)
    common.run(lambda: parse_version(sglang_version, "--sglang-version"))
    loaded, target = common.load(profile, inventory, host, overrides=set_ or ())
    release = common.run(lambda: build_release(loaded, target.layout(loaded.profile.service.name), sglang_version,
                                               placeholder_secrets(loaded.profile), venv=target.venv_override))
    common.show(ui.release_json(release), lambda _: ui.print_release(release))


@task(operand="profile", iterable=["set_"], help={"against": "compare with this profile instead of the host's release",
                              "sglang_version": "SGLang version for --against renders",
                              "detailed_exitcode": "exit 0 when nothing would change, 2 when something would, 1 on "
                                                   "any error (Terraform's drift check)", **SET_HELP})
def plan(c: Context, profile: str | None = None, against: str | None = None, host: str | None = None,
         group: str | None = None, inventory: str | None = None, sglang_version: str = NEWEST_SGLANG,
         set_: list[str] | None = None, accept_new_host_key: bool = False, detailed_exitcode: bool = False,
         json: bool = False, verbose: bool = False) -> None:
    """Semantic diff (flags, environment, secrets, venv, patches) of a profile against the host or another profile."""
    common.report_as(json, verbose, detailed_exitcode=detailed_exitcode)
    try:
        changed = _plan(profile, against, host, group, inventory, sglang_version, set_ or (), accept_new_host_key)
    except Exit as ended:  # with --detailed-exitcode 2 means "changes", so every failure is 1
        if detailed_exitcode and ended.code:
            raise Exit(ended.message, code=1) from None
        raise
    if detailed_exitcode and changed:
        raise Exit(code=2)


def _plan(profile: str | None, against: str | None, host: str | None, group: str | None, inventory: str | None,
          sglang_version: str, overrides: Sequence[str], accept_new_host_key: bool) -> bool:
    """Print the plan; True when something would change."""
    if against is None and sglang_version != NEWEST_SGLANG:
        raise Exit("error: --sglang-version is for --against renders: a plan against the host reads the SGLang of "
                   "its venv", code=common.BAD_OPTION)
    if against is None:
        from deploy_lib.ops.fleet import would_change
        fleet, one_host = _deploy_run(profile, host, group, None, inventory, overrides, accept_new_host_key,
                                      yes=True, dry_run=True)
        changed = would_change(fleet)
        common.show_outcomes(fleet, one_host, changed)
        return changed
    if group is not None:
        raise Exit("error: --against compares two profiles for one host: give --host, not --group",
                   code=common.BAD_OPTION)
    from deploy_lib.deploy.plan import plan_against
    from deploy_lib.release.server_args import parse_version
    common.run(lambda: parse_version(sglang_version, "--sglang-version"))
    (old, _), (new, target) = [common.load(name, inventory, host, overrides=given)
                               for name, given in ((against, ()), (profile, overrides))]
    changes = common.run(lambda: plan_against(old, new, target, sglang_version))
    names = [old.name, new.name]
    common.show({"from": names[0], "to": names[1], "changes": [str(change) for change in changes]},
                lambda shown: ui.print_lines([f"{' -> '.join(names)}: {len(changes) or 'no'} change(s)",
                                              *(f"  {change}" for change in shown["changes"])]),
                changed=bool(changes), outcome="planned")
    return bool(changes)


@task(help={"output": "write the schema to this file instead of printing it"})
def schema(c: Context, output: str | None = None) -> None:
    """Print the JSON Schema of a profile (for editor completion and checking)."""
    from deploy_lib.profile import profile_json_schema
    text = json.dumps(profile_json_schema(), indent=2)
    if output:
        try:
            Path(output).write_text(text + "\n")
        except OSError as err:
            raise Exit(f"error: -o/--output {output}: cannot write the schema there: {err.strerror or err}",
                       code=common.BAD_OPTION) from None
    else:
        ui.console.print(text, markup=False)


@task(operand="profile", iterable=["serial", "set_"], help={
    "dry_run": "print the plan and stop (reads the host only)",
    "gate": "benchmark the new release and roll it back if slower than the last good one",
    "no_pre_read": "do not read the new weights into the page cache before the old server stops (the new server "
                   "then reads them from disk while the endpoint is down)", **SET_HELP})
def deploy(c: Context, profile: str | None = None, host: str | None = None, group: str | None = None,
           serial: list[str] | None = None, max_fail: str | None = None, inventory: str | None = None,
           set_: list[str] | None = None, dry_run: bool = False, yes: bool = False, force: bool = False,
           accept_new_host_key: bool = False, gate: bool = False, no_pre_read: bool = False, json: bool = False,
           verbose: bool = False) -> None:
    """Deploy a profile: plan, preflight, stage, switch, restart, verify; roll back automatically on failure."""
    common.report_as(json, verbose)
    fleet, one_host = _deploy_run(profile, host, group, common.rollout(serial, max_fail), inventory, set_ or (),
                                  accept_new_host_key, yes, dry_run, force, gate, pre_read=not no_pre_read)
    common.show_outcomes(fleet, one_host)


def _deploy_run(profile: str | None, host: str | None, group: str | None, rolled: Rollout | None,
                inventory: str | None, overrides: Sequence[str], accept_new_host_key: bool, yes: bool,
                dry_run: bool, force: bool = False, gate: bool = False, pre_read: bool = True
                ) -> tuple[FleetRun[Outcome], bool]:
    """The deploy (or its dry run) of the hosts --host/--group name, and whether that is one host."""
    from deploy_lib.commands.deploy import Options
    from deploy_lib.ops import dispatch
    options = Options(dry_run=dry_run, force=force, environ=dict(os.environ), gate=gate, pre_read=pre_read)
    hosts = common.scope(inventory, host, group, accept_new_host_key, rolled)
    return common.run(lambda: dispatch.deploy(common.project(), hosts, profile, options, common.reach(yes),
                                              overrides)), hosts.one_host


@task(iterable=["serial"], help={"to": "release id (default: the last healthy release before the current one)"})
def rollback(c: Context, to: str | None = None, host: str | None = None, group: str | None = None,
             serial: list[str] | None = None, max_fail: str | None = None, inventory: str | None = None,
             service: str | None = None, accept_new_host_key: bool = False, json: bool = False,
             verbose: bool = False, yes: bool = False) -> None:
    """Switch back to an earlier release on the host and verify it."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    common.release_ids("--to", [to] if to is not None else [])
    hosts = common.scope(inventory, host, group, accept_new_host_key, common.rollout(serial, max_fail))
    fleet = common.run(lambda: dispatch.rollback(hosts, common.service_name(service), to, common.reach(yes)))
    common.show_outcomes(fleet, hosts.one_host)
