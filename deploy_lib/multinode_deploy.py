"""A multi-node release deployed to its nodes as one: every node locked, read and preflighted before any switch;
a coordinated restart (all nodes stopped, then all started; the readiness ladder on node 0, which serves HTTP, and
the unit alive on every other node); any node failing takes every node back to their previous common release.
Built from the per-host engine (deploy.py: its run, plan, preflight, batches and probes), one connection per node."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

from deploy_lib.deploy import (
    Options,
    Outcome,
    Plan,
    _Run,
    _same_kind,
    choose_venv,
    failure_line,
    hand_run_check,
    hand_run_pid,
    interruption,
    plan_deploy,
    preflight,
    probe_target,
    recorded_tags,
    release_tags,
    reset_failed_step,
    restart_steps,
    stage_weights,
    start_prediction,
    stop_step,
)
from deploy_lib.diagnose import Diagnosis, journal_cursor_step, parse_journal_cursor
from deploy_lib.errors import ConfigError, DeployError, ReadinessFailed, RollbackFailed
from deploy_lib.facts import HostFacts, read_host_facts
from deploy_lib.fleet import FleetRun, HostRun
from deploy_lib.health import ProbeTarget, Ready, ReadyReport, Rung, wait_ready
from deploy_lib.interrupts import interrupted, signal_name, signals_raise
from deploy_lib.models import ModelFacts, Weights, check_model, weights
from deploy_lib.multinode import Node, group_release_id
from deploy_lib.progress import Progress
from deploy_lib.release import resolve_secrets
from deploy_lib.remote import Remote
from deploy_lib.store import FAILED, HEALTHY, StoreFacts, host_lock, switch_current

T = TypeVar("T")
# causes that are the symptom of another node's failure: a node with any other cause is the one to name
_SYMPTOMS = frozenset({"nccl_timeout", "rendezvous", "unknown"})


class NodeFailed(Exception):
    """A node's check failed during a coordinated start: which node, and what its ladder saw."""

    def __init__(self, where: str, failure: ReadinessFailed) -> None:
        super().__init__(where)
        self.where = where
        self.failure = failure


@dataclass
class NodeRun:
    """One node during the deploy: its per-host run (connection, progress, history), facts and plan."""

    node: Node
    run: _Run
    facts: HostFacts
    plan: Plan
    model: Weights
    model_facts: ModelFacts

    @property
    def where(self) -> str:
        return f"{self.node.name} (node rank {self.node.rank})"


def common_release(stores: Sequence[StoreFacts], exclude: str) -> str | None:
    """The release every node goes back to: each node's last healthy one, when it is the same on all."""
    found = {store.last_healthy(exclude=exclude) for store in stores}
    return found.pop() if len(found) == 1 else None


def blamed(diagnoses: Sequence[tuple[str, Diagnosis]], failed_where: str) -> tuple[str, Diagnosis]:
    """The node whose own failure explains the others': the first one with a cause that is not a symptom (an NCCL
    or rendezvous timeout follows from a rank that died), else the node whose check failed."""
    causes = [(where, diagnosis) for where, diagnosis in diagnoses if diagnosis.signature not in _SYMPTOMS]
    if causes:
        return causes[0]
    return next(((where, d) for where, d in diagnoses if where == failed_where), diagnoses[0])


def _each(items: Sequence[T], act: Callable[[T], Any]) -> list[Any]:
    """`act` on every node at once (one thread and connection each); the first error is raised once all ended. A
    signal (raised in the main thread only) waits for every node's round trip to end before it is raised, so what
    follows (the switch back) never shares a connection with a step still running."""
    interrupt: KeyboardInterrupt | None = None
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="node") as pool:
        futures = [pool.submit(act, item) for item in items]
        while True:
            try:
                wait(futures)
                break
            except KeyboardInterrupt as stop:
                interrupt = interrupt or stop
    if interrupt is not None:
        raise interrupt
    for future in futures:
        if future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return [future.result() for future in futures]


