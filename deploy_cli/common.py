"""What every task shares: the project (found from the working directory), the hosts named by --host/--group, how
the library reaches them (connections, progress, consent: ops.Reach), one library call with its error as exit code,
and a command's end printed for one host or a group."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from invoke import Exit

from deploy_cli import present as ui
from deploy_cli.options import given_limit
from deploy_lib.deploy.project import Project, Target, load_for_host, profile_for_host, resolve_target
from deploy_lib.errors import EXIT_CODES, ConfigError, DeployError
from deploy_lib.profile import LoadedProfile, ServiceSpec

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.ops.fleet import FleetRun, Rollout
    from deploy_lib.ops.scope import Reach, Scope
    from deploy_lib.remote import FabricRemote

T = TypeVar("T")
BAD_OPTION = EXIT_CODES[ConfigError]
IN_USE_HELP = ("profile: a name or a path (default: the host's `profile` var in the inventory, else the profile of "
               "the host's current release)")


@dataclass(frozen=True)
class Output:
    """How the running task reports: `--json` puts one JSON document on stdout and everything else (progress,
    warnings, errors) on stderr; `-v` shows every remote step as it comes back."""

    as_json: bool = False
    verbose: bool = False
    failure: Callable[[DeployError], dict[str, Any]] = ui.failure_json  # a failure's --json document, as the
    # command's own document is shaped (a deploy's outcome by default, status: a status report)


_output = Output()  # one task per command line; each task that takes --json or -v sets it first


def report_as(as_json: bool = False, verbose: bool = False,
              failure: Callable[[DeployError], dict[str, Any]] = ui.failure_json) -> None:
    global _output
    _output = Output(as_json, verbose, failure)


def output() -> Output:
    return _output


def run(action: Callable[[], T]) -> T:
    """Run one library call; a DeployError becomes its message (and with --json its JSON) and its exit code."""
    try:
        return action()
    except DeployError as error:
        if _output.as_json:
            ui.print_json(_output.failure(error))
        ui.print_error(error)
        raise Exit(code=error.exit_code) from None


@cache
def project() -> Project:
    """The user's project: found from the working directory (deploy_lib.deploy.project.Project.find)."""
    return run(lambda: Project.find(Path.cwd(), os.environ))


def inventory_given(given: str | None) -> str | None:
    return given or os.environ.get("SGLANG_DEPLOY_INVENTORY")


def service_name(service: str | None) -> str:
    return service or ServiceSpec().name


def target(inventory: str | None, host: str | None, accept_new_host_key: bool = False) -> Target:
    """The inventory's host (within the task's --limit); vars that look like typos are warned about."""
    host = limited_host(inventory, host)
    found = run(lambda: resolve_target(project().inventory(inventory_given(inventory)), host, accept_new_host_key))
    ui.print_warnings(found.host.warnings)
    return found


def limited_host(inventory: str | None, host: str | None) -> str | None:
    """--host as the task's --limit allows it, or the one host the limit names (ops.scope.host_within): a task's
    one-host path (tune without --group, logs --follow, plan --against) is narrowed as its group path is."""
    from deploy_lib.ops.scope import host_within
    limit = given_limit()
    if limit is None:
        return host
    return run(lambda: host_within(project().inventory(inventory_given(inventory)), host, limit))


def load(profile: str | None, inventory: str | None, host: str | None, accept_new_host_key: bool = False,
         overrides: Sequence[str] = ()) -> tuple[LoadedProfile, Target]:
    """Profile (with `--set` overrides) and host (within the task's --limit), checked against each other; vars that
    look like typos are warned about."""
    host = limited_host(inventory, host)
    loaded, found = run(lambda: load_for_host(project(), profile, inventory_given(inventory), host,
                                              accept_new_host_key, overrides))
    ui.print_warnings(found.host.warnings)
    return loaded, found


def profile_in_use(profile: str | None, found: Target, remote: FabricRemote, service: str | None) -> LoadedProfile:
    """The profile given or named by the inventory, else the one the host's current release was deployed from."""
    from deploy_lib.commands import releases as host_releases
    return run(lambda: profile_for_host(project(), profile, found)
               or host_releases.current_profile(found, service_name(service), remote))


