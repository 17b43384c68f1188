"""A multi-node release deployed to (or rolled back on) its nodes as one: every node locked, read and preflighted
before any switch; then the coordinated switch of multinode_switch.py (all stopped, then all started; the ladder on
node 0, the unit alive on the others; any node failing takes every node back to their previous common release).
Built from the per-host engine's parts (deploy_lib/deploy: plan and preflight; deploy_lib/host: the transition,
batches and history), one connection per node."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from deploy_lib.commands.deploy import (
    Options,
    Outcome,
    SweepCandidate,
    choose_venv,
    page_cache_plan,
    page_cache_roots,
    pre_read,
    releases_to_keep,
    stage_weights,
    warm_page_cache,
)
from deploy_lib.deploy.plan import BatchKind, Plan, hand_run_check, hand_run_pid, plan_deploy, release_tags
from deploy_lib.deploy.preflight import preflight
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, DeployError, PreflightError
from deploy_lib.facts.host import FactRequest, HostFacts
from deploy_lib.health import Ready
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.page_cache import read_residency
from deploy_lib.host.prune import prune
from deploy_lib.host.store import host_lock, read_store_facts
from deploy_lib.host.switch import Transition, interruption, recorded_tags
from deploy_lib.interrupts import interrupted, signal_name, signals_raise
from deploy_lib.models import ModelFacts, Weights, check_model, weights
from deploy_lib.ops.fleet import FleetRun, HostRun
from deploy_lib.ops.multinode import Node, group_release_id_over
from deploy_lib.ops.multinode_switch import Member, NodeFailed, activate, common_release, each, restore
from deploy_lib.outcomes import Action
from deploy_lib.profile import read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.release.model import resolve_secrets
from deploy_lib.remote import Remote
from deploy_lib.store import HEALTHY, StoreFacts


@dataclass
class NodeDeploy(Member):
    """A node during a deploy: what it was read as, its plan, and its weights."""

    node: Node
    facts: HostFacts
    plan: Plan
    model: Weights
    model_facts: ModelFacts


def _runs(targets: Sequence[Target], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
          service: str, environ: Mapping[str, str], grace_s: float) -> dict[str, Transition]:
    return {t.host.name: Transition(remotes[t.host.name], t.layout(service), t, progress_of(t.host.name), environ,
                              grace_s=grace_s) for t in targets}


def _lock_all(locks: ExitStack, runs: Mapping[str, Transition], purpose: str) -> None:
    """Every node's lock, before any node is read: a lock held on one refuses the command with nothing changed."""
    for name, run in runs.items():
        locks.enter_context(host_lock(run.remote, run.layout, purpose, name))


