"""The coordinated switch of a multi-node release: all nodes stopped (each one's journal position read and `current`
switched), then all started; the readiness ladder on node 0, which serves HTTP, and the unit alive on every other
node. A failure takes every node back to their previous common release the same way, and names the node whose own
failure explains the others'. Used by the multi-node deploy and rollback (multinode_deploy.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from deploy_lib.deploy.plan import (
    reset_failed_step,
    restart_steps,
    start_prediction,
    stop_bound_s,
    stop_step,
    store_stop_bound_s,
)
from deploy_lib.errors import DeployError, ReadinessFailed, RollbackFailed
from deploy_lib.facts.diagnose import Diagnosis, journal_cursor_step, parse_journal_cursor
from deploy_lib.health import ProbeTarget, Rung
from deploy_lib.health.downtime import Downtime
from deploy_lib.host.readiness import ReadyReport, wait_ready
from deploy_lib.host.switch import Transition, failure_line, probe_target, same_kind
from deploy_lib.interrupts import Interrupt, interrupted, signal_name, signals_noted
from deploy_lib.ops.fleet import in_parallel
from deploy_lib.profile import read_stored_profile
from deploy_lib.store import FAILED, HEALTHY, StoreFacts, Tags, switch_current

T = TypeVar("T")
Metadata = Mapping[str, Mapping[str, Any]]  # node name -> the release.json of the release it switches to
# causes that are the symptom of another node's failure: a node with any other cause is the one to name
_SYMPTOMS = frozenset({"nccl_timeout", "rendezvous", "unknown"})


@dataclass
class Member:
    """One node of a multi-node release during a command: its per-host run (connection, progress, history) and
    what its store held when the command read it."""

    name: str
    rank: int
    run: Transition
    store: StoreFacts

    @property
    def where(self) -> str:
        return f"{self.name} (node rank {self.rank})"


class NodeFailed(Exception):
    """A node's check failed during a coordinated start: which node, and what its ladder saw."""

    def __init__(self, where: str, failure: ReadinessFailed) -> None:
        super().__init__(where)
        self.where = where
        self.failure = failure


def common_release(stores: Sequence[StoreFacts], exclude: str | None) -> str | None:
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


def each(items: Sequence[T], act: Callable[[T], Any]) -> list[Any]:
    """`act` on every node at once (one thread and connection each); the first error is raised once all ended. A
    signal meanwhile is noted and raised (as KeyboardInterrupt) only once every node's round trip has ended, so what
    follows (the switch back) never shares a connection with a step still running."""
    with signals_noted() as noted:
        futures = in_parallel(items, act, "node")
    if noted:
        raise Interrupt(noted[0])
    for future in futures:
        if (error := future.exception()) is not None:
            raise error
    return [future.result() for future in futures]


def _stop_bound(member: Member, metadata: Metadata) -> int:
    """The node's stop bound: the TimeoutStopSec= of its current release and of the one it switches to."""
    current = member.store.release(member.store.current or "")
    return stop_bound_s(metadata.get(member.name), current.metadata if current else None)


def activate(members: Sequence[Member], release_id: str, metadata: Metadata) -> ReadyReport:
    """Every node stopped and switched to `release_id`, then every node started; the ladder on node 0 (the first
    member), then every other node's unit active and not restarted since its start. NodeFailed names the node."""
    def stop(member: Member) -> None:
        layout, run = member.run.layout, member.run
        run.switched_to = release_id
        results = run.phase("stop and switch", [journal_cursor_step(layout.unit_name),
                                                *switch_current(layout, release_id),
                                                stop_step(layout, _stop_bound(member, metadata))])
        run.cursor = parse_journal_cursor(results[0].stdout)
        if run.serving_before and run.stopped_at is None:  # kept through a restore: the downtime goes on
            run.stopped_at = run.clock() - results[-1].duration_s  # the stop is the round trip's last step

    each(members, stop)
    head = members[0]
    started_at = head.run.clock()
    each(members, lambda member: member.run.phase("start", restart_steps(member.run.layout,
                                                                          _stop_bound(member, metadata))))
    deadline_s = read_stored_profile(metadata[head.name].get("profile")).service.startup_timeout_s
    try:
        head.run.progress.phase_started("readiness")
        report = wait_ready(head.run.remote, probe_target(head.run.layout, metadata[head.name], head.run.environ),
                            deadline_s=deadline_s, progress=head.run.progress, rung=Rung.GENERATE,
                            baseline_restarts=0, after_cursor=head.run.cursor,
                            prediction=start_prediction(head.store, str(metadata[head.name].get("profile_name"))),
                            grace_s=head.run.grace_s, started_at=started_at, clock=head.run.clock)
    except ReadinessFailed as failure:
        raise NodeFailed(head.where, failure) from failure
    for member in members[1:]:
        port = read_stored_profile(metadata[member.name].get("profile")).server.port
        unit = ProbeTarget(unit=member.run.layout.unit_name, port=port, health_path=None, generation=None)
        try:
            wait_ready(member.run.remote, unit, deadline_s=deadline_s, progress=member.run.progress, rung=Rung.UNIT,
                       baseline_restarts=0, after_cursor=member.run.cursor)
        except ReadinessFailed as failure:
            raise NodeFailed(member.where, failure) from failure
    downtime = _group_downtime(members, report, started_at)
    for member in members:
        member.run.verified = release_id
        member.run.downtime = downtime
        member.run.timings |= downtime.timings_with_phases() if downtime else {}
        member.run.remote.run([reset_failed_step(member.run.layout)])
    return report


