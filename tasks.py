"""sglang-deploy tasks: options in, one deploy_lib call, output. `invoke --list` shows them all."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TypeVar

# invoke turns bytecode writing off for whatever it imports after its own options (Program.parse_core, unless
# --write-pyc): a checkout's modules were compiled from source on every command, +40 % of the imports' CPU.
# Python's own setting (-B, PYTHONDONTWRITEBYTECODE) decides again, for the modules imported from here on.
sys.dont_write_bytecode = sys.flags.dont_write_bytecode


def _cache_own_bytecode() -> None:
    """This file itself was compiled before the line above ran, and invoke's loader never writes its cache: each
    command compiled its 900 lines again (~6 ms CPU). Write the cache when it is missing or older than the file, as
    an import would; a directory we may not write to keeps the old cost."""
    cached = __spec__.cached if __spec__ is not None else None
    if sys.dont_write_bytecode or not cached:
        return
    try:
        if os.stat(cached).st_mtime >= os.stat(__file__).st_mtime:
            return
    except FileNotFoundError:
        pass
    import py_compile
    try:
        py_compile.compile(__file__, cfile=cached, quiet=2)
    except OSError:
        pass


_cache_own_bytecode()

from invoke import Collection, Context, Exit

import deploy_cli as ui
from deploy_cli.options import task
from deploy_lib.errors import EXIT_CODES, ConfigError, DeployError, PreflightError
from deploy_lib.profile import LoadedProfile, ServiceSpec
from deploy_lib.project import SANDBOX_INVENTORY, Project, Target, load_for_host, profile_for_host, resolve_target
from deploy_lib.versions import NEWEST_SGLANG
from sandbox import tasks as sandbox_tasks

if TYPE_CHECKING:
    from deploy_lib.deploy import Options, Outcome
    from deploy_lib.fleet import FleetRun, Rollout
    from deploy_lib.inventory import Inventory
    from deploy_lib.patches import PatchSet
    from deploy_lib.remote import FabricRemote
    from deploy_lib.router import RouterSite
    from deploy_lib.router_deploy import LeftOut, RouterFront

# Each task imports the library modules it calls in its body: a command loads only what it runs (a no-op deploy
# neither renders a template nor reads a patch set), which is most of the whole process's time
# (`python -X importtime -c 'import tasks'`; tests/test_cli.py checks what `import tasks` leaves unloaded).
PROJECT = Project(Path(__file__).resolve().parent)
FUSION_PATCH_SET = "fusion-sm120"
T = TypeVar("T")


def _inventory(given: str | None) -> str | None:
    return given or os.environ.get("SGLANG_DEPLOY_INVENTORY")


def _target(inventory: str | None, host: str | None, accept_new_host_key: bool = False) -> Target:
    """The inventory's host; vars that look like typos are warned about."""
    target = _run(lambda: resolve_target(PROJECT.inventory(_inventory(inventory)), host, accept_new_host_key))
    ui.print_warnings(target.host.warnings)
    return target


def _load(profile: str, inventory: str | None, host: str | None,
          accept_new_host_key: bool = False) -> tuple[LoadedProfile, Target]:
    """Profile and host, checked against each other; vars that look like typos are warned about."""
    loaded, target = _run(lambda: load_for_host(PROJECT, profile, _inventory(inventory), host, accept_new_host_key))
    ui.print_warnings(target.host.warnings)
    return loaded, target


IN_USE_HELP = ("profile: a name or a path (default: the host's `profile` var in the inventory, else the profile of "
               "the host's current release)")


def _profile_in_use(profile: str | None, target: Target, remote: FabricRemote, service: str | None) -> LoadedProfile:
    """The profile given or named by the inventory, else the one the host's current release was deployed from."""
    from deploy_lib.commands import status as host_status
    return _run(lambda: profile_for_host(PROJECT, profile, target)
                or host_status.current_profile(target, _service(service), remote))


def _consent(question: str, yes: bool) -> None:
    """Every task that changes a host asks first: --yes, or y at a terminal; exit 1 otherwise."""
    if not yes and not _run(lambda: ui.confirm(question)):
        raise Exit("cancelled: nothing was changed", code=1)


def _consent_possible(yes: bool) -> None:
    """For a task that can ask only once connected: refuse at once when there is no terminal to answer on."""
    if not yes:
        _run(ui.require_terminal)


@dataclass(frozen=True)
class Output:
    """How the running task reports: `--json` puts one JSON document on stdout and everything else (progress,
    warnings, errors) on stderr; `-v` shows every remote step as it comes back."""

    as_json: bool = False
    verbose: bool = False


_output = Output()  # one task per command line; each task that takes --json or -v sets it first


def _report_as(as_json: bool = False, verbose: bool = False) -> None:
    global _output
    _output = Output(as_json, verbose)


def _run(action: Callable[[], T]) -> T:
    """Run one library call; a DeployError becomes its message (and with --json its JSON) and its exit code."""
    try:
        return action()
    except DeployError as error:
        if _output.as_json:
            ui.print_json(ui.failure_json(error))
        ui.print_error(error)
        raise Exit(code=error.exit_code) from None


def _remote(target: Target, prefixed: bool = False) -> FabricRemote:
    from deploy_lib.remote import FabricRemote
    host = target.host.name if prefixed else ""
    return FabricRemote(target.ssh, on_result=ui.step_printer(host=host) if _output.verbose else None)


def _progress(host: str = "") -> ui.TerminalProgress:
    return ui.TerminalProgress(ui.errors if _output.as_json else ui.console, host)


BAD_OPTION = EXIT_CODES[ConfigError]


def _rollout(serial: list[str] | None, max_fail: str | None) -> Rollout | None:
    """--serial and --max-fail; None without them (every host at once): a one-host command never loads the fleet."""
    if not serial and max_fail is None:
        return None
    from deploy_lib.fleet import Rollout
    return _run(lambda: Rollout.parse(serial or (), max_fail))


