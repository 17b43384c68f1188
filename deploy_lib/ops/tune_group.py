"""`tune --group G`: one sweep over the replicas of a group at once. The candidates are dealt round-robin over the
hosts (inventory order); each host runs its share as the one-host loop does (each candidate a release, recorded in
its own history under the sweep's one id) while hosts without a share serve on. The base's runs are split over the
hosts at once (two hosts: once each), and the table is the hosts' histories read together: the base's runs on
every host give the noise, so a host-to-host difference is not taken for an improvement. The group decides once, at
the end: a winner beyond the noise is rolled out to every host with the rolling deploy (one host at a time,
stopping at the first failure; the host that measured it is unchanged); otherwise each host's pre-sweep release
serves again, on every host at once. No host switches twice at the end. Behind SGLang's router a replica is taken
out for its whole share (its benchmarks measure the candidate alone) and added back once it serves a verified
release. A multi-node profile's group is one server, tuned as one unit: each candidate a release on every node at
once, benchmarked on node 0."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from deploy_lib.commands.deploy import Options, Outcome, SweepCandidate
from deploy_lib.commands.deploy import rollback as switch_to
from deploy_lib.commands.tune import tune
from deploy_lib.commands.tune_candidate import Unit, deploy_candidate
from deploy_lib.commands.tune_request import Planned, Request, unit_of
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, Interrupted
from deploy_lib.host.store import read_store_facts
from deploy_lib.interrupts import Interrupt, interrupted, signals_noted
from deploy_lib.ops.fleet import FleetRun, Rollout, Size, host_run, run_hosts
from deploy_lib.ops.fleet import in_parallel as at_once
from deploy_lib.ops.multinode import is_multi_node, plan_nodes
from deploy_lib.ops.multinode_deploy import deploy_nodes, rollback_nodes
from deploy_lib.ops.router_deploy import behind_router
from deploy_lib.ops.scope import Reach, Scope, behind, router_in_front
from deploy_lib.outcomes import Action
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote
from deploy_lib.store import HistoryEntry, Tags, append_history
from deploy_lib.tune import decide
from deploy_lib.tune.record import END, TuneReport, read_tune, tune_id, tune_ids, tune_line
from deploy_lib.tune.spec import Keep
from deploy_lib.tune.sweep import Candidate, build_sweep, check_values

ROLLOUT = Rollout((Size(1),), Size(0))  # the winner one host at a time; the first failure stops it


@dataclass(frozen=True)
class GroupTune:
    report: TuneReport                         # every host's candidates in one table, with the group's decision
    shares: Mapping[str, tuple[str, ...]]      # host -> the candidates it ran
    # each host's own part of the sweep (its table or its error); the winner's rolling deploy, None when no winner
    # was kept. Not in --json as they are: `failed` and `rolled_out` say what they hold
    parts: FleetRun[TuneReport] = field(repr=False)
    rollout: FleetRun[Outcome] | None = field(default=None, repr=False)
    serving: Mapping[str, str] | None = None   # host -> the release serving at the end

    @property
    def exit_code(self) -> int:
        return max(self.parts.exit_code, self.rollout.exit_code if self.rollout else 0)

    @property
    def failed(self) -> dict[str, str]:
        """Host -> why its part of the sweep failed."""
        return {run.host: run.error.message for run in self.parts.runs if run.error is not None}

    @property
    def rolled_out(self) -> dict[str, str]:
        """Host -> what the winner's rollout did there (deployed, unchanged, failed: why, not started)."""
        if self.rollout is None:
            return {}
        return {run.host: run.result.action if run.result is not None else
                f"{Action.failed}: {run.error.message}" if run.error is not None else Action.not_started
                for run in self.rollout.runs}