def deploy_nodes(nodes: Sequence[Node], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
                 options: Options, sweep: SweepCandidate | None = None) -> list[Outcome]:
    """Take every node to the group's release, or every node back to the previous common release; one Outcome per
    node in rank order, or one DeployError for the group that names the node that failed. `sweep`: a tuning
    sweep's candidate, whose releases the prune keeps."""
    head = nodes[0].loaded
    if head.profile.preflight.gpu_check:
        raise ConfigError(f"profile {head.name}: preflight.gpu_check runs NCCL's check within one host; a multi-node "
                          "release is checked by its own rendezvous", "set preflight.gpu_check: false")
    secrets = {} if options.dry_run else resolve_secrets(head.profile, options.environ, str(head.path))
    runs = _runs([node.target for node in nodes], remotes, progress_of, head.profile.service.name, options.environ,
                 options.grace_s)
    with signals_raise(), ExitStack() as locks:
        try:
            if not options.dry_run:
                _lock_all(locks, runs, f"deploy {head.name} (multi-node)")
            states = _plan(nodes, runs, options, secrets)
            plans = [state.plan for state in states]
            release_id = plans[0].release.id
            if options.dry_run:
                return [Outcome(Action.planned, release_id, plan.current_id, plan=plan)
                        for plan in each(states, _with_page_cache)]
            # unchanged: every node's release current, active and recorded healthy, and node 0 answering now
            if all(plan.unchanged for plan in plans) and \
                    isinstance(states[0].run.live_verdict(plans[0].release.metadata()), Ready):
                return [Outcome(Action.unchanged, release_id, plan.current_id, plan=plan) for plan in plans]
            restore_id = common_release([state.store for state in states], release_id)
            if head.profile.watch is not None:  # the watch reads one server's window around one host's switch
                states[0].run.progress.note("watch: not run for a multi-node release (the watch judges one host's "
                                            "switch); it is deployed unwatched")
            each(states, lambda state: _stage(state, options))
        except KeyboardInterrupt as stop:
            raise interrupted(stop, f"interrupted ({signal_name(stop)}) before the switch; nothing was switched or "
                                    "restarted on any node") from None
        tags = {state.name: release_tags(state.run.target, plan.release) for state, plan in zip(states, plans,
                                                                                                 strict=True)}
        try:
            ready = activate(states, release_id, {s.name: p.release.metadata() for s, p in zip(states, plans,
                                                                                                 strict=True)})
        except NodeFailed as failed:
            restore(states, "deploy", release_id, tags, failed.failure, failed.where, restore_id,
                    plans[0].current_id)
        except KeyboardInterrupt as stop:
            interrupt, diagnosis = interruption(stop)
            restore(states, "deploy", release_id, tags, interrupt, None, restore_id, plans[0].current_id, diagnosis)
        for state in states:
            state.run.record("deploy", HEALTHY, tags[state.name])
            prune(state.run.remote, state.run.layout, releases_to_keep(head.profile, sweep), tags[state.name],
                  state.run.progress)
    return [Outcome(Action.deployed, release_id, plan.current_id, plan=plan, ready=ready, timings=state.run.timings,
                    downtime=state.run.downtime) for state, plan in zip(states, plans, strict=True)]


def _plan(nodes: Sequence[Node], runs: Mapping[str, Transition], options: Options, secrets: Mapping[str, str]
          ) -> list[NodeDeploy]:
    """Read every node and plan its own release; the group's id (from every node's own) then replaces each one's,
    and every node passes preflight before anything is switched."""
    def read(node: Node) -> tuple[NodeDeploy, Callable[[str | None], Plan]]:
        run, profile = runs[node.name], node.loaded.profile
        model = weights(profile, node.target.host.vars, secrets)
        venv = choose_venv(run.remote, run.layout, node.target, profile, options.dry_run, run.progress)
        run.progress.phase_started("facts")
        facts = read_host_facts(run.remote, FactRequest(run.layout, venv.path, profile.server.port, None,
                                                        profile.service.working_directory,
                                                        tuple(model.fact_steps(venv.path)),
                                                        write_caches=not options.dry_run))
        current = facts.store.release(facts.store.current) if facts.store.current else None
        hand_pid = hand_run_pid(current.metadata if current else None,
                                run.remote.run(hand_run_check(current.metadata if current else None)))
        if hand_pid is not None:  # the coordinated switch stops units, not a process someone runs by hand
            raise PreflightError(f"{node.name}: the adopted server (pid {hand_pid}, release {facts.store.current}) "
                                 "still runs by hand; a multi-node deploy stops and starts every node's unit together",
                                 f"stop pid {hand_pid} on {node.name} first; nothing was changed")
        run.previous = facts.store.current
        run.serving_before = facts.unit.active_state == "active"  # its stop starts the group's downtime
        model_facts = model.parse(facts.model_results)
        check_model(model, model_facts, node.name)

        def plan(release_id: str | None) -> Plan:
            return plan_deploy(node.loaded, node.target, facts, secrets, options.force, datetime.now(UTC), venv, (),
                               {}, None, model, model_facts, release_id=release_id)
        return NodeDeploy(node.name, node.rank, run, facts.store, node, facts, plan(None), model, model_facts), plan

    read_nodes = each(nodes, read)
    release_id = group_release_id_over([state.plan.release.id for state, _ in read_nodes],
                                       [state.facts.store.current for state, _ in read_nodes])
    for state, plan in read_nodes:
        state.plan = plan(release_id)
        preflight(state.plan, state.node.loaded, state.node.target, state.facts)
    return [state for state, _ in read_nodes]