def _group(inventory: str | None, host: str | None, group: str | None, accept_new_host_key: bool = False,
           rollout: Rollout | None = None) -> list[Target] | None:
    """The group's hosts when --group is given (None otherwise); --serial and --max-fail need it."""
    if group is None:
        if rollout is not None:
            raise Exit("error: --serial and --max-fail roll out over a group: give --group G", code=BAD_OPTION)
        return None
    if host is not None:
        raise Exit("error: --host and --group are exclusive: give one host (--host) or one group (--group)",
                   code=BAD_OPTION)
    from deploy_lib.project import resolve_group
    targets = _run(lambda: resolve_group(PROJECT.inventory(_inventory(inventory)), group, accept_new_host_key))
    for target in targets:
        ui.print_warnings(target.host.warnings)
    return targets


def _on_each_host(targets: list[Target], act: Callable[[Target, FabricRemote, ui.TerminalProgress], T],
                  rollout: Rollout | None = None) -> FleetRun[T]:
    """The per-host call on every host (in parallel, batch by batch), one connection each, progress prefixed by the
    host's name."""
    from deploy_lib.fleet import ALL_AT_ONCE, run_hosts

    def on_host(target: Target) -> T:
        with _remote(target, prefixed=True) as remote:
            return act(target, remote, _progress(target.host.name))
    return _run(lambda: run_hosts(targets, on_host, _progress(), rollout or ALL_AT_ONCE))


def _deploy_nodes(loaded: LoadedProfile, targets: list[Target], group: str, options: Options,
                  rollout: Rollout | None) -> FleetRun[Outcome]:
    """A multi-node release on the group's hosts as one: one connection per node, progress prefixed by its name."""
    from contextlib import ExitStack

    from deploy_lib.multinode import plan_nodes
    from deploy_lib.multinode_deploy import as_fleet, deploy_nodes
    if rollout is not None:
        raise Exit(f"error: profile {loaded.name} is multi-node: its nodes restart together, so --serial and "
                   "--max-fail do not apply", code=BAD_OPTION)
    nodes = _run(lambda: plan_nodes(loaded, targets, group))
    with ExitStack() as connections:
        remotes = {node.name: connections.enter_context(_remote(node.target, prefixed=True)) for node in nodes}
        fleet = as_fleet([node.name for node in nodes], lambda: deploy_nodes(nodes, remotes, _progress, options))
    assert fleet is not None  # a deploy always ends with outcomes or an error
    return fleet


def _rollback_nodes(targets: list[Target], service: str, to: str | None) -> FleetRun[Outcome] | None:
    """A group whose rollback target is a multi-node release is rolled back as one; None when it is not."""
    from contextlib import ExitStack

    from deploy_lib.deploy import GRACE_S
    from deploy_lib.multinode_deploy import as_fleet, rollback_nodes
    with ExitStack() as connections:
        remotes = {t.host.name: connections.enter_context(_remote(t, prefixed=True)) for t in targets}
        return as_fleet([t.host.name for t in targets], lambda: rollback_nodes(
            targets, remotes, _progress, service, to, dict(os.environ), GRACE_S))


def _router_in_front(inventory: Inventory, targets: list[Target], accept_new_host_key: bool) -> RouterFront | None:
    """The router the hosts' `router` var names; nothing of the router is imported when none names one."""
    if not any(target.host.vars.router for target in targets):
        return None
    from deploy_lib.router_deploy import router_in_front
    return _run(lambda: router_in_front(inventory, targets, accept_new_host_key, lambda t: _remote(t, prefixed=True)))


def _behind_router(front: RouterFront | None, target: Target, service: str, remote: FabricRemote,
                   progress: ui.TerminalProgress, transition: Callable[[Callable[[], None] | None], T],
                   leaves_out: LeftOut | None = None) -> T:
    """A replica's deploy, rollback, start, restart, stop, gpu-check or uninstall with its router around it
    (router_deploy.behind_router)."""
    if front is None:
        return transition(None)
    from deploy_lib.router_deploy import behind_router
    return behind_router(front, target, service, remote, progress, transition, leaves_out)


def _one_at_a_time(front: RouterFront | None, rollout: Rollout | None) -> Rollout | None:
    if front is None:
        return rollout
    from deploy_lib.fleet import ALL_AT_ONCE
    from deploy_lib.router_deploy import one_at_a_time
    return one_at_a_time(front, rollout or ALL_AT_ONCE, _progress())


def _show_each(fleet: FleetRun[T], print_report: Callable[[T], None]) -> None:
    """A read-only task's reports, host by host; exit with the worst host's code."""
    if _output.as_json:
        ui.print_json({run.host: ui.failure_json(run.error) if run.error else run.result for run in fleet.runs})
    else:
        ui.print_each_host(fleet, print_report)
    if fleet.exit_code:
        raise Exit(code=fleet.exit_code)


def _show_outcomes(fleet: FleetRun[Outcome]) -> None:
    """A group deploy's or rollback's end: plans (dry run), the per-host table; exit 0 only when every host is on
    its new release, else the worst host's code."""
    from deploy_lib.fleet import HostEnd, summarize

    def ended(outcome: Outcome) -> HostEnd:  # a dry run changed nothing: what ran before still runs
        serving = outcome.previous_id if outcome.action == "planned" else outcome.release_id
        return HostEnd(outcome.action, outcome.release_id, serving,
                       outcome.ready.duration_s if outcome.ready else None)
    summary = summarize(fleet, ended)
    ui.print_host_errors(fleet)
    if _output.as_json:
        ui.print_json(ui.fleet_json(fleet, summary, ui.outcome_json))
    else:
        for run in fleet.runs:
            if run.result is not None and run.result.plan is not None and run.result.action == "planned":
                ui.console.rule(run.host)
                ui.print_plan(run.result.plan)
        ui.print_fleet(summary)
    if summary.exit_code:
        raise Exit(code=summary.exit_code)


