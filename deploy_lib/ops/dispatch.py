"""Every command that acts on hosts, for one host or a group: which path it takes (one multi-node release over the
group's nodes, replicas behind a router, independent hosts), the router drain around each replica, the rollout
(--serial, --max-fail, one at a time behind a router), the consent question; all through the one runner
(scope.run_each) with its one result, a FleetRun. The per-host work is the one-host commands' (deploy_lib/commands:
the deploy engine, the status reads, uninstall, ...); the CLI only presents what these return."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from deploy_lib.deploy.project import Project, Target, load_for_target, profile_for_host
from deploy_lib.errors import ConfigError, DeployError
from deploy_lib.ops.scope import Reach, Scope, behind, refuse_split, rolled_out, router_in_front, run_each
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote

if TYPE_CHECKING:
    from deploy_lib.commands.adopt import Adopted
    from deploy_lib.commands.deploy import Options, Outcome
    from deploy_lib.commands.releases import ReleaseRow
    from deploy_lib.commands.status import StatusReport
    from deploy_lib.commands.tune_request import Planned, Request
    from deploy_lib.commands.uninstall import Uninstalled
    from deploy_lib.gpu_check import GpuCheckReport
    from deploy_lib.host.p2p_reading import NodeReader
    from deploy_lib.host.venv_lifecycle import PrunePlan
    from deploy_lib.host.venv_publish import VenvResult
    from deploy_lib.metrics.workload import Workload
    from deploy_lib.ops.fleet import FleetRun
    from deploy_lib.ops.router import RouterSite
    from deploy_lib.ops.router_deploy import RouterOutcome
    from deploy_lib.ops.tune_group import GroupTune
    from deploy_lib.patches import CheckReport, PatchSet
    from deploy_lib.profile import LoadedProfile
    from deploy_lib.store import LockInfo
    from deploy_lib.tune import TuneReport

LAST_HEALTHY = "the last healthy release"


def deploy(project: Project, scope: Scope, profile: str | None, options: Options, reach: Reach,
           overrides: Sequence[str] = ()) -> FleetRun[Outcome]:
    """The profile (else each host's `profile` var, with `--set` overrides) on every host of the scope: a multi-node
    profile on the group's nodes as one release, replicas behind their router one at a time, other hosts batch by
    batch."""
    from deploy_lib.commands import deploy as engine
    from deploy_lib.ops import multinode
    loaded_for = {t.host.name: load_for_target(project, profile, scope.inventory, t, overrides)
                  for t in scope.targets}
    if scope.one_host:
        [(name, loaded)] = loaded_for.items()
        multinode.refuse_single_host(loaded, name)
    multi = next((loaded for loaded in loaded_for.values() if multinode.is_multi_node(loaded)), None)
    if multi is not None:
        refuse_split(scope, f"profile {multi.name} is multi-node (parallel.nnodes {multi.profile.parallel.nnodes})")
    if multi is not None and len({loaded.path for loaded in loaded_for.values()}) > 1:
        raise ConfigError(f"profile {multi.name} is multi-node: every host of group {scope.group} runs it, so give it "
                          f"to all (--profile {multi.name}) instead of each host's `profile` var")
    front = router_in_front(scope, reach) if multi is None else None
    if not options.dry_run:
        names = ", ".join(sorted({loaded.name for loaded in loaded_for.values()}))
        reach.consent(f"deploy {names} to {scope.names[0]}?" if scope.one_host else
                      f"deploy {names} to {len(scope.targets)} hosts of group {scope.group} ({', '.join(loaded_for)})?")
    def service_of(host: str) -> str:
        return loaded_for[host].profile.service.name

    def deploy_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None) -> Outcome:
        return engine.deploy(loaded_for[target.host.name], target, remote, progress, options, before_restart=drain,
                             alone=scope.alone)

    def act() -> FleetRun[Outcome]:
        if multi is not None:
            return _deploy_nodes(multi, scope, options, reach)
        return run_each(scope, reach, behind(front, lambda t: service_of(t.host.name), deploy_host),
                        rolled_out(front, scope, reach))
    if options.dry_run:  # a plan changes nothing: no hook runs, nobody is told
        return act()
    from deploy_lib.ops.notices import Announced
    names = ",".join(sorted({loaded.name for loaded in loaded_for.values()}))
    return Announced("deploy", scope, service_of, reach, names).around(act)


def _deploy_nodes(loaded: LoadedProfile, scope: Scope, options: Options, reach: Reach) -> FleetRun[Outcome]:
    """A multi-node release on the group's hosts as one: one connection per node, progress prefixed by its name."""
    from deploy_lib.ops.multinode import plan_nodes
    from deploy_lib.ops.multinode_deploy import as_fleet, deploy_nodes
    if scope.rollout is not None:
        raise ConfigError(f"profile {loaded.name} is multi-node: its nodes restart together, so --serial and "
                          "--max-fail do not apply")
    nodes = plan_nodes(loaded, scope.targets, str(scope.group))
    with ExitStack() as connections:
        remotes = {node.name: connections.enter_context(reach.connect(node.target, True)) for node in nodes}
        fleet = as_fleet([node.name for node in nodes], lambda: deploy_nodes(nodes, remotes, reach.progress, options))
    assert fleet is not None  # a deploy always ends with outcomes or an error
    return fleet


def rollback(scope: Scope, service: str, to: str | None, reach: Reach) -> FleetRun[Outcome]:
    """Every host of the scope back to `to` (default: each one's last healthy release); a group whose target is a
    multi-node release is rolled back as one (no --serial or --max-fail then), one node alone is refused."""
    from deploy_lib.commands import deploy as engine
    from deploy_lib.ops.notices import Announced
    front = router_in_front(scope, reach) if scope.one_host else None
    if scope.one_host:
        reach.consent(f"roll {scope.names[0]} back to {to or LAST_HEALTHY}?")
    else:
        reach.consent(f"roll {len(scope.targets)} hosts of group {scope.group} ({', '.join(scope.names)}) back to "
                      f"{to or LAST_HEALTHY}?")

    def rollback_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None
                      ) -> Outcome:
        return engine.rollback(target, service, remote, progress, to, reach.environ, before_restart=drain,
                               alone=scope.alone)

    def act() -> FleetRun[Outcome]:
        if scope.one_host:
            return run_each(scope, reach, behind(front, service, rollback_host))
        multi = _rollback_nodes(scope, service, to, reach)
        if multi is not None:
            return multi
        replicas = router_in_front(scope, reach)
        return run_each(scope, reach, behind(replicas, service, rollback_host), rolled_out(replicas, scope, reach))
    return Announced("rollback", scope, service, reach).around(act, to)


