"""router.deploy, router.status: SGLang's router in front of a group's servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context, Exit

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task

if TYPE_CHECKING:
    from deploy_lib.deploy.project import Target
    from deploy_lib.inventory.model import Inventory
    from deploy_lib.ops.router import RouterSite


def _router_of(inventory: str | None, group: str, accept_new_host_key: bool
               ) -> tuple[Inventory, list[Target], RouterSite, Target]:
    """The group's hosts, its router (the inventory's `router` var) and the router's host."""
    from deploy_lib.ops.router import router_site
    hosts = common.scope(inventory, None, group, accept_new_host_key)
    site = common.run(lambda: router_site(hosts.inventory, [target.host for target in hosts.targets]))
    if site is None:
        raise Exit(f"error: no host of group {group} names a router: set `router: HOST` in the group's vars "
                   "(docs/router.md)", code=common.BAD_OPTION)
    return hosts.inventory, list(hosts.targets), site, common.target(inventory, site.host.name, accept_new_host_key)


@task(name="deploy", help={
    "group": "the group whose servers the router serves (its hosts' `router` var names the router's host)",
    "profile": "the servers' profile, for their port (default: each host's `profile` var)"})
def router_deploy(c: Context, group: str, profile: str | None = None, inventory: str | None = None,
                  yes: bool = False, accept_new_host_key: bool = False, json: bool = False,
                  verbose: bool = False) -> None:
    """Deploy SGLang's router (sglang-router) in front of a group's servers, as its own unit and release."""
    from deploy_lib.ops import dispatch
    from deploy_lib.ops.router import replica_urls
    common.report_as(json, verbose)
    known, targets, site, router_target = _router_of(inventory, group, accept_new_host_key)
    workers = common.run(lambda: replica_urls(common.project(), profile, known, targets))
    outcome = common.run(lambda: dispatch.router_deploy(common.one_host_scope(router_target, inventory), site,
                                                        workers, group, common.reach(yes)))
    common.show(outcome, ui.print_router_outcome)


@task(name="status", help={"group": "the group whose router to ask"})
def router_status(c: Context, group: str, inventory: str | None = None, json: bool = False,
                  verbose: bool = False) -> None:
    """The workers the group's router lists, and whether it finds each healthy."""
    from deploy_lib.ops.router import router_workers
    common.report_as(json, verbose)
    _, _, site, router_target = _router_of(inventory, group, False)
    with common.remote(router_target) as remote:
        common.show(common.run(lambda: router_workers(remote, site)), ui.print_router_workers)