def _with_page_cache(state: NodeDeploy) -> Plan:
    """A dry run's plan of one node, with how much of the current and the new release's weights its page cache
    holds, as a single host's plan says."""
    readings = {root: read_residency(state.run.remote, root)
                for root in page_cache_roots(state.plan, state.facts, state.model_facts, dry_run=True)}
    return replace(state.plan, notes=(*state.plan.notes,
                                      *page_cache_plan(state.plan, state.facts, state.model_facts, readings)))


def _stage(state: NodeDeploy, options: Options) -> None:
    """The weights and the release's files onto the node, and the weights into its page cache (unless
    --no-pre-read), while the old release still serves."""
    if not state.model_facts.complete:
        stage_weights(state.run, state.model, state.plan.release.venv, state.plan, state.facts)
    pre_read(state.run, options, state.plan.release.model, {})
    state.run.phase(BatchKind.stage, state.plan.batches.stage)


def rollback_nodes(targets: Sequence[Target], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
                   service: str, to: str | None, environ: Mapping[str, str], grace_s: float, rolling: bool = False
                   ) -> list[Outcome] | None:
    """A group rollback whose target is a multi-node release: every node to it by the coordinated switch, after
    the same preflight as a single host's rollback on every node; on failure every node back to what ran. None when
    the target is not multi-node (the caller rolls each host back on its own). `rolling` (--serial, --max-fail) is
    refused for a multi-node target: its nodes restart together."""
    runs = _runs(targets, remotes, progress_of, service, environ, grace_s)
    with signals_raise(), ExitStack() as locks:
        _lock_all(locks, runs, f"rollback to {to or 'the last healthy release'} (multi-node)")
        stores = {name: read_store_facts(run.remote, run.layout) for name, run in runs.items()}
        currents = {store.current for store in stores.values()}
        target_id = to or common_release(list(stores.values()), next(iter(currents)) if len(currents) == 1 else None)
        found = _members(runs, stores, target_id, "--serial and --max-fail do not apply" if rolling else None)
        if found is None:
            return None
        members, metadata = found
        assert target_id is not None  # _members found the release on every node
        for member, facts in zip(members, each(members, lambda m: m.run.check_target(target_id, metadata[m.name])),
                                 strict=True):
            member.run.serving_before = facts.unit.active_state == "active"
        # the target's weights into each node's page cache while the old release serves, as a deploy's
        each(members, lambda m: warm_page_cache(m.run, metadata[m.name].get("model") or {}, {}))
        previous = stores[members[0].name].current
        restore_id = previous if len(currents) == 1 and previous != target_id else None
        tags = {m.name: recorded_tags(m.run.target, target_id, metadata[m.name]) for m in members}
        try:
            ready = activate(members, target_id, metadata)
        except NodeFailed as failed:
            restore(members, "rollback", target_id, tags, failed.failure, failed.where, restore_id, previous)
        except KeyboardInterrupt as stop:
            interrupt, diagnosis = interruption(stop)
            restore(members, "rollback", target_id, tags, interrupt, None, restore_id, previous, diagnosis)
        for member in members:
            member.run.record("rollback", HEALTHY, tags[member.name], f"by hand from {previous or 'none'}")
    return [Outcome(Action.rolled_back, target_id, stores[name].current, ready=ready, timings=run.timings,
                    downtime=run.downtime) for name, run in runs.items()]