def _rollback_nodes(scope: Scope, service: str, to: str | None, reach: Reach) -> FleetRun[Outcome] | None:
    """A group whose rollback target is a multi-node release, rolled back as one; None when it is not."""
    from deploy_lib.host.switch import GRACE_S
    from deploy_lib.ops.multinode_deploy import as_fleet, rollback_nodes
    with ExitStack() as connections:
        remotes = {t.host.name: connections.enter_context(reach.connect(t, True)) for t in scope.targets}
        return as_fleet(scope.names, lambda: rollback_nodes(scope.targets, remotes, reach.progress, service, to,
                                                            reach.environ, GRACE_S, rolling=scope.rollout is not None))


def start(scope: Scope, service: str, restart: bool, reach: Reach) -> FleetRun[Outcome]:
    """(Re)start the current release on every host of the scope and climb the readiness ladder: a group whose
    current release is one multi-node release is (re)started as one (every node together, the ladder on node 0), a
    node of one alone is refused; replicas behind a router are taken out one at a time."""
    from deploy_lib.commands import deploy as engine
    from deploy_lib.ops.notices import Announced
    front = router_in_front(scope, reach)
    reach.consent(f"{'restart' if restart else 'start'} {service} on {_where(scope)}?")

    def start_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None) -> Outcome:
        return engine.start(target, service, remote, progress, reach.environ, restart, before_restart=drain)

    def act() -> FleetRun[Outcome]:
        multi = None if scope.one_host else _start_nodes(scope, service, restart, reach)
        if multi is not None:
            return multi
        return run_each(scope, reach, behind(front, service, start_host), rolled_out(front, scope, reach))
    # no hooks of its own; the webhook hears of the automatic rollback of a release that did not come up
    return Announced("restart" if restart else "start", scope, service, reach).around(act)