def deploy_nodes(nodes: Sequence[Node], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
                 options: Options) -> list[Outcome]:
    """Take every node to the group's release, or every node back to the previous common release; one Outcome per
    node in rank order, or one DeployError for the group that names the node that failed."""
    head = nodes[0].loaded
    if head.profile.preflight.gpu_check:
        raise ConfigError(f"profile {head.name}: preflight.gpu_check runs NCCL's check within one host; a multi-node "
                          "release is checked by its own rendezvous", "set preflight.gpu_check: false")
    secrets = {} if options.dry_run else resolve_secrets(head.profile, options.environ)
    runs = {node.name: _Run(remotes[node.name], node.target.layout(node.loaded.profile.service.name), node.target,
                            progress_of(node.name), options.environ, grace_s=options.grace_s) for node in nodes}
    with signals_raise(), ExitStack() as locks:
        try:
            for node in [] if options.dry_run else nodes:  # every node locked before any is read
                run = runs[node.name]
                locks.enter_context(host_lock(run.remote, run.layout, f"deploy {head.name} (node rank {node.rank})",
                                              node.name))
            states = _plan(nodes, runs, options, secrets)
            release_id = states[0].plan.release.id
            if options.dry_run:
                return [Outcome("planned", release_id, s.plan.current_id, plan=s.plan) for s in states]
            # unchanged: every node's release current, active and recorded healthy, and node 0 answering now
            if all(s.plan.unchanged for s in states) and \
                    isinstance(states[0].run.live_verdict(states[0].plan.release.metadata()), Ready):
                return [Outcome("unchanged", release_id, s.plan.current_id, plan=s.plan) for s in states]
            restore_id = common_release([s.facts.store for s in states], release_id)
            _each(states, _stage)
        except KeyboardInterrupt as stop:
            raise interrupted(stop, f"interrupted ({signal_name(stop)}) before the switch; nothing was switched or "
                                    "restarted on any node") from None
        try:
            ready = _activate(states, release_id, {s.node.name: s.plan.release.metadata() for s in states})
        except NodeFailed as failed:
            _restore(states, release_id, failed.failure, failed.where, restore_id)
        except KeyboardInterrupt as stop:
            interrupt, diagnosis = interruption(stop)
            _restore(states, release_id, interrupt, None, restore_id, diagnosis)
        for state in states:
            state.run.record("deploy", HEALTHY, release_tags(state.node.target, state.plan.release))
    return [Outcome("deployed", release_id, s.plan.current_id, plan=s.plan, ready=ready) for s in states]


def _plan(nodes: Sequence[Node], runs: Mapping[str, _Run], options: Options, secrets: Mapping[str, str]
          ) -> list[NodeRun]:
    """Read every node and plan its own release; the group's id (from every node's own) then replaces each one's,
    and every node passes preflight before anything is switched."""
    def read(node: Node) -> tuple[NodeRun, Callable[[str | None], Plan]]:
        run, profile = runs[node.name], node.loaded.profile
        model = weights(profile, node.target.host.vars, secrets)
        venv = choose_venv(run.remote, run.layout, node.target, profile, options.dry_run, run.progress)
        run.progress.phase_started("facts")
        facts = read_host_facts(run.remote, run.layout, venv.path, profile.server.port, None,
                                profile.service.working_directory, model.fact_steps(venv.path))
        current = facts.store.release(facts.store.current) if facts.store.current else None
        hand_pid = hand_run_pid(current.metadata if current else None,
                                run.remote.run(hand_run_check(current.metadata if current else None)))
        run.previous = facts.store.current
        model_facts = model.parse(facts.model_results)
        check_model(model, model_facts, node.name)

        def plan(release_id: str | None) -> Plan:
            return plan_deploy(node.loaded, node.target, facts, secrets, options.force, datetime.now(UTC), venv, (),
                               {}, hand_pid, model, model_facts, release_id=release_id)
        return NodeRun(node, run, facts, plan(None), model, model_facts), plan

    read_nodes = _each(nodes, read)
    release_id = group_release_id([state.plan.release.id for state, _ in read_nodes])
    states = []
    for state, plan in read_nodes:
        state.plan = plan(release_id)
        preflight(state.plan, state.node.loaded, state.node.target, state.facts)
        states.append(state)
    return states


def _stage(state: NodeRun) -> None:
    """The weights and the release's files onto the node, while the old release still serves."""
    if not state.model_facts.complete:
        stage_weights(state.run, state.model, state.plan.release.venv, state.plan, state.facts)
    state.run.phase("stage", state.plan.batches.get("stage", []))