def _members(runs: Mapping[str, Transition], stores: Mapping[str, StoreFacts], target_id: str | None,
             refused: str | None) -> tuple[list[Member], dict[str, dict[str, Any]]] | None:
    """The nodes of `target_id` in rank order with its release.json on each, when it is a multi-node release of
    exactly these hosts; None when it is a single-host release (each host acts on its own). ConfigError when it is
    multi-node but not on every host, or when `refused` says what does not apply to a multi-node release."""
    metadata = {name: dict(record.metadata) for name, store in stores.items()
                if target_id and (record := store.release(target_id))}
    nnodes = {read_stored_profile(m.get("profile")).parallel.nnodes for m in metadata.values()}
    if not metadata or nnodes == {1}:
        return None
    if refused is not None:
        raise ConfigError(f"release {target_id} is multi-node: its nodes restart together, so {refused}",
                          "act on the group without them")
    missing = sorted(set(runs) - set(metadata))
    if target_id is None or missing or nnodes != {len(runs)}:
        raise ConfigError(f"release {target_id or '(none in common)'} is not a multi-node release of these "
                          f"{len(runs)} hosts" + (f": not on {', '.join(missing)}" if missing else ""),
                          "`invoke releases --group G` lists each node's releases; --to names one on every node")
    members = sorted((Member(name, read_stored_profile(metadata[name].get("profile")).parallel.node_rank, run,
                             stores[name]) for name, run in runs.items()), key=lambda member: member.rank)
    return members, metadata


def start_nodes(targets: Sequence[Target], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
                service: str, restart: bool, environ: Mapping[str, str], grace_s: float) -> list[Outcome] | None:
    """A group start or restart whose current release is one multi-node release on every host: every node stopped
    and started together by the coordinated switch (the ladder on node 0), a start with every node's unit active
    changing nothing; on failure every node back to their previous common healthy release. None when the current
    release is not multi-node (the caller starts each host on its own, refusing a node left alone)."""
    event = "restart" if restart else "start"
    runs = _runs(targets, remotes, progress_of, service, environ, grace_s)
    with signals_raise(), ExitStack() as locks:
        _lock_all(locks, runs, f"{event} (multi-node)")
        facts = dict(zip(runs, each(list(runs.values()), lambda run: read_host_facts(
            run.remote, FactRequest(run.layout, venv=None, port=None))), strict=True))
        stores = {name: read.store for name, read in facts.items()}
        currents = {store.current for store in stores.values()}
        current = next(iter(currents)) if len(currents) == 1 else None
        found = _members(runs, stores, current, None)
        if found is None:
            return None
        members, metadata = found
        assert current is not None  # _members found the release on every node
        if not restart and all(read.unit.active_state == "active" for read in facts.values()):
            return [Outcome(Action.already_running, current, current) for _ in runs]
        restore_id = common_release(list(stores.values()), current)
        for member in members:
            member.run.serving_before = facts[member.name].unit.active_state == "active"
        tags = {m.name: recorded_tags(m.run.target, current, metadata[m.name]) for m in members}
        try:
            ready = activate(members, current, metadata)
        except NodeFailed as failed:
            restore(members, event, current, tags, failed.failure, failed.where, restore_id, current)
        except KeyboardInterrupt as stop:
            interrupt, diagnosis = interruption(stop)
            restore(members, event, current, tags, interrupt, None, restore_id, current, diagnosis)
        for member in members:
            member.run.record(event, HEALTHY, tags[member.name])
    return [Outcome(Action.restarted if restart else Action.started, current, current, ready=ready,
                    timings=run.timings, downtime=run.downtime) for run in runs.values()]


def as_fleet(names: Sequence[str], act: Callable[[], Sequence[Any] | None]) -> FleetRun[Any] | None:
    """A multi-node command's end as a group command's: every node's outcome, or every node with the one error."""
    try:
        outcomes = act()
    except DeployError as error:
        return FleetRun(tuple(HostRun(name, error=error) for name in names), (tuple(names),))
    if outcomes is None:
        return None
    return FleetRun(tuple(HostRun(name, result=outcome) for name, outcome in zip(names, outcomes, strict=True)),
                    (tuple(names),))


__all__ = ["as_fleet", "deploy_nodes", "rollback_nodes", "start_nodes"]