def patch(project: Project, scope: Scope, patch_set: PatchSet, profile: str | None, service: str, enable: bool,
          reach: Reach) -> tuple[CheckReport | None, Outcome]:
    """A patch set's enable (a patched venv, the profile deployed on it; its check report too) or disable (the
    profile on the venv it was derived from) on one host. The profile is the one given, the host's `profile` var,
    else its current release's (read from the host); then the consent question, then the project's deploy hooks
    around the change, the host's webhook told how it ended."""
    from deploy_lib.commands import deploy as engine
    from deploy_lib.commands import patches as on_host
    from deploy_lib.commands.releases import current_profile
    from deploy_lib.ops.notices import Announced
    [target] = scope.targets
    options = engine.Options(environ=dict(reach.environ))
    with reach.connect(target, False) as remote:
        base = on_host.base_profile(profile_for_host(project, profile, target)
                                    or current_profile(target, service, remote), patch_set)
        deployed = on_host.patched_profile(base, patch_set) if enable else base
        reach.consent(f"patch {patch_set.name} and deploy {deployed.name} to {target.host.name}?" if enable else
                      f"deploy {base.name} without {patch_set.name} to {target.host.name}?")
        announced = Announced("patch", scope, base.profile.service.name, reach, deployed.name)
        if enable:
            return announced.around_one(lambda: on_host.enable(remote, patch_set, base, deployed, target,
                                                               reach.progress(""), options), lambda done: done[1])
        return None, announced.around_one(lambda: on_host.disable(remote, patch_set, base, target,
                                                                  reach.progress(""), options), lambda done: done)


def tune(scope: Scope, loaded: LoadedProfile, request: Request, reach: Reach) -> TuneReport | Planned | GroupTune:
    """A sweep on one host, or over a group's hosts at once (ops/tune_group); one that changes hosts (not a dry run)
    after the consent question, between the project's deploy hooks, each host's webhook told how it ended there."""
    from deploy_lib.ops.notices import Announced, sweep_ends
    if not request.dry_run:
        reach.consent(f"tune {loaded.name} on {scope.names[0]}: each candidate restarts the server?" if scope.one_host
                      else f"tune {loaded.name} on the {len(scope.targets)} hosts of group {scope.group}: each "
                      "candidate restarts the server it runs on?")

    def act() -> TuneReport | Planned | GroupTune:
        if not scope.one_host:
            from deploy_lib.ops.tune_group import tune_group
            return tune_group(scope, loaded, request, reach)
        from deploy_lib.commands.tune import tune as sweep
        [target] = scope.targets
        with reach.connect(target, False) as remote:
            return sweep(loaded, target, remote, reach.progress(""), request)
    if request.dry_run:  # a plan changes nothing: no hook runs, nobody is told
        return act()
    return Announced("tune", scope, loaded.profile.service.name, reach, loaded.name).around_call(
        act, lambda done: sweep_ends(done, scope))


def router_deploy(scope: Scope, site: RouterSite, workers: Sequence[str], group: str, reach: Reach
                  ) -> RouterOutcome:
    """The router's release serving `workers` on its host (`scope`: that host), after the consent question, between
    the project's deploy hooks, the host's webhook told how it ended."""
    from deploy_lib.ops.notices import Announced
    from deploy_lib.ops.router import SERVICE
    from deploy_lib.ops.router_deploy import deploy_router
    [target] = scope.targets
    reach.consent(f"deploy the router for group {group} ({', '.join(workers)}) to {site.host.name}:{site.port}?")

    def act() -> RouterOutcome:
        with reach.connect(target, False) as remote:
            return deploy_router(site, target, remote, workers, group, reach.progress(""))
    return Announced("router.deploy", scope, SERVICE, reach).around_one(act, lambda done: done)


def _start_nodes(scope: Scope, service: str, restart: bool, reach: Reach) -> FleetRun[Outcome] | None:
    """A group whose current release is multi-node, (re)started as one; None when it is not."""
    from deploy_lib.host.switch import GRACE_S
    from deploy_lib.ops.multinode_deploy import as_fleet, start_nodes
    if scope.rollout is not None:
        return None  # each host with its rollout: a node of a multi-node release is refused alone
    with ExitStack() as connections:
        remotes = {t.host.name: connections.enter_context(reach.connect(t, True)) for t in scope.targets}
        return as_fleet(scope.names, lambda: start_nodes(scope.targets, remotes, reach.progress, service, restart,
                                                         reach.environ, GRACE_S))


def stop(scope: Scope, service: str, reach: Reach) -> FleetRun[Outcome]:
    """Stop the server on every host of the scope (a group: all at once, so a multi-node release stops as a whole;
    one node of it alone is refused); a replica stays out of its router until started."""
    from deploy_lib.commands import deploy as engine
    front = router_in_front(scope, reach)
    reach.consent(f"stop {service} on {_where(scope)}?")

    def stop_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None) -> Outcome:
        return engine.stop(target, service, remote, before_stop=drain, alone=scope.alone)
    return run_each(scope, reach, behind(front, service, stop_host, leaves_out="stopped"),
                    rolled_out(front, scope, reach))


