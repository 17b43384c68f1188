"""start, stop, restart, uninstall, adopt, unlock: a host's server and its store, without a new release."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from invoke import Context, Exit

from deploy_cli import common, reports
from deploy_cli import present as ui
from deploy_cli.options import task

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.ops.fleet import FleetRun

GROUP_HELP = {"group": "inventory group: every host of it at once (a multi-node release as a whole; replicas "
                       "behind a router one at a time); exclusive with --host"}


@task(help=GROUP_HELP)
def stop(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
         service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Stop the server (the current release stays current; `start` brings it back)."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.stop(hosts, common.service_name(service), common.reach(yes)))
    _show_lifecycle(fleet, hosts.one_host)


def _show_lifecycle(fleet: FleetRun[Outcome], one_host: bool) -> None:
    common.show_each(fleet, ui.print_outcome, one_host)


def _start(restart: bool, host: str | None, group: str | None, inventory: str | None, service: str | None,
           yes: bool, json: bool, verbose: bool) -> None:
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.start(hosts, common.service_name(service), restart, common.reach(yes)))
    _show_lifecycle(fleet, hosts.one_host)


@task(help=GROUP_HELP)
def start(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
          service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Start the current release and wait until it serves (readiness ladder); rolled back if it cannot start."""
    _start(False, host, group, inventory, service, yes, json, verbose)


@task(help=GROUP_HELP)
def restart(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
            service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Restart the current release and wait until it serves (readiness ladder); rolled back if it cannot start."""
    _start(True, host, group, inventory, service, yes, json, verbose)


@task(help=GROUP_HELP)
def uninstall(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
              service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Remove the unit, releases, managed venvs and caches from the host; history is copied here first."""
    from deploy_lib.commands.uninstall import local_state_dir
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.uninstall(hosts, common.service_name(service), local_state_dir(os.environ),
                                                  common.reach(yes)))
    common.show_each(fleet, reports.print_uninstalled, hosts.one_host)


@task(help={"pid": "process id of the SGLang server running by hand on the host (`pgrep -af sglang.launch_server`)",
            "profile": "name of the profile to write (inventory/profiles/NAME.yaml; must not exist)",
            "unit": "a hand-written systemd unit running the server; it becomes the service of that name",
            "service": "service name to manage a --pid server as (default sglang)"})
def adopt(c: Context, profile: str, pid: str | None = None, unit: str | None = None, host: str | None = None,
          inventory: str | None = None, service: str | None = None, yes: bool = False,
          accept_new_host_key: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Take over a server started by hand (--pid, or --unit for a hand-written systemd unit): record it as release 0
    and write the profile that reproduces it."""
    from deploy_lib.ops import dispatch
    from deploy_lib.profile import profile_path
    common.report_as(json, verbose)
    if (pid is None) == (unit is None) or (pid is not None and not pid.isdigit()):
        raise Exit("error: adopt takes --pid PID (a process id) or --unit NAME (a systemd unit), one of them",
                   code=2)
    path = common.run(lambda: profile_path(common.project().profiles_dir, profile))
    if path.exists():
        raise Exit(f"error: {path} exists; adopt writes a new profile, give another --profile name", code=2)
    target = common.target(inventory, host, accept_new_host_key)
    result = common.run(lambda: dispatch.adopt(common.one_host_scope(target, inventory), common.service_name(service),
                                               profile, int(pid) if pid else None, unit, common.reach(yes)))
    path.write_text(result.profile_text)
    common.show({**ui.jsonable(result), "profile_path": str(path)},
                lambda _: reports.print_adopted_server(result, path))


@task(help={"force": "remove the lock even if its owner looks alive"})
def unlock(c: Context, force: bool = False, host: str | None = None, inventory: str | None = None,
           service: str | None = None, json: bool = False, verbose: bool = False, yes: bool = False) -> None:
    """Remove a stale deploy lock (or any lock, with --force)."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    removed = common.run(lambda: dispatch.unlock(common.one_host_scope(target, inventory),
                                                 common.service_name(service), force, common.reach(yes)))
    common.show({"removed": removed}, lambda _: ui.console.print(
        f"removed the lock held by {removed.owner}" if removed else "there was no lock", markup=False))