def _group_downtime(members: Sequence[Member], report: ReadyReport, started_at: float) -> Downtime | None:
    """The release's downtime is the group's: from the first node's stop to node 0 answering a generation (the
    server's part from node 0's log lines); None when no node served before. The nodes' runs share one clock."""
    stops = [member.run.stopped_at for member in members if member.run.stopped_at is not None]
    return report.downtime(min(stops), started_at) if stops else None


def _diagnoses(members: Sequence[Member], profile: str) -> list[tuple[str, Diagnosis]]:
    return each(members, lambda m: (m.where, m.run.journal_diagnosis(m.run.cursor, profile)))


def restore(members: Sequence[Member], event: str, failed_id: str, failed_tags: Mapping[str, Tags],
            failure: DeployError, failed_where: str | None, restore_id: str | None, previous_id: str | None,
            diagnosis: Diagnosis | None = None) -> NoReturn:
    """After `failed_id` failed on `failed_where` (or a signal came: `diagnosis` given), every node back to
    `restore_id` by the same coordinated switch; raise what the user must know, naming the node to look at."""
    profile = failed_tags[members[0].name].profile
    if diagnosis is None:
        where, diagnosis = blamed(_diagnoses(members, profile), failed_where or members[0].where)
        first = f"{where}: {failure_line(failure, diagnosis)}"
    else:
        first = f"every node: {diagnosis.cause}"
    for member in members:
        member.run.record(event, FAILED, failed_tags[member.name], first)
    if restore_id is None:
        each(members, lambda m: m.run.remote.run([stop_step(m.run.layout, store_stop_bound_s(m.store))]))
        raise same_kind(failure, f"release {failed_id} failed on {first}; the nodes have no common earlier healthy "
                                  "release, so every node's unit is stopped", diagnosis
                         ).about(failed_id, previous_id, {})
    metadata = {m.name: dict(record.metadata) if (record := m.store.release(restore_id)) else {} for m in members}
    tags = {m.name: Tags.from_dict(metadata[m.name]["tags"]) if "tags" in metadata[m.name] else failed_tags[m.name]
            for m in members}
    for member in members:
        member.run.progress.note(f"rolling every node back to release {restore_id}")
    try:
        activate(members, restore_id, metadata)
    except NodeFailed as failed_again:
        again_where, again = blamed(_diagnoses(members, tags[members[0].name].profile), failed_again.where)
        each(members, lambda m: m.run.remote.run([stop_step(m.run.layout, store_stop_bound_s(m.store))]))
        cause = failure_line(failed_again.failure, again)
        for member in members:
            member.run.record("rollback", FAILED, tags[member.name], cause)
        raise RollbackFailed(f"release {failed_id} failed on {first}, and the rollback of every node to {restore_id} "
                             f"failed on {again_where}: {cause}; every node's unit is stopped",
                             original=failure).about(failed_id, previous_id, {}) from None
    except KeyboardInterrupt as again:
        raise interrupted(again, f"interrupted again ({signal_name(again)}) while every node was switched back to "
                                 f"{restore_id}, before it was verified",
                          hint="`invoke status --group G` shows each node; deploy the group again to verify it"
                          ) from None
    for member in members:
        member.run.record("rollback", HEALTHY, tags[member.name], f"after {failed_id} failed on {first}")
    ended = same_kind(failure, f"release {failed_id} failed on {first}; rolled back, release {restore_id} is "
                                "serving on every node", diagnosis)
    ended.about(failed_id, previous_id, {})
    ended.serving_id = restore_id
    raise ended


__all__ = ["Member", "Metadata", "NodeFailed", "activate", "blamed", "common_release", "each", "restore"]