def uninstall(scope: Scope, service: str, state_dir: Path, reach: Reach) -> FleetRun[Uninstalled]:
    """Remove the unit, releases, managed venvs and caches; each host's history is copied to `state_dir` first. A
    group's hosts go all at once (a multi-node release as a whole; one node of it alone is refused), replicas behind
    a router one at a time, each taken out first."""
    from deploy_lib.commands import uninstall as remove
    bases = ", ".join(sorted({str(target.layout(service).base) for target in scope.targets}))
    front = router_in_front(scope, reach)
    reach.consent(f"remove service {service} from {_where(scope)}: stop its unit, delete {bases} (releases, managed "
                  f"venvs, caches)? history is kept in {state_dir}")

    def remove_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None
                    ) -> Uninstalled:
        return remove.uninstall(target, service, remote, state_dir, before_stop=drain, alone=scope.alone)
    return run_each(scope, reach, behind(front, service, remove_host, leaves_out="uninstalled"),
                    rolled_out(front, scope, reach))


def gpu_check(scope: Scope, service: str, loaded: LoadedProfile | None, stop_server: bool, sizes: Sequence[int],
              reach: Reach) -> FleetRun[GpuCheckReport]:
    """The NCCL check on every host of the scope; --stop-server takes a replica out of its router for the check
    (one node of a multi-node release is refused: its server is stopped only with the others)."""
    from deploy_lib.commands import gpu_check as checks
    nodes = _proxmox_nodes(scope, reach)

    def check_host(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None
                   ) -> GpuCheckReport:
        return checks.run_gpu_check(target, service, remote, progress, loaded, stop_server, reach.environ, sizes,
                                    before_stop=drain, peer_to_peer=nodes)
    front = router_in_front(scope, reach) if stop_server else None
    return run_each(scope, reach, behind(front, service, check_host), rolled_out(front, scope, reach))


def status(scope: Scope, service: str, reach: Reach) -> FleetRun[StatusReport]:
    """Each host's status; the webhook hears of a crash loop systemd gave up on, from the read that finds it."""
    from deploy_lib.commands import status as host_status
    from deploy_lib.ops.notices import crash_loops
    nodes = _proxmox_nodes(scope, reach)
    fleet = run_each(scope, reach, lambda target, remote, _: host_status.read_status(target, service, remote,
                                                                                     peer_to_peer=nodes))
    crash_loops(fleet, scope, reach)
    return fleet


def _proxmox_nodes(scope: Scope, reach: Reach) -> NodeReader:
    """The Proxmox node each host's vars name, for the peer-to-peer verdict (read-only, through `reach`)."""
    from deploy_lib.host.p2p_reading import node_reader
    return node_reader(scope.inventory, scope.targets, lambda target: reach.connect(target, True),
                       scope.accept_new_host_key)


def releases(scope: Scope, service: str, reach: Reach, workload_names: Sequence[str] = ()
             ) -> FleetRun[list[ReleaseRow]]:
    from deploy_lib.commands import releases as host_releases
    return run_each(scope, reach, lambda target, remote, _: host_releases.list_releases(target, service, remote,
                                                                                        workload_names))


def logs(scope: Scope, service: str, lines: int, reach: Reach) -> FleetRun[list[str]]:
    from deploy_lib.commands import logs as host_logs
    return run_each(scope, reach, lambda target, remote, _: host_logs.read_log(target, service, remote, lines))


def workload(project: Project, scope: Scope, service: str, name: str, window_s: float, every_s: float,
             reach: Reach) -> tuple[Workload, Path]:
    """The served workload read from every host of the scope at once over the window (a group's hosts added: one
    service's replicas), written to the project's inventory/workloads/<name>.yaml; a host that fails fails it."""
    from deploy_lib.commands import workload as host_workload
    fleet = run_each(scope, reach, lambda target, remote, progress: host_workload.read_host_scrapes(
        target, service, remote, window_s, every_s, progress))
    for run in fleet.runs:
        if run.error is not None:
            raise run.error
    read = [run.result for run in fleet.runs if run.result is not None]
    return host_workload.record_workload(name, read, project.workloads_dir)


