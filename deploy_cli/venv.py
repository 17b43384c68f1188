"""venv.build, venv.adopt, venv.list, venv.remove: the content-addressed venvs on a host."""

from __future__ import annotations

from pathlib import PurePosixPath

from invoke import Context, Exit

from deploy_cli import common, reports
from deploy_cli import present as ui
from deploy_cli.options import task


@task(name="build", help={"profile": "profile whose service.venv_build lock to build"})
def venv_build(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
               verbose: bool = False, yes: bool = False) -> None:
    """Build (or reuse) the content-addressed venv of a profile's lock on the host; only missing wheels travel."""
    from deploy_lib.venvs import ensure_venv
    common.report_as(verbose=verbose)
    loaded, target = common.load(profile, inventory, host)
    spec = loaded.profile.service.venv_build
    if spec is None:
        raise Exit(f"error: profile {loaded.name} has no service.venv_build", code=2)
    common.consent(f"build the venv of {loaded.name} on {target.host.name}?", yes)
    layout = target.layout(loaded.profile.service.name)
    with common.remote(target) as remote:
        result = common.run(lambda: ensure_venv(remote, layout, spec, progress=common.progress(),
                                                where=target.host.name))
    ui.console.print(f"venv {result.hash} at {result.path}: {'reused' if result.reused else 'built'}, "
                     f"{len(result.wheels_sent)} wheels ({result.bytes_sent} bytes) sent")


@task(name="adopt", help={"path": "the hand-made venv on the host, e.g. /root/ml-env"})
def venv_adopt(c: Context, path: str, host: str | None = None, inventory: str | None = None,
               service: str | None = None, verbose: bool = False, yes: bool = False) -> None:
    """Record a hand-made venv as a managed, immutable one (hard-linked copy); report files that drifted."""
    from deploy_lib.venvs import adopt as adopt_venv
    common.report_as(verbose=verbose)
    target = common.target(inventory, host)
    common.consent(f"adopt {path} as a managed venv on {target.host.name}?", yes)
    layout = target.layout(common.service_name(service))
    with common.remote(target) as remote:
        result = common.run(lambda: adopt_venv(remote, layout, PurePosixPath(path), where=target.host.name))
    reports.print_adopted(result)


@task(name="remove", help={"venv_hash": "the managed venv's hash (`venv.list`)"})
def venv_remove(c: Context, venv_hash: str, host: str | None = None, inventory: str | None = None,
                service: str | None = None, yes: bool = False, verbose: bool = False) -> None:
    """Remove a managed venv (adopted ones stay until removed here) unless a release or derived venv needs it."""
    from deploy_lib.commands import uninstall as remove
    common.report_as(verbose=verbose)
    target = common.target(inventory, host)
    common.consent(f"remove venv {venv_hash} of {common.service_name(service)} on {target.host.name}?", yes)
    with common.remote(target) as remote:
        common.run(lambda: remove.remove_venv(target, common.service_name(service), remote, venv_hash))
    ui.console.print(f"removed venv {venv_hash} and its caches", markup=False)


@task(name="list")
def venv_list(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
              json: bool = False, verbose: bool = False) -> None:
    """List managed venvs: hash, kind, size, the releases using them, derived venvs, versions."""
    from deploy_lib.commands import status as host_status
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        common.show(common.run(lambda: host_status.list_managed_venvs(target, common.service_name(service), remote)),
                    reports.print_venvs)