def deal(labels: Sequence[str], hosts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Candidates round-robin over the hosts: the first to the first host, the second to the second..."""
    return {host: tuple(labels[index::len(hosts)]) for index, host in enumerate(hosts)}


def _shares(scope: Scope, loaded: LoadedProfile, request: Request) -> dict[str, tuple[str, ...]]:
    if request.spec is None:  # a resume: each host reads its share from its own history
        return {name: () for name in scope.names}
    check_values(loaded, request.spec, request.sources, request.patch_sets)
    sweep = build_sweep(loaded, request.spec, request.sources, request.patch_sets, None)
    return deal([c.label for c in sweep.candidates], scope.names)


def tune_group(scope: Scope, loaded: LoadedProfile, request: Request, reach: Reach
               ) -> GroupTune | TuneReport | Planned:
    """The sweep of `request` over the group's hosts; a multi-node profile's group as one server (one table)."""
    if is_multi_node(loaded):
        return _tune_nodes(scope, loaded, request, reach)
    if request.dry_run:
        raise ConfigError("--dry-run with --group: run it with --host on one of the group's hosts (each runs the "
                          "same kind of candidates)")
    shares = _shares(scope, loaded, request)
    sweep_id = request.resume or tune_id(datetime.now(UTC), secrets.token_hex(2))
    service = loaded.profile.service.name
    working = [t for t in scope.targets
               if shares[t.host.name] or (request.resume and _ran(t, service, sweep_id, reach))]
    if not working:
        raise ConfigError(f"no candidate of the sweep can run on group {scope.group}: the profile refuses every "
                          "combination", "`invoke tune --host H --dry-run` lists each one and why")
    histories: dict[str, list[HistoryEntry]] = {}
    front = router_in_front(scope, reach)

    def part(target: Target) -> TuneReport:
        name = target.host.name
        with reach.connect(target, True) as remote:
            share = None if request.resume else shares[name]

            def sweep(drain: Callable[[], None] | None) -> TuneReport | Planned:
                if drain is not None:  # out of the router for its whole share: each benchmark measures one candidate
                    drain()
                return tune(loaded, target, remote, reach.progress(name),
                            replace(request, tune_id=sweep_id, share=share, stop=lambda: bool(noted),
                                    sharing=len(working)))
            report = behind_router(front, target, service, remote, reach.progress(name), sweep)
            histories[name] = list(read_store_facts(remote, target.layout(service)).history)
        assert isinstance(report, TuneReport)
        return report

    with signals_noted(lambda signum: reach.progress("").note(
            "signal: no host starts a further candidate; each finishes the one it runs")) as noted:
        futures = at_once(working, part, "tune")
        runs = tuple(host_run(t.host.name, f) for t, f in zip(working, futures, strict=True))
        parts = FleetRun(runs, (tuple(t.host.name for t in working),))
        if noted or parts.failed:  # no decision: each host that ended its share serves its best so far
            _serve(scope, loaded, request, reach, {host: report.best_release() or report.original
                                                    for host, report in _results(parts)})
    message = f"tune {sweep_id} interrupted on group {scope.group}: each host serves its best so far"
    hint = f"`invoke tune --group {scope.group} --resume {sweep_id}` runs the candidates not finished"
    if noted:  # SIGINT 130, SIGTERM 143, as a group deploy
        raise interrupted(Interrupt(noted[0]), message, hint)
    cut = next((run.error for run in runs if isinstance(run.error, Interrupted)), None)
    if cut is not None:
        raise type(cut)(message, hint)
    if not histories:  # no host got as far as its sweep: the first one's error is the group's
        raise next(run.error for run in runs if run.error is not None)
    merged = read_tune([e for name in histories for e in histories[name]], sweep_id)
    if parts.failed:
        why = f"group {scope.group}: {', '.join(parts.failed)} failed, so no winner is rolled out; each host serves " \
              "its own best so far"
        return GroupTune(replace(merged, finished=False, reason=why),
                         {t.host.name: shares[t.host.name] for t in working}, parts)
    return _finish(scope, loaded, request, reach, merged, parts, {h: r.share for h, r in _results(parts)})


def _tune_nodes(scope: Scope, loaded: LoadedProfile, request: Request, reach: Reach) -> TuneReport | Planned:
    """A multi-node server tuned as one unit: each candidate a release on every node at once (the group deploy's
    coordinated switch), benchmarked on node 0 and recorded in its history; between candidates and at the end
    the whole group switches together (the group rollback's path)."""
    nodes = plan_nodes(loaded, scope.targets, str(scope.group))  # the group fits the profile, or ConfigError
    service = loaded.profile.service.name
    with ExitStack() as connections:
        remotes = {t.host.name: connections.enter_context(reach.connect(t, True)) for t in scope.targets}

        def deploy(candidate: Candidate, options: Options, sweep: SweepCandidate) -> Outcome:
            return deploy_nodes(plan_nodes(candidate.loaded, scope.targets, str(scope.group)), remotes,
                                reach.progress, options, sweep)[0]

        def switch(release_id: str) -> None:
            rollback_nodes(list(scope.targets), remotes, reach.progress, service, release_id, request.environ,
                           request.grace_s)
        head = nodes[0].target
        return tune(loaded, head, remotes[head.host.name], reach.progress(head.host.name), request,
                    unit=Unit(deploy, switch))


def _ran(target: Target, service: str, sweep_id: str, reach: Reach) -> bool:
    """Whether the host ran a share of the sweep (a resume leaves the others serving)."""
    with reach.connect(target, True) as remote:
        return sweep_id in tune_ids(read_store_facts(remote, target.layout(service)).history)


def _results(parts: FleetRun[TuneReport]) -> list[tuple[str, TuneReport]]:
    return [(run.host, run.result) for run in parts.runs if run.result is not None]


def _finish(scope: Scope, loaded: LoadedProfile, request: Request, reach: Reach, merged: TuneReport,
            parts: FleetRun[TuneReport], shares: Mapping[str, tuple[str, ...]]) -> GroupTune:
    """The group's decision over every host's candidates; the winner rolled out, or each host's original back."""
    spec = merged.spec
    base = merged.base.values if merged.base else ()
    decision = decide.decide(max(base) if base else None, [row.standing() for row in merged.rows],
                             decide.noise(base), spec.keep is Keep.winner, unit_of(spec), rerun=False)
    originals = {host: report.original for host, report in _results(parts)}
    rollout = None
    if decision.keep and decision.winner is not None:
        by_label = {c.label: c for c in build_sweep(loaded, spec, {k: f"sweep {merged.tune_id}" for k in spec.vary},
                                                     request.patch_sets, None).candidates}
        winner = by_label[decision.winner.label]

        def roll_out(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None
                     ) -> Outcome:
            # skip_gate: the sweep measured the winner with its own benchmark (the gate's would only repeat it)
            return deploy_candidate(winner, target, remote, progress, Options(
                environ=request.environ, grace_s=request.grace_s, skip_gate=True), before_restart=drain)
        act = behind(router_in_front(scope, reach), loaded.profile.service.name, roll_out)

        def on_host(target: Target) -> Outcome:
            with reach.connect(target, True) as remote:
                return act(target, remote, reach.progress(target.host.name))
        rollout = run_hosts(scope.targets, on_host, reach.progress(""), ROLLOUT)
    else:
        _serve(scope, loaded, request, reach, originals)
    serving = _record_end(scope, loaded, reach, merged.tune_id, decision, set(originals))
    report = replace(merged, finished=True, winner=decision.winner.label if decision.winner else None,
                     serving=None, reason=f"group {scope.group}: {decision.reason}")
    return GroupTune(report, shares, parts, rollout, serving)


def _serve(scope: Scope, loaded: LoadedProfile, request: Request, reach: Reach, wanted: Mapping[str, str]) -> None:
    """Each host of `wanted` switched to its release there, at once (behind the router: out around its restart), when
    it serves another."""
    service = loaded.profile.service.name

    def switch(target: Target, remote: Remote, progress: Progress, drain: Callable[[], None] | None) -> None:
        if read_store_facts(remote, target.layout(service)).current != wanted[target.host.name]:
            progress.phase_started(f"tune: switch to release {wanted[target.host.name]}")  # as the one-host loop's
            switch_to(target, service, remote, progress, wanted[target.host.name], request.environ,
                      grace_s=request.grace_s, before_restart=drain)
    act = behind(router_in_front(scope, reach), service, switch)

    def on_host(target: Target) -> None:
        with reach.connect(target, True) as remote:
            act(target, remote, reach.progress(target.host.name))
    hosts = [t for t in scope.targets if t.host.name in wanted]
    for future in at_once(hosts, on_host, "restore") if hosts else ():
        future.result()


def _record_end(scope: Scope, loaded: LoadedProfile, reach: Reach, sweep_id: str, decision: decide.Decision,
                ran: set[str]) -> dict[str, str]:
    """The group's decision as the last line of the sweep in the history of each host that `ran` a part; what each
    host serves."""
    service = loaded.profile.service.name

    def record(target: Target) -> str:
        with reach.connect(target, True) as remote:
            facts = read_store_facts(remote, target.layout(service))
            current = facts.release(facts.current) if facts.current else None
            if current is None:
                return "none"
            if target.host.name not in ran:
                return current.id
            remote.run(append_history(target.layout(service), tune_line(
                sweep_id, END, Tags.from_dict(current.metadata["tags"]), datetime.now(UTC),
                cause=f"group {scope.group}: {decision.reason}",
                label=decision.winner.label if decision.winner else "")))
            return current.id
    futures = at_once(list(scope.targets), record, "record")
    return {t.host.name: f.result() for t, f in zip(scope.targets, futures, strict=True)}
