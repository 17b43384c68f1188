"""venv.build, venv.adopt, venv.list, venv.remove: the content-addressed venvs on a host."""

from __future__ import annotations

from pathlib import PurePosixPath

from invoke import Context

from deploy_cli import common, reports
from deploy_cli import present as ui
from deploy_cli.options import task


@task(name="build", help={"profile": "profile whose service.venv_build lock to build"})
def venv_build(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
               json: bool = False, verbose: bool = False, yes: bool = False) -> None:
    """Build (or reuse) the content-addressed venv of a profile's lock on the host; only missing wheels travel."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    loaded, target = common.load(profile, inventory, host)
    common.show(common.run(lambda: dispatch.venv_build(common.one_host_scope(target, inventory), loaded,
                                                       common.reach(yes))), reports.print_built)


@task(name="adopt", help={"path": "the hand-made venv on the host, e.g. /root/ml-env"})
def venv_adopt(c: Context, path: str, host: str | None = None, inventory: str | None = None,
               service: str | None = None, json: bool = False, verbose: bool = False, yes: bool = False) -> None:
    """Record a hand-made venv as a managed, immutable one (hard-linked copy); report files that drifted."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    common.show(common.run(lambda: dispatch.venv_adopt(common.one_host_scope(target, inventory),
                                                       common.service_name(service), PurePosixPath(path),
                                                       common.reach(yes))), reports.print_adopted)


@task(name="remove", help={"venv_hash": "the managed venv's hash (`venv.list`)"})
def venv_remove(c: Context, venv_hash: str, host: str | None = None, inventory: str | None = None,
                service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """Remove a managed venv (adopted ones stay until removed here) unless a release or derived venv needs it."""
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    removed = common.run(lambda: dispatch.venv_remove(common.one_host_scope(target, inventory),
                                                      common.service_name(service), venv_hash, common.reach(yes)))
    common.show(removed, lambda _: ui.console.print(f"removed venv {venv_hash} and its caches", markup=False))


@task(name="list")
def venv_list(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
              json: bool = False, verbose: bool = False) -> None:
    """List managed venvs: hash, kind, size, the releases using them, derived venvs, versions."""
    from deploy_lib.commands import host_contents
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        common.show(common.run(lambda: host_contents.list_managed_venvs(target, common.service_name(service), remote)),
                    reports.print_venvs)