def rollout(serial: list[str] | None, max_fail: str | None) -> Rollout | None:
    """--serial and --max-fail; None without them (every host at once): a one-host command never loads the fleet."""
    if not serial and max_fail is None:
        return None
    from deploy_lib.ops.fleet import Rollout
    return run(lambda: Rollout.parse(serial or (), max_fail))


def scope(inventory: str | None, host: str | None, group: str | None = None, accept_new_host_key: bool = False,
          rolled: Rollout | None = None) -> Scope:
    """The hosts --host or --group name, narrowed by the task's --limit (ops.scope.select); their vars that look like
    typos are warned about."""
    from deploy_lib.ops.scope import select
    limit = given_limit()
    chosen = run(lambda: select(project().inventory(inventory_given(inventory)), host, group, accept_new_host_key,
                                rolled, limit))
    for each in chosen.targets:
        ui.print_warnings(each.host.warnings)
    return chosen


def one_host_scope(found: Target, inventory: str | None) -> Scope:
    """A host already resolved (its warnings shown) as the scope of a command on it alone."""
    from deploy_lib.ops.scope import Scope
    return Scope(project().inventory(inventory_given(inventory)), (found,))


def consent_possible(yes: bool) -> None:
    """For a task that can ask only once connected: refuse at once when there is no terminal to answer on."""
    if not yes:
        run(ui.require_terminal)


def remote(found: Target, prefixed: bool = False) -> FabricRemote:
    from deploy_lib.remote import FabricRemote
    host = found.host.name if prefixed else ""
    return FabricRemote(found.ssh, on_result=ui.step_printer(host=host) if _output.verbose else None)


def progress(host: str = "") -> ui.TerminalProgress:
    return ui.TerminalProgress(ui.errors if _output.as_json else ui.console, host)


def reach(yes: bool = True) -> Reach:
    """How the library's operations reach the hosts from this terminal: a FabricRemote each, progress lines,
    consent by --yes or at the terminal, the one way every task that changes a host asks (a refusal is exit 1,
    nothing changed); the project's hooks/."""
    from deploy_lib.ops.scope import Reach

    def asked(question: str) -> None:
        if not yes and not ui.confirm(question):
            raise Exit("cancelled: nothing was changed", code=1)
    return Reach(remote, progress, asked, dict(os.environ), project_root=project().root)


def show(report: T, print_table: Callable[[T], None]) -> None:
    if _output.as_json:
        ui.print_json(report)
    else:
        print_table(report)


def show_each(fleet: FleetRun[T], print_report: Callable[[T], None], one_host: bool) -> None:
    """A read-only task's reports: one host's as it is, a group's host by host; exit with the worst host's code."""
    if one_host:
        report = fleet.runs[0].result
        assert report is not None  # a one-host command's error was raised; no task's report is None
        show(report, print_report)
        return
    if _output.as_json:
        ui.print_json({run.host: _output.failure(run.error) if run.error else run.result for run in fleet.runs})
    else:
        ui.print_each_host(fleet, print_report)
    if fleet.exit_code:
        raise Exit(code=fleet.exit_code)


def show_outcomes(fleet: FleetRun[Outcome], one_host: bool) -> None:
    """A deploy's or rollback's end. One host: its outcome. A group: plans (dry run), the per-host table; exit 0
    only when every host is on its new release, else the worst host's code."""
    if one_host:
        outcome = fleet.runs[0].result
        assert outcome is not None  # a one-host command's error was raised
        if _output.as_json:
            ui.print_json(ui.outcome_json(outcome))
        else:
            ui.print_outcome(outcome)
        return
    from deploy_lib.ops.fleet import outcome_end, summarize
    from deploy_lib.outcomes import Action
    summary = summarize(fleet, outcome_end)
    ui.print_host_errors(fleet)
    if _output.as_json:
        ui.print_json(ui.fleet_json(fleet, summary, ui.outcome_json))
    else:
        for each in fleet.runs:
            if each.result is not None and each.result.plan is not None and each.result.action is Action.planned:
                ui.console.rule(each.host)
                ui.print_plan(each.result.plan)
        ui.print_fleet(summary)
    if summary.exit_code:
        raise Exit(code=summary.exit_code)
