"""patch, patch-fusion, patches.*: the bundled patch sets and the project's own (patches/) on a host's venv."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from invoke import Context, Exit

from deploy_cli import common, reports
from deploy_cli import present as ui
from deploy_cli.options import task

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.patches import CheckReport, PatchSet

T = TypeVar("T")
FUSION_PATCH_SET = "fusion-sm120"


def _patch_set(name: str) -> PatchSet:
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import find_patch_set
    patches_dir = common.project().patches_dir
    return common.run(lambda: find_patch_set(ROLES_DIR, name, patches_dir))


def _patch_run(profile: str | None, host: str | None, inventory: str | None, service: str | None,
               action: Callable[..., T], *args: object) -> T:
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        loaded = common.profile_in_use(profile, target, remote, service)
        return common.run(lambda: action(remote, *args, loaded, target))


PATCH_HELP = {"name": "patch set name (see `patches.list`)", "profile": common.IN_USE_HELP}


@task(name="list")
def patches_list(c: Context, json: bool = False) -> None:
    """List the patch sets, bundled and the project's own (its patches/ folder), with where each is and what it is
    for."""
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import list_patch_sets
    common.report_as(json)
    patches_dir = common.project().patches_dir
    common.show(common.run(lambda: list_patch_sets(ROLES_DIR, patches_dir)), reports.print_patch_sets)


@task(name="check", help=PATCH_HELP)
def patches_check(c: Context, name: str, profile: str | None = None, host: str | None = None,
                  inventory: str | None = None, service: str | None = None, json: bool = False,
                  verbose: bool = False) -> None:
    """Each target's state (absent, applied, native, conflict) in the current release's venv; changes nothing."""
    from deploy_lib.commands import patches as on_host
    common.report_as(json, verbose)
    common.show(_patch_run(profile, host, inventory, service, on_host.check, _patch_set(name)),
                reports.print_check)


@task(name="audit", help=PATCH_HELP)
def patches_audit(c: Context, name: str, profile: str | None = None, host: str | None = None,
                  inventory: str | None = None, service: str | None = None, json: bool = False,
                  verbose: bool = False) -> None:
    """Every architecture bound on the patch set's code path, with file:line and its value on the set's GPUs."""
    from deploy_lib.commands import patches as on_host
    common.report_as(json, verbose)
    common.show(_patch_run(profile, host, inventory, service, on_host.audit, _patch_set(name)),
                reports.print_audit)


@task(name="enable", help=PATCH_HELP)
def patches_enable(c: Context, name: str, profile: str | None = None, host: str | None = None,
                   inventory: str | None = None, service: str | None = None, yes: bool = False,
                   json: bool = False, verbose: bool = False) -> None:
    """Make a patched venv (derived; the base is untouched) and deploy the profile on it (the set's feature on)."""
    common.report_as(json, verbose)
    report, outcome = _patch_deploy(name, profile, host, inventory, service, yes, enable=True)
    common.show({"check": report, "deploy": ui.outcome_json(outcome)}, lambda _: _print_enabled(report, outcome),
                outcome=outcome.action)


def _print_enabled(report: CheckReport | None, outcome: Outcome) -> None:
    if report is not None:
        reports.print_check(report)
    ui.print_outcome(outcome)


@task(name="disable", help=PATCH_HELP)
def patches_disable(c: Context, name: str, profile: str | None = None, host: str | None = None,
                    inventory: str | None = None, service: str | None = None, yes: bool = False,
                    json: bool = False, verbose: bool = False) -> None:
    """Deploy the profile (the set's feature off) on the venv the patched one was derived from."""
    common.report_as(json, verbose)
    _, outcome = _patch_deploy(name, profile, host, inventory, service, yes, enable=False)
    common.show(ui.outcome_json(outcome), lambda _: ui.print_outcome(outcome), outcome=outcome.action)


def _patch_deploy(name: str, profile: str | None, host: str | None, inventory: str | None, service: str | None,
                  yes: bool, enable: bool) -> tuple[CheckReport | None, Outcome]:
    """The set's enable or disable (ops.dispatch.patch: its consent question, the deploy hooks and the webhook)."""
    from deploy_lib.ops import dispatch
    patch_set = _patch_set(name)
    chosen = common.scope(inventory, host)
    common.consent_possible(yes)  # the question needs the host's profile: refuse before connecting if none can answer
    return common.run(lambda: dispatch.patch(common.project(), chosen, patch_set, profile,
                                             common.service_name(service), enable, common.reach(yes)))


PATCH_ACTION_HELP = {"profile": PATCH_HELP["profile"], "enable": "patch and deploy the profile on the patched venv",
                     "disable": "deploy the profile on the unpatched venv the patched one was derived from",
                     "check": "print each target's state, change nothing",
                     "audit": "list every architecture bound on the patch set's code path"}


# `--set NAME` was the first spelling of the patch set's name here; --set is a profile override in every task that has
# it, so `patch --set` is refused naming --name (deploy_cli/program.py ANSWERED)
@task(help={"name": PATCH_HELP["name"], **PATCH_ACTION_HELP})
def patch(c: Context, name: str, enable: bool = False, disable: bool = False, check: bool = False,
          audit: bool = False, profile: str | None = None, host: str | None = None, inventory: str | None = None,
          service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """A patch set, bundled or the project's own (`patches.list`): --name NAME, then --enable | --disable | --check |
    --audit."""
    common.report_as(json, verbose)
    chosen = [flag for flag, on in (("enable", enable), ("disable", disable), ("check", check), ("audit", audit))
              if on]
    if len(chosen) != 1:
        raise Exit("error: give exactly one of --enable, --disable, --check, --audit", code=2)
    action = {"enable": patches_enable, "disable": patches_disable, "check": patches_check, "audit": patches_audit}
    kwargs = {"yes": yes} if chosen[0] in ("enable", "disable") else {}
    action[chosen[0]](c, name, profile=profile, host=host, inventory=inventory, service=service, json=json,
                      verbose=verbose, **kwargs)


@task(name="patch-fusion", help=PATCH_ACTION_HELP)
def patch_fusion(c: Context, enable: bool = False, disable: bool = False, check: bool = False, audit: bool = False,
                 profile: str | None = None, host: str | None = None, inventory: str | None = None,
                 service: str | None = None, yes: bool = False, json: bool = False, verbose: bool = False) -> None:
    """The SM120 allreduce-fusion patch set: `patch --name fusion-sm120`."""
    patch(c, FUSION_PATCH_SET, enable=enable, disable=disable, check=check, audit=audit, profile=profile, host=host,
          inventory=inventory, service=service, yes=yes, json=json, verbose=verbose)