def _show(report: T, print_table: Callable[[T], None]) -> None:
    if _output.as_json:
        ui.print_json(report)
    else:
        print_table(report)


@task(help={"sglang_version": f"SGLang version to render for (default {NEWEST_SGLANG})"})
def render(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
           sglang_version: str = NEWEST_SGLANG) -> None:
    """Print the unit, the env file (secrets redacted) and the argv of a profile, without touching any host."""
    from deploy_lib.release.model import build_release
    from deploy_lib.release.server_args import secret_environment
    loaded, target = _load(profile, inventory, host)

    def build() -> object:
        placeholders = {name: "<secret>" for name in secret_environment(loaded.profile)}
        layout = target.layout(loaded.profile.service.name)
        return build_release(loaded, layout, sglang_version, placeholders, venv=target.venv_override)
    ui.print_release(_run(build))  # type: ignore[arg-type]


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

    loaded_pair = [_load(name, inventory, host) for name in (against, profile)]

    def compare() -> list[str]:
        releases = []
        for loaded, target in loaded_pair:
            layout = target.layout(loaded.profile.service.name)
            releases.append(build_release(loaded, layout, sglang_version,
                                          {n: "<secret>" for n in secret_environment(loaded.profile)}))
        changes = diff_releases(releases[0].metadata(), releases[1].metadata())
        names = " -> ".join(loaded.name for loaded, _ in loaded_pair)
        return [f"{names}: {len(changes) or 'no'} change(s)", *(f"  {c}" for c in changes)]
    ui.print_lines(_run(compare))


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
    from deploy_lib import deploy as deploy_engine
    from deploy_lib import multinode
    _report_as(json, verbose)
    options = deploy_engine.Options(dry_run=dry_run, force=force, environ=dict(os.environ), gate=gate)
    rollout = _rollout(serial, max_fail)
    targets = _group(inventory, host, group, accept_new_host_key, rollout)
    if targets is not None:
        from deploy_lib.project import load_for_target
        known = PROJECT.inventory(_inventory(inventory))
        loaded_for = _run(lambda: {t.host.name: load_for_target(PROJECT, profile, known, t) for t in targets})
        if not dry_run:
            names = ", ".join(sorted({loaded.name for loaded in loaded_for.values()}))
            _consent(f"deploy {names} to {len(targets)} hosts of group {group} ({', '.join(loaded_for)})?", yes)
        multi = next((loaded for loaded in loaded_for.values() if multinode.is_multi_node(loaded)), None)
        if multi is not None:
            if len({loaded.path for loaded in loaded_for.values()}) > 1:
                raise Exit(f"error: profile {multi.name} is multi-node: every host of group {group} runs it, so give "
                           f"it to all (--profile {multi.name}) instead of each host's `profile` var", code=BAD_OPTION)
            _show_outcomes(_deploy_nodes(multi, targets, str(group), options, rollout))
            return

        front = _router_in_front(known, targets, accept_new_host_key)

        def deploy_host(target: Target, remote: FabricRemote, progress: ui.TerminalProgress) -> Outcome:
            loaded = loaded_for[target.host.name]
            return _behind_router(front, target, loaded.profile.service.name, remote, progress, lambda drain:
                                  deploy_engine.deploy(loaded, target, remote, progress,
                                                       replace(options, before_restart=drain)))
        _show_outcomes(_on_each_host(targets, deploy_host, _one_at_a_time(front, rollout)))
        return
    loaded, target = _load(profile, inventory, host, accept_new_host_key)
    _run(lambda: multinode.refuse_single_host(loaded, target.host.name))
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], accept_new_host_key)
    if not dry_run:
        _consent(f"deploy {loaded.name} to {target.host.name}?", yes)
    progress = _progress()
    with _remote(target) as remote:
        outcome = _run(lambda: _behind_router(
            front, target, loaded.profile.service.name, remote, progress,
            lambda drain: deploy_engine.deploy(loaded, target, remote, progress,
                                               replace(options, before_restart=drain))))
    _show_outcome(outcome)


def _show_outcome(outcome: Outcome) -> None:
    if _output.as_json:
        ui.print_json(ui.outcome_json(outcome))
    else:
        ui.print_outcome(outcome)


def _service(service: str | None) -> str:
    return service or ServiceSpec().name


def _router_of(inventory: str | None, group: str, accept_new_host_key: bool
               ) -> tuple[Inventory, list[Target], RouterSite, Target]:
    """The group's hosts, its router (the inventory's `router` var) and the router's host."""
    from deploy_lib.router import router_site
    known = _run(lambda: PROJECT.inventory(_inventory(inventory)))
    targets = _group(inventory, None, group, accept_new_host_key) or []
    site = _run(lambda: router_site(known, [target.host for target in targets]))
    if site is None:
        raise Exit(f"error: no host of group {group} names a router: set `router: HOST` in the group's vars "
                   "(docs/router.md)", code=BAD_OPTION)
    return known, targets, site, _target(inventory, site.host.name, accept_new_host_key)


@task(name="deploy", help={
    "group": "the group whose servers the router serves (its hosts' `router` var names the router's host)",
    "profile": "the servers' profile, for their port (default: each host's `profile` var)"})