def _activate(states: Sequence[NodeRun], release_id: str, metadata: Mapping[str, Mapping[str, Any]]
              ) -> ReadyReport:
    """All nodes stopped (each one's journal position read and `current` switched), then all started; the ladder
    on node 0, then every other node's unit alive and not restarted since its start."""
    def stop(state: NodeRun) -> None:
        layout = state.run.layout
        state.run.switched_to = release_id
        results = state.run.phase("stop and switch", [journal_cursor_step(layout.unit_name),
                                                      *switch_current(layout, release_id), stop_step(layout)])
        state.run.cursor = parse_journal_cursor(results[0].stdout)

    _each(states, stop)
    started_at = states[0].run.clock()
    _each(states, lambda state: state.run.phase("start", restart_steps(state.run.layout)))
    head = states[0]
    service = head.node.loaded.profile.service
    try:
        head.run.progress.phase_started("readiness")
        report = wait_ready(head.run.remote, probe_target(head.run.layout, metadata[head.node.name],
                                                          head.run.environ),
                            deadline_s=service.startup_timeout_s, progress=head.run.progress, rung=Rung.GENERATE,
                            baseline_restarts=0, after_cursor=head.run.cursor,
                            prediction=start_prediction(head.facts.store, head.node.loaded.name),
                            grace_s=head.run.grace_s, started_at=started_at, clock=head.run.clock)
    except ReadinessFailed as failure:
        raise NodeFailed(head.where, failure) from failure
    for state in states[1:]:
        unit = ProbeTarget(unit=state.run.layout.unit_name, port=state.node.loaded.profile.server.port,
                           health_path=None, generation=None)
        try:
            wait_ready(state.run.remote, unit, deadline_s=service.startup_timeout_s, progress=state.run.progress,
                       rung=Rung.UNIT, baseline_restarts=0, after_cursor=state.run.cursor)
        except ReadinessFailed as failure:
            raise NodeFailed(state.where, failure) from failure
    for state in states:
        state.run.verified = release_id
        state.run.remote.run([reset_failed_step(state.run.layout)])
    return report


def _diagnoses(states: Sequence[NodeRun]) -> list[tuple[str, Diagnosis]]:
    return _each(states, lambda s: (s.where, s.run.journal_diagnosis(s.run.cursor, s.node.loaded.name)))


def _restore(states: Sequence[NodeRun], failed_id: str, failure: DeployError, failed_where: str | None,
             restore_id: str | None, diagnosis: Diagnosis | None = None) -> NoReturn:
    """Every node back to `restore_id` (the previous common release) by the same coordinated restart; the error
    names the node whose failure explains the others' (`failed_where`: the node whose check failed)."""
    if diagnosis is None:
        where, diagnosis = blamed(_diagnoses(states), failed_where or states[0].where)
        first = f"{where}: {failure_line(failure, diagnosis)}"
    else:
        first = f"every node: {diagnosis.cause}"
    for state in states:
        state.run.record("deploy", FAILED, release_tags(state.node.target, state.plan.release), first)
    previous = states[0].plan.current_id
    if restore_id is None:
        _each(states, lambda s: s.run.remote.run([stop_step(s.run.layout)]))
        raise _same_kind(failure, f"release {failed_id} failed on {first}; the nodes have no common earlier healthy "
                                  "release, so every node's unit is stopped", diagnosis).about(failed_id, previous, {})
    metadata = {s.node.name: dict(record.metadata) if (record := s.facts.store.release(restore_id)) else {}
                for s in states}
    for state in states:
        state.run.progress.note(f"rolling every node back to release {restore_id}")
    try:
        _activate(states, restore_id, metadata)
    except NodeFailed as failed_again:
        second = failed_again.failure
        again_where, again = blamed(_diagnoses(states), failed_again.where)
        _each(states, lambda s: s.run.remote.run([stop_step(s.run.layout)]))
        for state in states:
            state.run.record("rollback", FAILED, recorded_tags(state.node.target, restore_id,
                                                               metadata[state.node.name]), failure_line(second, again))
        raise RollbackFailed(f"release {failed_id} failed on {first}, and the rollback of every node to {restore_id} "
                             f"failed on {again_where}: {failure_line(second, again)}; every node's unit is stopped",
                             original=failure).about(failed_id, previous, {}) from None
    except KeyboardInterrupt as again:
        raise interrupted(again, f"interrupted again ({signal_name(again)}) while every node was rolled back to "
                                 f"{restore_id}, before it was verified",
                          hint="`invoke status --group G` shows each node; deploy the group again to verify it"
                          ) from None
    for state in states:
        state.run.record("rollback", HEALTHY, recorded_tags(state.node.target, restore_id, metadata[state.node.name]),
                         f"after {failed_id} failed on {first}")
    ended = _same_kind(failure, f"release {failed_id} failed on {first}; rolled back, release {restore_id} is "
                                "serving on every node", diagnosis)
    ended.about(failed_id, previous, {})
    ended.serving_id = restore_id
    raise ended


def deploy_group(nodes: Sequence[Node], remotes: Mapping[str, Remote], progress_of: Callable[[str], Progress],
                 options: Options) -> FleetRun[Outcome]:
    """deploy_nodes as a group deploy's result: every node deployed, or every node with the group's one error."""
    names = tuple(node.name for node in nodes)
    try:
        outcomes = deploy_nodes(nodes, remotes, progress_of, options)
    except DeployError as error:
        return FleetRun(tuple(HostRun(name, error=error) for name in names), (names,))
    return FleetRun(tuple(HostRun(name, result=outcome) for name, outcome in zip(names, outcomes, strict=True)),
                    (names,))


__all__ = ["blamed", "common_release", "deploy_group", "deploy_nodes"]