def report(scope: Scope, service: str, releases: Sequence[str], out: Path, reach: Reach, tune: str | None = None,
           workloads: Sequence[Workload] = ()) -> FleetRun[tuple[Path, ...]]:
    """Each host's history read (a group's hosts at once), then its page, CSV and JSON written under `out` one host
    after the other (matplotlib's pyplot, which draws the charts, is not thread-safe); the paths, page first. With
    `tune`, the page of that tuning sweep instead of the host's story."""
    if tune is not None and releases:
        raise ConfigError(f"--release {releases[0]} with --tune {tune}: --release picks lines of the host's report, "
                          "a sweep's page draws its candidates", "give one of them")
    from deploy_lib.host.report import read_report, read_sweep, write_report
    from deploy_lib.ops.fleet import FleetRun, HostRun
    read = run_each(scope, reach, lambda target, remote, _: read_sweep(target, service, remote, tune,
                                                                       workloads=workloads) if tune
                    else read_report(target, service, remote, releases, workloads=workloads))
    written: list[HostRun[tuple[Path, ...]]] = []
    for run in read.runs:
        try:
            paths = write_report(run.result, out) if run.result is not None else None
            written.append(HostRun(run.host, result=paths, error=run.error, started=run.started))
        except DeployError as error:
            if scope.one_host:  # raised as a one-host command's error
                raise
            written.append(HostRun(run.host, error=error, started=run.started))
    return FleetRun(tuple(written), read.batches, stopped=read.stopped, interruption=read.interruption)


def venv_build(scope: Scope, loaded: LoadedProfile, reach: Reach) -> VenvResult:
    """The profile's locked venv (`service.venv_build`) built on the host, or reused; only missing wheels travel."""
    from deploy_lib.host.venv_build import ensure_venv
    [target] = scope.targets
    spec = loaded.profile.service.venv_build
    if spec is None:
        raise ConfigError(f"profile {loaded.name} has no service.venv_build")
    reach.consent(f"build the venv of {loaded.name} on {target.host.name}?")
    with reach.connect(target, False) as remote:
        return ensure_venv(remote, target.layout(loaded.profile.service.name), spec, progress=reach.progress(""),
                           where=target.host.name)


def venv_adopt(scope: Scope, service: str, path: PurePosixPath, reach: Reach) -> VenvResult:
    """A hand-made venv recorded as a managed, immutable one (a hard-linked copy)."""
    from deploy_lib.host.venv_adopt import adopt
    [target] = scope.targets
    reach.consent(f"adopt {path} as a managed venv on {target.host.name}?")
    with reach.connect(target, False) as remote:
        return adopt(remote, target.layout(service), path, where=target.host.name)


def venv_remove(scope: Scope, service: str, venv_hash: str, reach: Reach) -> PrunePlan:
    """A managed venv and its caches removed, unless a release or a derived venv needs it; what was removed."""
    from deploy_lib.commands.uninstall import remove_venv
    [target] = scope.targets
    reach.consent(f"remove venv {venv_hash} of {service} on {target.host.name}?")
    with reach.connect(target, False) as remote:
        return remove_venv(target, service, remote, venv_hash)


def adopt(scope: Scope, service: str, profile: str, pid: int | None, unit: str | None, reach: Reach) -> Adopted:
    """A server started by hand (`pid`, or the hand-written systemd `unit`, which names the service) recorded as
    release 0, and the profile that reproduces it."""
    from deploy_lib.commands.adopt import adopt as adopt_server
    [target] = scope.targets
    name = (unit or "").removesuffix(".service") or service
    what = f"unit {name}.service" if unit else f"pid {pid}"
    reach.consent(f"adopt {what} on {target.host.name} as release 0 of service {name}?")
    with reach.connect(target, False) as remote:
        return adopt_server(target, name, remote, profile, pid, from_unit=unit is not None)


def unlock(scope: Scope, service: str, force: bool, reach: Reach) -> LockInfo | None:
    """The service's lock removed when its owner is gone (any lock, with `force`); what was removed, None: none."""
    from deploy_lib.host.store import unlock as unlock_store
    from deploy_lib.store import LockContext
    [target] = scope.targets
    reach.consent(f"remove the lock of {service} on {target.host.name}?")
    with reach.connect(target, False) as remote:
        return unlock_store(remote, target.layout(service), force, LockContext(where=target.host.name))


def _where(scope: Scope) -> str:
    return scope.names[0] if scope.one_host else f"{len(scope.targets)} hosts of group {scope.group} " \
        f"({', '.join(scope.names)})"


def one(fleet: FleetRun[Any]) -> Any:
    """A one-host command's result (its error was raised)."""
    [run] = fleet.runs
    return run.result


__all__ = ["adopt", "deploy", "gpu_check", "logs", "one", "patch", "releases", "rollback", "router_deploy", "start",
           "status", "stop", "tune", "uninstall", "unlock", "venv_adopt", "venv_build", "venv_remove", "workload"]