def router_deploy(c: Context, group: str, profile: str | None = None, inventory: str | None = None,
                  yes: bool = False, accept_new_host_key: bool = False, json: bool = False,
                  verbose: bool = False) -> None:
    """Deploy SGLang's router (sglang-router) in front of a group's servers, as its own unit and release."""
    from deploy_lib.router import replica_urls
    from deploy_lib.router_deploy import deploy_router
    _report_as(json, verbose)
    known, targets, site, router_target = _router_of(inventory, group, accept_new_host_key)
    workers = _run(lambda: replica_urls(PROJECT, profile, known, targets))
    _consent(f"deploy the router for group {group} ({', '.join(workers)}) to {site.host.name}:{site.port}?", yes)
    with _remote(router_target) as remote:
        outcome = _run(lambda: deploy_router(site, router_target, remote, workers, group, _progress()))
    _show(outcome, ui.print_router_outcome)


@task(name="status", help={"group": "the group whose router to ask"})
def router_status(c: Context, group: str, inventory: str | None = None, json: bool = False,
                  verbose: bool = False) -> None:
    """The workers the group's router lists, and whether it finds each healthy."""
    from deploy_lib.router import router_workers
    _report_as(json, verbose)
    _, _, site, router_target = _router_of(inventory, group, False)
    with _remote(router_target) as remote:
        _show(_run(lambda: router_workers(remote, site)), ui.print_router_workers)


@task(iterable=["serial"], help={"to": "release id (default: the last healthy release before the current one)"})
def rollback(c: Context, to: str | None = None, host: str | None = None, group: str | None = None,
             serial: list[str] | None = None, max_fail: str | None = None, inventory: str | None = None,
             service: str | None = None, accept_new_host_key: bool = False, json: bool = False,
             verbose: bool = False, yes: bool = False) -> None:
    """Switch back to an earlier release on the host and verify it."""
    from deploy_lib import deploy as deploy_engine
    _report_as(json, verbose)
    rollout = _rollout(serial, max_fail)
    targets = _group(inventory, host, group, accept_new_host_key, rollout)
    if targets is not None:
        hosts = ", ".join(target.host.name for target in targets)
        _consent(f"roll {len(targets)} hosts of group {group} ({hosts}) back to {to or 'the last healthy release'}?",
                 yes)
        multi = _rollback_nodes(targets, _service(service), to) if not serial and max_fail is None else None
        if multi is not None:
            _show_outcomes(multi)
            return
        front = _router_in_front(PROJECT.inventory(_inventory(inventory)), targets, accept_new_host_key)
        _show_outcomes(_on_each_host(targets, lambda target, remote, progress: _behind_router(
            front, target, _service(service), remote, progress, lambda drain: deploy_engine.rollback(
                target, _service(service), remote, progress, to, dict(os.environ), before_restart=drain)),
            _one_at_a_time(front, rollout)))
        return
    target = _target(inventory, host, accept_new_host_key)
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], accept_new_host_key)
    _consent(f"roll {target.host.name} back to {to or 'the last healthy release'}?", yes)
    progress = _progress()
    with _remote(target) as remote:
        outcome = _run(lambda: _behind_router(front, target, _service(service), remote, progress, lambda drain:
                                              deploy_engine.rollback(target, _service(service), remote, progress, to,
                                                                     dict(os.environ), before_restart=drain)))
    _show_outcome(outcome)


@task(help={"pid": "process id of the SGLang server running by hand on the host (`pgrep -af sglang.launch_server`)",
            "profile": "name of the profile to write (inventory/profiles/NAME.yaml; must not exist)",
            "unit": "a hand-written systemd unit running the server; it becomes the service of that name",
            "service": "service name to manage a --pid server as (default sglang)"})
def adopt(c: Context, profile: str, pid: str | None = None, unit: str | None = None, host: str | None = None,
          inventory: str | None = None, service: str | None = None, yes: bool = False,
          accept_new_host_key: bool = False) -> None:
    """Take over a server started by hand (--pid, or --unit for a hand-written systemd unit): record it as release 0
    and write the profile that reproduces it."""
    from deploy_lib.commands.adopt import adopt as adopt_server
    from deploy_lib.profile import profile_path
    from deploy_lib.remote import FabricRemote
    if (pid is None) == (unit is None) or (pid is not None and not pid.isdigit()):
        raise Exit("error: adopt takes --pid PID (a process id) or --unit NAME (a systemd unit), one of them",
                   code=2)
    path = _run(lambda: profile_path(PROJECT.profiles_dir, profile))
    if path.exists():
        raise Exit(f"error: {path} exists; adopt writes a new profile, give another --profile name", code=2)
    target = _target(inventory, host, accept_new_host_key)
    name = (unit or "").removesuffix(".service") or _service(service)
    what = f"unit {name}.service" if unit else f"pid {pid}"
    _consent(f"adopt {what} on {target.host.name} as release 0 of service {name}?", yes)
    with FabricRemote(target.ssh) as remote:
        result = _run(lambda: adopt_server(target, name, remote, profile, int(pid) if pid else None,
                                           from_unit=unit is not None))
    path.write_text(result.profile_text)
    ui.print_adopted_server(result, path)


@task
def stop(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
         yes: bool = False) -> None:
    """Stop the server (the current release stays current; `invoke start` brings it back)."""
    from deploy_lib import deploy as deploy_engine
    from deploy_lib.remote import FabricRemote
    target = _target(inventory, host)
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], False)
    _consent(f"stop {_service(service)} on {target.host.name}?", yes)
    with FabricRemote(target.ssh) as remote:
        ui.print_outcome(_run(lambda: _behind_router(
            front, target, _service(service), remote, _progress(),
            lambda drain: deploy_engine.stop(target, _service(service), remote, before_stop=drain),
            leaves_out="stopped")))


def _start(restart: bool, host: str | None, inventory: str | None, service: str | None, yes: bool) -> None:
    from deploy_lib import deploy as deploy_engine
    from deploy_lib.remote import FabricRemote
    target = _target(inventory, host)
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], False)
    _consent(f"{'restart' if restart else 'start'} {_service(service)} on {target.host.name}?", yes)
    progress = ui.TerminalProgress()
    with FabricRemote(target.ssh) as remote:
        ui.print_outcome(_run(lambda: _behind_router(
            front, target, _service(service), remote, progress, lambda drain: deploy_engine.start(
                target, _service(service), remote, progress, dict(os.environ), restart, before_restart=drain))))


@task
def start(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
          yes: bool = False) -> None:
    """Start the current release and wait until it serves (readiness ladder); rolled back if it cannot start."""
    _start(False, host, inventory, service, yes)


@task
def restart(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
            yes: bool = False) -> None:
    """Restart the current release and wait until it serves (readiness ladder); rolled back if it cannot start."""
    _start(True, host, inventory, service, yes)


@task
def uninstall(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
              yes: bool = False) -> None:
    """Remove the unit, releases, managed venvs and caches from the host; history is copied here first."""
    from deploy_lib.commands import uninstall as remove
    from deploy_lib.remote import FabricRemote
    target = _target(inventory, host)
    name = _service(service)
    state_dir = remove.local_state_dir(os.environ)
    question = (f"remove service {name} from {target.host.name}: stop its unit, delete "
                f"{target.layout(name).base} (releases, managed venvs, caches)? history is kept in {state_dir}")
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], False)
    _consent(question, yes)
    with FabricRemote(target.ssh) as remote:
        ui.print_uninstalled(_run(lambda: _behind_router(
            front, target, name, remote, _progress(),
            lambda drain: remove.uninstall(target, name, remote, state_dir, before_stop=drain),
            leaves_out="uninstalled")))


@task
def releases(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
             service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """List the releases on the host with their outcome and measured throughput."""
    from deploy_lib.commands import status as host_status
    _report_as(json, verbose)
    targets = _group(inventory, host, group)
    if targets is not None:
        _show_each(_on_each_host(targets, lambda target, remote, _: host_status.list_releases(
            target, _service(service), remote)), ui.print_releases)
        return
    target = _target(inventory, host)
    with _remote(target) as remote:
        _show(_run(lambda: host_status.list_releases(target, _service(service), remote)), ui.print_releases)


@task
def status(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
           service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """Current release and its age, unit state, readiness, versions, patches and a per-GPU table."""
    from deploy_lib.commands import status as host_status
    _report_as(json, verbose)
    targets = _group(inventory, host, group)
    if targets is not None:
        _show_each(_on_each_host(targets, lambda target, remote, _: host_status.read_status(
            target, _service(service), remote)), ui.print_status)
        return
    target = _target(inventory, host)
    with _remote(target) as remote:
        _show(_run(lambda: host_status.read_status(target, _service(service), remote)), ui.print_status)


@task(iterable=["sizes"], help={
    "profile": "check with this profile's venv, TP size and NCCL environment (default: the current release's)",
    "stop_server": "stop the running server for the check, then restart the current release through the readiness "
                   "ladder",
    "sizes": "an all-reduce size in bytes; repeat for several (default 1 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB)"})
def gpu_check(c: Context, profile: str | None = None, stop_server: bool = False, sizes: list[str] | None = None,
              host: str | None = None, inventory: str | None = None, service: str | None = None, json: bool = False,
              verbose: bool = False) -> None:
    """Prove the host's GPUs and NCCL settings: topology and P2P advice, then an exactly verified all-reduce."""
    from deploy_lib.commands import gpu_check as gpu_checks
    _report_as(json, verbose)
    target = _target(inventory, host)
    loaded = _run(lambda: PROJECT.profile(profile)) if profile else None
    byte_sizes = _run(lambda: gpu_checks.parse_sizes(sizes or []))
    front = _router_in_front(PROJECT.inventory(_inventory(inventory)), [target], False)
    progress = _progress()
    with _remote(target) as remote:
        report = _run(lambda: _behind_router(front, target, _service(service), remote, progress, lambda drain:
                                             gpu_checks.run_gpu_check(target, _service(service), remote, progress,
                                                                      loaded, stop_server, dict(os.environ),
                                                                      byte_sizes, before_stop=drain)))
    _show(report, ui.print_gpu_check)
    if not report.check.verified:
        raise Exit(code=EXIT_CODES[PreflightError])


@task(help={"lines": "number of lines (default 100)", "follow": "keep printing new lines (Ctrl-C stops)"})
def logs(c: Context, lines: int = 100, follow: bool = False, host: str | None = None, group: str | None = None,
         inventory: str | None = None, service: str | None = None, verbose: bool = False) -> None:
    """Print the server's log from the host's journal."""
    from deploy_lib.commands import status as host_status
    _report_as(verbose=verbose)
    if group is not None and follow:
        raise Exit("error: --follow follows one host's journal: give --host, or --group without --follow",
                   code=BAD_OPTION)
    targets = _group(inventory, host, group)
    if targets is not None:
        _show_each(_on_each_host(targets, lambda target, remote, _: host_status.read_log(
            target, _service(service), remote, lines)), ui.print_lines)
        return
    target = _target(inventory, host)
    with _remote(target) as remote:
        name = _service(service)
        if follow:
            _run(lambda: ui.print_lines(host_status.follow_log(target, name, remote, lines)))
        else:
            ui.print_lines(_run(lambda: host_status.read_log(target, name, remote, lines)))


@task(help={"force": "remove the lock even if its owner looks alive"})
def unlock(c: Context, force: bool = False, host: str | None = None, inventory: str | None = None,
           service: str | None = None, verbose: bool = False, yes: bool = False) -> None:
    """Remove a stale deploy lock (or any lock, with --force)."""
    from deploy_lib.store import LockContext
    from deploy_lib.store import unlock as unlock_store
    _report_as(verbose=verbose)
    target = _target(inventory, host)
    _consent(f"remove the lock of {_service(service)} on {target.host.name}?", yes)
    layout = target.layout(_service(service))
    with _remote(target) as remote:
        removed = _run(lambda: unlock_store(remote, layout, force, LockContext(where=target.host.name)))
    ui.console.print(f"removed the lock held by {removed.owner}" if removed else "there was no lock")


@task(help={"profile": IN_USE_HELP + " (its bench settings are used)",
            "compare": "a release id; repeat for two or more: their newest benchmarks side by side (no new run)"},
      iterable=["compare"])
def bench(c: Context, profile: str | None = None, compare: list[str] | None = None, host: str | None = None,
          inventory: str | None = None, service: str | None = None, json: bool = False, verbose: bool = False
          ) -> None:
    """Run SGLang's serving benchmark against the current release and record it (`--compare A --compare B`)."""
    from deploy_lib.commands import status as host_status
    from deploy_lib.throughput import comparison_records
    _report_as(json, verbose)
    if compare and len(compare) < 2:
        raise Exit("error: --compare takes two release ids or more: --compare A --compare B [--compare C ...]",
                   code=2)
    target = _target(inventory, host)
    with _remote(target) as remote:
        loaded = _profile_in_use(profile, target, remote, service)
        if compare:
            results, rows = _run(lambda: host_status.compare_benchmarks(
                target, loaded.profile.service.name, remote, compare))
            _show({"results": results, "rows": rows, "records": comparison_records(results, rows)},
                  lambda report: ui.print_comparison(report["results"], report["rows"]))
            return
        _show(_run(lambda: host_status.bench_current(target, loaded, remote, dict(os.environ), _progress())),
              ui.print_bench)


@task(name="build", help={"profile": "profile whose service.venv_build lock to build"})
def venv_build(c: Context, profile: str | None = None, host: str | None = None, inventory: str | None = None,
               verbose: bool = False, yes: bool = False) -> None:
    """Build (or reuse) the content-addressed venv of a profile's lock on the host; only missing wheels travel."""
    from deploy_lib.venvs import ensure_venv
    _report_as(verbose=verbose)
    loaded, target = _load(profile, inventory, host)
    spec = loaded.profile.service.venv_build
    if spec is None:
        raise Exit(f"error: profile {loaded.name} has no service.venv_build", code=2)
    _consent(f"build the venv of {loaded.name} on {target.host.name}?", yes)
    layout = target.layout(loaded.profile.service.name)
    with _remote(target) as remote:
        result = _run(lambda: ensure_venv(remote, layout, spec, progress=_progress(), where=target.host.name))
    ui.console.print(f"venv {result.hash} at {result.path}: {'reused' if result.reused else 'built'}, "
                     f"{len(result.wheels_sent)} wheels ({result.bytes_sent} bytes) sent")


@task(name="adopt", help={"path": "the hand-made venv on the host, e.g. /root/ml-env"})
def venv_adopt(c: Context, path: str, host: str | None = None, inventory: str | None = None,
               service: str | None = None, verbose: bool = False, yes: bool = False) -> None:
    """Record a hand-made venv as a managed, immutable one (hard-linked copy); report files that drifted."""
    from deploy_lib.venvs import adopt as adopt_venv
    _report_as(verbose=verbose)
    target = _target(inventory, host)
    _consent(f"adopt {path} as a managed venv on {target.host.name}?", yes)
    layout = target.layout(_service(service))
    with _remote(target) as remote:
        result = _run(lambda: adopt_venv(remote, layout, PurePosixPath(path), where=target.host.name))
    ui.print_adopted(result)


@task(name="remove", help={"venv_hash": "the managed venv's hash (`invoke venv.list`)"})
def venv_remove(c: Context, venv_hash: str, host: str | None = None, inventory: str | None = None,
                service: str | None = None, yes: bool = False) -> None:
    """Remove a managed venv (adopted ones stay until removed here) unless a release or derived venv needs it."""
    from deploy_lib.commands import uninstall as remove
    from deploy_lib.remote import FabricRemote
    target = _target(inventory, host)
    _consent(f"remove venv {venv_hash} of {_service(service)} on {target.host.name}?", yes)
    with FabricRemote(target.ssh) as remote:
        _run(lambda: remove.remove_venv(target, _service(service), remote, venv_hash))
    ui.console.print(f"removed venv {venv_hash} and its caches", markup=False)


@task(name="list")
def venv_list(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
              json: bool = False, verbose: bool = False) -> None:
    """List managed venvs: hash, kind, size, the releases using them, derived venvs, versions."""
    from deploy_lib.commands import status as host_status
    _report_as(json, verbose)
    target = _target(inventory, host)
    with _remote(target) as remote:
        _show(_run(lambda: host_status.list_managed_venvs(target, _service(service), remote)), ui.print_venvs)


@task(name="list")
def model_list(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None) -> None:
    """List model revisions in the host's HF caches and pushed versions: size, staged by us, the releases using them."""
    from deploy_lib.commands import status as host_status
    from deploy_lib.remote import FabricRemote
    target = _run(lambda: _target(inventory, host))
    with FabricRemote(target.ssh) as remote:
        ui.print_models(_run(lambda: host_status.list_models(target, _service(service), remote)))


def _patch_set(name: str) -> PatchSet:
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import find_patch_set
    return _run(lambda: find_patch_set(ROLES_DIR, name))


def _patch_run(profile: str | None, host: str | None, inventory: str | None, service: str | None,
               action: Callable[..., T], *args: object) -> T:
    target = _target(inventory, host)
    with _remote(target) as remote:
        loaded = _profile_in_use(profile, target, remote, service)
        return _run(lambda: action(remote, *args, loaded, target))


PATCH_HELP = {"name": "patch set name (see `invoke patches.list`)", "profile": IN_USE_HELP}


@task(name="list")
def patches_list(c: Context) -> None:
    """List the patch sets under roles/ with what they are for."""
    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import list_patch_sets
    ui.print_patch_sets(_run(lambda: list_patch_sets(ROLES_DIR)))


@task(name="check", help=PATCH_HELP)
def patches_check(c: Context, name: str, profile: str | None = None, host: str | None = None,
                  inventory: str | None = None, service: str | None = None, verbose: bool = False) -> None:
    """Each target's state (absent, applied, native, conflict) in the current release's venv; changes nothing."""
    from deploy_lib.commands import patches as on_host
    _report_as(verbose=verbose)
    ui.print_check(_patch_run(profile, host, inventory, service, on_host.check, _patch_set(name)))


@task(name="audit", help=PATCH_HELP)
def patches_audit(c: Context, name: str, profile: str | None = None, host: str | None = None,
                  inventory: str | None = None, service: str | None = None, verbose: bool = False) -> None:
    """Every architecture bound on the patch set's code path, with file:line and its value on the set's GPUs."""
    from deploy_lib.commands import patches as on_host
    _report_as(verbose=verbose)
    ui.print_audit(_patch_run(profile, host, inventory, service, on_host.audit, _patch_set(name)))


@task(name="enable", help=PATCH_HELP)
def patches_enable(c: Context, name: str, profile: str | None = None, host: str | None = None,
                   inventory: str | None = None, service: str | None = None, yes: bool = False,
                   verbose: bool = False) -> None:
    """Make a patched venv (derived; the base is untouched) and deploy the profile on it (the set's feature on)."""
    from deploy_lib import deploy as deploy_engine
    from deploy_lib.commands import patches as on_host
    _report_as(verbose=verbose)
    patch_set = _patch_set(name)
    target = _target(inventory, host)
    _consent_possible(yes)  # the question needs the host's profile; refuse before connecting when nobody can answer
    with _remote(target) as remote:
        base = on_host.base_profile(_profile_in_use(profile, target, remote, service), patch_set)
        patched = on_host.patched_profile(base, patch_set)
        _consent(f"patch {name} and deploy {patched.name} to {target.host.name}?", yes)
        report, outcome = _run(lambda: on_host.enable(remote, patch_set, base, patched, target,
                                                       _progress(), deploy_engine.Options(
                                                           environ=dict(os.environ))))
    ui.print_check(report)
    ui.print_outcome(outcome)


@task(name="disable", help=PATCH_HELP)
def patches_disable(c: Context, name: str, profile: str | None = None, host: str | None = None,
                    inventory: str | None = None, service: str | None = None, yes: bool = False,
                    verbose: bool = False) -> None:
    """Deploy the profile (the set's feature off) on the venv the patched one was derived from."""
    from deploy_lib import deploy as deploy_engine
    from deploy_lib.commands import patches as on_host
    _report_as(verbose=verbose)
    patch_set = _patch_set(name)
    target = _target(inventory, host)
    _consent_possible(yes)
    with _remote(target) as remote:
        base = on_host.base_profile(_profile_in_use(profile, target, remote, service), patch_set)
        _consent(f"deploy {base.name} without {name} to {target.host.name}?", yes)
        outcome = _run(lambda: on_host.disable(remote, patch_set, base, target, _progress(),
                                                deploy_engine.Options(environ=dict(os.environ))))
    ui.print_outcome(outcome)


PATCH_ACTION_HELP = {"profile": PATCH_HELP["profile"], "enable": "patch and deploy the profile on the patched venv",
                     "disable": "deploy the profile on the unpatched venv the patched one was derived from",
                     "check": "print each target's state, change nothing",
                     "audit": "list every architecture bound on the patch set's code path"}


@task(help={"set": PATCH_HELP["name"], **PATCH_ACTION_HELP})
def patch(c: Context, set: str, enable: bool = False, disable: bool = False, check: bool = False, audit: bool = False,
          profile: str | None = None, host: str | None = None, inventory: str | None = None,
          service: str | None = None, yes: bool = False, verbose: bool = False) -> None:
    """A patch set under roles/ (`invoke patches.list`): --set NAME, then --enable | --disable | --check | --audit."""
    _report_as(verbose=verbose)
    chosen = [flag for flag, on in (("enable", enable), ("disable", disable), ("check", check), ("audit", audit))
              if on]
    if len(chosen) != 1:
        raise Exit("error: give exactly one of --enable, --disable, --check, --audit", code=2)
    action = {"enable": patches_enable, "disable": patches_disable, "check": patches_check, "audit": patches_audit}
    kwargs = {"yes": yes} if chosen[0] in ("enable", "disable") else {}
    action[chosen[0]](c, set, profile=profile, host=host, inventory=inventory, service=service, verbose=verbose,
                      **kwargs)


@task(name="patch-fusion", help=PATCH_ACTION_HELP)
def patch_fusion(c: Context, enable: bool = False, disable: bool = False, check: bool = False, audit: bool = False,
                 profile: str | None = None, host: str | None = None, inventory: str | None = None,
                 service: str | None = None, yes: bool = False, verbose: bool = False) -> None:
    """The SM120 allreduce-fusion patch set: `invoke patch --set fusion-sm120`."""
    patch(c, FUSION_PATCH_SET, enable=enable, disable=disable, check=check, audit=audit, profile=profile, host=host,
          inventory=inventory, service=service, yes=yes, verbose=verbose)


@task
def version(c: Context) -> None:
    """Print the tool's version."""
    from importlib.metadata import version as package_version
    ui.console.print(f"sglang-deploy {package_version('sglang-deploy')}")


def _demo_step(title: str, command: str, action: Callable[[], None]) -> None:
    """One step of the demo: its title, the command a user would type, its output (an expected exit is shown)."""
    ui.console.rule(title)
    ui.console.print(f"$ invoke {command}", markup=False, style="bold")
    try:
        action()
    except Exit as stopped:
        ui.console.print(f"(exit {stopped.code})")


@task
def demo(c: Context) -> None:
    """Our users' week on the sandbox VM: a gated deploy, a fusion release that cannot start, the patched one the gate
    rolls back, a slow release kept without a gate and rolled back by hand, the releases with their figures."""
    started = time.monotonic()
    sandbox_tasks.up(c, venv=True)  # a running guest keeps its venv when the wheels are the same
    sandbox_tasks.empty(c)  # the story starts on an empty host
    inventory = str(PROJECT.root / SANDBOX_INVENTORY)
    th1 = sandbox_tasks.names.DEFAULT_NAME  # the inventory may list more guests (sandbox.up --count)
    on = {"inventory": inventory, "host": th1, "yes": True}
    _demo_step("1. deploy the reference profile with the throughput gate: the first figures are recorded",
               "deploy --profile glm5-nvfp4-sandbox", lambda: deploy(c, "glm5-nvfp4-sandbox", **on))
    _demo_step("2. status", "status", lambda: status(c, inventory=inventory, host=th1))
    _demo_step("3. fusion on SM120 with the gates unpatched: it cannot start, is rolled back and diagnosed",
               "deploy --profile glm5-nvfp4-fusion", lambda: deploy(c, "glm5-nvfp4-fusion", **on))
    _demo_step("4. the fusion patch set: it starts healthy, the gate measures it slow and rolls it back",
               "patch-fusion --enable --profile glm5-nvfp4-sandbox",
               lambda: patch_fusion(c, enable=True, profile="glm5-nvfp4-sandbox", **on))
    _demo_step("5. the patched release without a gate, as before the gate existed: it stays until rolled back",
               "patch-fusion --enable --profile glm5-nvfp4",
               lambda: patch_fusion(c, enable=True, profile="glm5-nvfp4", **on))
    _demo_step("6. roll back by hand", "rollback", lambda: rollback(c, **on))
    _demo_step("7. releases: outcome, measured throughput and GPU power", "releases",
               lambda: releases(c, inventory=inventory, host=th1))
    ui.console.print(f"demo done in {time.monotonic() - started:.0f} s")


FLEET_GUESTS = 3


@task(name="demo-fleet")
def demo_fleet(c: Context) -> None:
    """A group of three sandbox guests: a parallel deploy to all, then a rolling deploy whose first host fails (rolled
    back on its own) and stops the rollout at --max-fail, leaving the others untouched; the releases of each; then
    SGLang's router in front of them and a rolling deploy behind it with a client running through it (0 failed); one
    multi-node server over the three as one release."""
    started = time.monotonic()
    sandbox_tasks.up(c, count=FLEET_GUESTS, venv=True, router="th1")
    for number in range(1, FLEET_GUESTS + 1):
        sandbox_tasks.empty(c, name=f"th{number}")  # the story starts on empty hosts
    inventory = str(PROJECT.root / SANDBOX_INVENTORY)
    on = {"inventory": inventory, "group": sandbox_tasks.names.GROUP}
    _demo_step("1. one deploy to every guest of group sandbox, in parallel", "deploy --profile glm5-nvfp4 --group "
               "sandbox", lambda: deploy(c, "glm5-nvfp4", yes=True, **on))
    _demo_step("2. a rolling deploy, one host per batch, no failure allowed: fusion cannot start on SM120, so the "
               "first host rolls back and the rollout stops", "deploy --profile glm5-nvfp4-fusion --group sandbox "
               "--serial 1 --max-fail 0", lambda: deploy(c, "glm5-nvfp4-fusion", serial=["1"], max_fail="0",
                                                          yes=True, **on))
    _demo_step("3. releases on each guest", "releases --group sandbox", lambda: releases(c, **on))
    _demo_step("4. SGLang's router (sglang-router) on th1, in front of the three guests", "router.deploy --group "
               "sandbox --profile glm5-nvfp4", lambda: router_deploy(c, profile="glm5-nvfp4", yes=True, **on))
    from sandbox import manage
    from sandbox.traffic import Client
    client = Client(f"http://{manage.guest('th1').guest_ip}:{manage.ROUTER_PORT}")
    traffic = client.during(lambda: _demo_step(
        "5. a rolling deploy behind the router while a client sends requests through it: each replica is taken out "
        "before its restart and added back once verified", "deploy --profile glm5-nvfp4-replica --group sandbox "
        "--serial 1", lambda: deploy(c, "glm5-nvfp4-replica", serial=["1"], yes=True, **on)))
    ui.console.print(f"client: {len(traffic.latencies) + len(traffic.failures)} requests through the router during "
                     f"the rollout, {len(traffic.failures)} failed (p99 {traffic.p99_s * 1000:.0f} ms)")
    _demo_step("6. one server over the three guests (nnodes 3): node 0 waits for the other two at its "
               "--dist-init-addr, one release id on every node", "deploy --profile glm5-nvfp4-3nodes --group sandbox",
               lambda: deploy(c, "glm5-nvfp4-3nodes", yes=True, **on))
    ui.console.print(f"demo-fleet done in {time.monotonic() - started:.0f} s")


ns = Collection(render, plan, schema, deploy, adopt, rollback, stop, start, restart, uninstall, releases, status, logs,
                unlock, bench, patch, patch_fusion, demo, demo_fleet, version, gpu_check)
ns.add_collection(Collection(patches_list, patches_check, patches_audit, patches_enable, patches_disable),
                  name="patches")
ns.add_collection(Collection(venv_build, venv_adopt, venv_list, venv_remove), name="venv")
ns.add_collection(Collection(model_list), name="model")
ns.add_collection(Collection(router_deploy, router_status), name="router")
ns.add_collection(Collection.from_module(sandbox_tasks), name="sandbox")
