"""The commands: deploy (plan -> preflight -> stage -> switch -> restart -> verify -> commit and prune, or roll
back), rollback, start and stop of one host, each under the host's lock."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from deploy_lib.deploy.plan import (
    BatchKind,
    Plan,
    VenvChoice,
    hand_run_check,
    hand_run_pid,
    plan_deploy,
    recorded_switch,
    release_tags,
    start_prediction,
    stop_bound_s,
    stop_hand_run,
)
from deploy_lib.deploy.preflight import PreflightReads, current_record, preflight, refuse_one_node, rollback_record
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConnectionLost, GateFailed, GpuCheckFailed, ReadinessFailed, RemoteError, WatchFailed
from deploy_lib.facts.cuda_toolkit import cuda_home
from deploy_lib.facts.diagnose import diagnose
from deploy_lib.facts.host import FactRequest, HostFacts, fact_batch, parse_host_facts
from deploy_lib.health import Ready
from deploy_lib.health.downtime import Downtime
from deploy_lib.host.facts import read_host_facts, record_new_crashes
from deploy_lib.host.page_cache import read_residency, warm_weights
from deploy_lib.host.prune import around_the_restart, prune_after_deploy, prune_read_steps
from deploy_lib.host.readiness import ReadyReport
from deploy_lib.host.restore import restore
from deploy_lib.host.store import LockOnFirstChange, host_lock, lock_on_first_change, read_store_facts
from deploy_lib.host.switch import (
    GRACE_S,
    Transition,
    failure_line,
    gate_diagnosis,
    interruption,
    live_probe,
    probe_target,
    recorded_tags,
    stop_unit,
)
from deploy_lib.host.watch import watch_after_ready, watch_diagnosis, window_before_switch
from deploy_lib.interrupts import signals_raise
from deploy_lib.metrics.recorded import watch_figures
from deploy_lib.metrics.router_counters import ClientsSaw
from deploy_lib.models import HubModel, ModelFacts, PushedModel, Weights, check_model, size_text, weights
from deploy_lib.models.page_cache import (
    Residency,
    Warm,
    decide,
    measure_step,
    measure_weights_step,
    parse_residency,
    plan_lines,
    weights_root,
)
from deploy_lib.outcomes import Action
from deploy_lib.profile import LoadedProfile, Profile, read_stored_profile
from deploy_lib.profile.settings import GateSettings
from deploy_lib.progress import NullProgress, Progress
from deploy_lib.release.model import available_secrets, resolve_secrets
from deploy_lib.release.server_args import API_KEY_ENV, launch_environment
from deploy_lib.remote import Remote, concurrently
from deploy_lib.remote.readings import read as read_facts
from deploy_lib.store import FAILED, HEALTHY, STOPPED, LockContext, ReleaseRecord, StoreLayout, Tags
from deploy_lib.versions import READY_ENDPOINT_SINCE


@dataclass(frozen=True)
class Outcome:
    """The end of a deploy or rollback that did not raise."""

    action: Action
    release_id: str | None            # None: a plan whose release id depends on secrets not available here
    previous_id: str | None
    plan: Plan | None = None
    ready: ReadyReport | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    downtime: Downtime | None = None  # None: nothing was restarted, or no server ran before
    clients: ClientsSaw | None = None  # behind a router: what its clients saw while the replica was out and back


@dataclass(frozen=True)
class Options:
    """A deploy as its user asks for it (the `deploy` task's flags), whoever the caller."""

    dry_run: bool = False
    force: bool = False
    grace_s: float = GRACE_S
    environ: Mapping[str, str] = field(default_factory=dict)
    gate: bool = False                  # run the throughput gate even when the profile has no `gate:`
    skip_gate: bool = False             # no gate even when the profile has one: a sweep measures its releases itself
    pre_read: bool = True               # read the new weights into the page cache before the stop (--no-pre-read)


@dataclass(frozen=True)
class PatchedVenv:
    """A patch set's deploy: the venv it decided (patched, or the one it was derived from) instead of the
    profile's."""

    venv: VenvChoice
    patches: tuple[str, ...] = ()       # patch sets applied in that venv, recorded in the release


@dataclass(frozen=True)
class SweepCandidate:
    """A tuning sweep's candidate: it changes the host (so preflight's facts go in the decision's read), and the
    prune keeps the sweep's releases (so its best one stays on the host)."""

    keep_releases_at_least: int


def releases_to_keep(profile: Profile, sweep: SweepCandidate | None) -> int:
    """How many releases a deploy's prune keeps: the profile's, and a sweep's at least."""
    return max(profile.service.keep_releases, sweep.keep_releases_at_least if sweep else 0)


def choose_venv(remote: Remote, layout: StoreLayout, target: Target, profile: Profile, dry_run: bool,
                progress: Progress) -> VenvChoice:
    """Build (or reuse) the profile's locked venv; it is immutable, so building it changes nothing that runs."""
    spec = profile.service.venv_build
    if spec is None:
        return VenvChoice(target.venv_of(profile))
    # the venv builder loads only for a profile that builds its venv (a no-op of the others never runs it)
    from deploy_lib.host.venv_build import ensure_venv, plan_build
    from deploy_lib.host.venv_store import read_facts as read_venv_facts
    from deploy_lib.venvs import cache_dir_steps, cache_environment, load_lock

    lock = load_lock(spec.lock)
    if dry_run:
        plan = plan_build(spec, lock, layout, read_venv_facts(remote, layout, spec.python), datetime.now(UTC))
        note = None if plan.reuse else (f"would build venv {plan.hash} ({len(plan.transfers)} wheels, "
                                        f"{plan.bytes_to_send} bytes to send)")
        return VenvChoice(str(plan.path), cache_environment(layout, plan.hash), note,
                          lock.distributions().get("sglang"))
    built = ensure_venv(remote, layout, spec, progress=progress, lock=lock)
    for warning in built.warnings:
        progress.note(warning)
    remote.run(cache_dir_steps(layout, built.hash, profile.service.user))
    return VenvChoice(str(built.path), cache_environment(layout, built.hash))


def deploy(loaded: LoadedProfile, target: Target, remote: Remote, progress: Progress, options: Options,
           clock: Callable[[], float] = time.monotonic, before_restart: Callable[[], None] | None = None,
           alone: bool = True, patched: PatchedVenv | None = None, sweep: SweepCandidate | None = None) -> Outcome:
    """Take the host to the profile's release, or back to its last healthy one; raise DeployError on failure.
    `before_restart` runs before the server stops (a router takes the replica out); `alone`: one host on its own,
    not one of a group deploying together; `patched`: a patch set's venv; `sweep`: a tuning sweep's candidate.

    Everything but a dry run decides from one read of the host that carries the lock's state (held by another run:
    LockHeld) and, when the release serves already, the live probe, and leaves out what only preflight reads: a
    no-op is that one round trip and writes nothing. A change then reads that (GPUs, listeners, disk, ...) in one
    more read-only round trip, for preflight, takes the lock in its first change, only if the store is still as read
    (compare-and-set, `lock_on_first_change`), and releases it in the last, so the switch and the prune see the
    store the decision saw; a venv build (`service.venv_build`) changes the host before that read and takes the lock
    first. SIGINT and SIGTERM after the switch finish the transition (back to the last healthy release) and end the
    command with Interrupted/Terminated."""
    profile = loaded.profile
    run = Transition(remote, target.layout(profile.service.name), target, progress, options.environ, clock,
                     grace_s=options.grace_s, before_restart=before_restart)
    with signals_raise():
        try:
            if options.dry_run:  # a plan needs no secret value: it says which ones it could not read
                return _deploy(run, _Ask(loaded, options, *available_secrets(profile, options.environ), patched,
                                         sweep, alone))
            ask = _Ask(loaded, options, resolve_secrets(profile, options.environ, str(loaded.path)), {}, patched,
                       sweep, alone)
            purpose, where = f"deploy {loaded.name}", target.host.name
            context = LockContext(where=where, note=progress.note)  # a dead owner's lock: taken over, one line
            with ExitStack() as held:
                if profile.service.venv_build is not None and patched is None:
                    # building the venv changes the host before the facts are read: the lock from the first step
                    held.enter_context(host_lock(remote, run.layout, purpose, where, context))
                run.lock = held.enter_context(lock_on_first_change(remote, run.layout, purpose, where, context))
                run.remote = run.lock
                return _deploy(run, ask)
        except KeyboardInterrupt as stop:
            raise run.interrupted_outside(stop) from None
        except ConnectionLost as lost:
            raise run.connection_lost(lost, f"deploy --profile {loaded.name}") from None


@dataclass(frozen=True)
class _Ask:
    """One deploy as its phases read it: the profile, its caller's options, the secrets."""

    loaded: LoadedProfile
    options: Options
    secrets: Mapping[str, str]
    not_available: Mapping[str, str]  # a dry run's secrets it could not read: name -> why
    patched: PatchedVenv | None
    sweep: SweepCandidate | None
    alone: bool

    @property
    def preflight_now(self) -> bool:
        """Preflight's facts go in the decision's read: a dry run shows them, a sweep's candidate changes the host."""
        return self.options.dry_run or self.sweep is not None


@dataclass(frozen=True)
class _Decided:
    """The plan and what it was made from."""

    plan: Plan
    facts: HostFacts
    request: FactRequest
    venv: VenvChoice
    model: Weights
    model_facts: ModelFacts
    replan: Callable[[HostFacts, int | None], Plan]  # the plan again, from completed facts and a hand-run pid
    residency: Mapping[str, Residency | str] = field(default_factory=dict)  # weights' root -> page cache reading


def _deploy(run: Transition, ask: _Ask) -> Outcome:
    """The venv, the decision's read and its plan, preflight when it changes the host; then the stage, the switch
    and its verification (a failure rolls back), and the commit."""
    venv = ask.patched.venv if ask.patched else choose_venv(run.remote, run.layout, run.target, ask.loaded.profile,
                                                            ask.options.dry_run, run.progress)
    run.progress.phase_started("facts")
    started = run.clock()
    decided = _decide(run, ask, venv)
    if ask.options.dry_run or not decided.plan.unchanged:
        decided = _preflight(run, ask, decided)
    run.timings["facts"] = round(run.clock() - started, 3)
    plan = decided.plan
    if ask.options.dry_run:  # its notes are printed with the plan
        plan = replace(plan, notes=(*plan.notes, *page_cache_plan(plan, decided.facts, decided.model_facts,
                                                                  decided.residency)))
        return Outcome(Action.planned, plan.release_id, plan.current_id, plan=plan, timings=run.timings)
    for note in plan.notes:
        run.progress.note(note)
    if plan.unchanged:
        return Outcome(Action.unchanged, plan.release.id, plan.current_id, plan=plan, timings=run.timings)
    tags = release_tags(run.target, plan.release)
    ready = _switch(run, ask, decided, tags)
    _commit(run, ask, tags)
    return Outcome(Action.deployed, plan.release.id, plan.current_id, plan=plan, ready=ready, timings=run.timings,
                   downtime=run.downtime)


def _decide(run: Transition, ask: _Ask, venv: VenvChoice) -> _Decided:
    """The one read the decision needs (the facts, the lock's state, the live probe of a release that may serve
    already) and the plan made from it; a release current but not ready is restarted."""
    profile = ask.loaded.profile
    model = weights(profile, run.target.host.vars, ask.secrets)
    # the toolkit decides only whether FlashInfer can JIT-build the fusion's kernels (deploy_lib/facts/cuda_toolkit.py)
    toolkit_home = cuda_home(launch_environment(profile)) if profile.features.allreduce_fusion else None
    request = FactRequest(run.layout, venv.path, profile.server.port, toolkit_home,
                          profile.service.working_directory, tuple(model.fact_steps(venv.path)),
                          write_caches=not ask.options.dry_run, preflight=ask.preflight_now)
    # the live probe for a release that may serve already; the version only picks its health path, taken as one
    # with /ready (live_verdict sends it again when the plan's release says otherwise)
    speculative = {"profile": profile.model_dump(mode="json"),
                   "sglang_version": venv.sglang_version or READY_ENDPOINT_SINCE}
    # a plan or a sweep's candidate reads preflight's facts here: the new weights' page cache rides with them
    measure = [measure_weights_step(model)] if ask.preflight_now else []
    read = read_facts(run.remote, [*fact_batch(request), *measure,
                                   *concurrently([live_probe(run.layout, speculative, ask.options.environ)])])
    facts = parse_host_facts(read, request)
    if run.lock is not None:
        run.lock.decided_from(facts.store.lock, facts.store.digest)
    run.previous = facts.store.current
    run.serving_before = facts.unit.active_state == "active"
    if ask.alone and not ask.options.dry_run:  # one node taken elsewhere leaves the others at the rendezvous
        refuse_one_node(facts.store, (facts.store.current,), run.where, "deployed to",
                        "`invoke deploy --profile P --group G` deploys the group of its nodes together")
    model_facts = model.parse(facts.model_results)
    check_model(model, model_facts, run.where)

    def replan(found: HostFacts, hand_pid: int | None = None) -> Plan:
        return plan_deploy(ask.loaded, run.target, found, ask.secrets, ask.options.force, datetime.now(UTC), venv,
                           ask.patched.patches if ask.patched else (), ask.not_available, hand_pid, model,
                           model_facts)
    plan = replan(facts)
    if plan.unchanged and not isinstance(verdict := run.live_verdict(plan.release.metadata(), read), Ready):
        plan = replace(plan, unchanged=False, notes=(*plan.notes, f"release {plan.release.id} is current but not "
                                                     f"ready ({verdict.message}): it is restarted and verified"))
    return _Decided(plan, facts, request, venv, model, model_facts, replan,
                    _speculated(plan, [parse_residency(read[step.name]) for step in measure]))


def _speculated(plan: Plan, measured: list[Residency | str]) -> dict[str, Residency | str]:
    """The decision read's page cache reading by the root it measured; one that failed (it says why) stands for the
    plan's weights, so that nothing measures them again."""
    planned = weights_root(plan.release.model)
    found: dict[str, Residency | str] = {}
    for item in measured:
        if isinstance(item, Residency) and item.root:
            found[item.root] = item
        elif isinstance(item, str) and planned:
            found[planned] = item
    return found


def _preflight(run: Transition, ask: _Ask, decided: _Decided) -> _Decided:
    """What only preflight reads, beside the lock (`inner`: a change preflight refuses writes nothing), and its
    checks; an adopted release 0's server that still runs is stopped by the plan before the restart."""
    reads = PreflightReads(decided.facts, decided.request, ask.preflight_now)
    remote = run.remote if run.lock is None else run.lock.inner
    # the weights' page cache: read with preflight's facts, or alone once preflight passed when those were read
    # with the decision (a dry run, a sweep's candidate)
    roots = [root for root in page_cache_roots(decided.plan, decided.facts, decided.model_facts, ask.options.dry_run)
             if root not in decided.residency]
    measure, rides = [measure_step(root) for root in roots], bool(reads.steps)
    measured = read_facts(remote, [*reads.steps, *(measure if rides else ())])
    facts, hand_pid = reads.parse(measured)
    plan = decided.plan if hand_pid is None else decided.replan(facts, hand_pid)
    run.serving_before = run.serving_before or hand_pid is not None
    preflight(plan, ask.loaded, run.target, facts, hand_pid)
    if not rides:
        measured = read_facts(remote, measure)
    residency = {**decided.residency, **{root: parse_residency(measured[measure_step(root).name]) for root in roots}}
    return replace(decided, plan=plan, facts=facts, residency=residency)


def page_cache_roots(plan: Plan, facts: HostFacts, model_facts: ModelFacts, dry_run: bool) -> tuple[str, ...]:
    """The weights' directories whose page cache the preflight read measures: the new release's once its weights
    are all on the host (staged ones are measured after the stage), and a plan's current release's too."""
    current = facts.store.release(plan.current_id) if plan.current_id else None
    current_root = weights_root(current.metadata.get("model") or {}) if current and dry_run else None
    new_root = weights_root(plan.release.model) if model_facts.complete else None
    return tuple(dict.fromkeys(root for root in (current_root, new_root) if root))


def _switch(run: Transition, ask: _Ask, decided: _Decided, tags: Tags) -> ReadyReport:
    """The weights and the stage, the NCCL check, the switch and its readiness ladder, the gate; a failed start
    (or a signal) rolls back to the last healthy release and raises."""
    plan, facts, profile = decided.plan, decided.facts, ask.loaded.profile
    restore_id = facts.store.last_healthy(exclude=plan.release.id)
    record_new_crashes(run.remote, run.layout, facts.store, facts.unit)  # the restart below resets their count
    if not decided.model_facts.complete:
        stage_weights(run, decided.model, decided.venv.path, plan, facts)
    # while the old release serves, so that the server loads its weights from memory; weights staged just now are
    # measured again (their reading, if any, came before the stage)
    pre_read(run, ask.options, plan.release.model, decided.residency if decided.model_facts.complete else {})
    staged = plan.batches.stage
    if plan.gpu_check_reasons:  # the NCCL check runs between the stage and the switch: the stage goes alone, first
        run.phase(BatchKind.stage, staged)
        staged = ()
    gate = None if ask.options.skip_gate else profile.gate or (GateSettings() if ask.options.gate else None)
    watch = None if ask.options.skip_gate or ask.sweep is not None else profile.watch
    if watch is not None and run.before_restart is not None:  # a replica rejoins its router after its deploy
        run.progress.note("watch: not run for a replica behind a router (it rejoins the router after its deploy, so "
                          "the new release's window would see no traffic)")
        watch = None
    # the old release's window, before the try: nothing is switched yet, an interrupt here is one before the switch
    watched_before = None if watch is None else window_before_switch(
        run.remote, run.layout, facts.store, plan.current_id, run.serving_before, watch, run.progress, run.clock)
    known = [*facts.store.releases, ReleaseRecord(plan.release.id, "", plan.release.metadata())]
    try:
        if plan.gpu_check_reasons:
            check_before_start(run, plan)
        # what prune decides from, read under the lock with the switch: the store, its venvs, the kept weights
        before_switch, after_restart = around_the_restart(prune_read_steps(run.layout, known))
        ready = run.activate(plan.release.id, plan.release.metadata(), start_prediction(facts.store, ask.loaded.name),
                             ask.options.grace_s, plan.batches.switch, staged, before_switch, after_restart)
        if gate is not None:
            from deploy_lib.host.benchmark import gate_after_ready  # the benchmark's code loads only for a gated deploy

            run.remote.run(run.unsent)  # the start is verified before the benchmark judges it
            run.unsent = []
            gate_after_ready(run.remote, run.layout, plan.release.metadata(), tags, profile.bench, gate,
                             facts.store.history, run.progress, ask.secrets.get(API_KEY_ENV))
        if watch is not None:
            run.remote.run(run.unsent)  # the start is verified before the live traffic judges it
            run.unsent = []
            verdict = watch_after_ready(run.remote, probe_target(run.layout, plan.release.metadata(), {},
                                                                 generation=False),
                                        watch, watched_before, run.progress, run.clock)
            if verdict is not None:
                run.figures = watch_figures(verdict.before, verdict.after)
    except ReadinessFailed as failure:
        if isinstance(failure, WatchFailed):
            run.figures = failure.figures
        diagnosis = watch_diagnosis(failure) if isinstance(failure, WatchFailed) else \
            gate_diagnosis(failure) if isinstance(failure, GateFailed) else \
            diagnose(failure.evidence, profile=ask.loaded.name) if isinstance(failure, GpuCheckFailed) else \
            run.journal_diagnosis(run.cursor, ask.loaded.name)
        run.record("deploy", FAILED, tags, failure_line(failure, diagnosis))
        restore(run, facts.store, plan.release.id, failure, diagnosis, restore_id, plan.current_id)
    except KeyboardInterrupt as stop:
        run.verified = None  # a gate cut short has not judged the release
        interrupt, diagnosis = interruption(stop)
        run.record("deploy", FAILED, tags, diagnosis.cause)
        restore(run, facts.store, plan.release.id, interrupt, diagnosis, restore_id, plan.current_id)
    return ready


def _commit(run: Transition, ask: _Ask, tags: Tags) -> None:
    """The healthy record, the prune (decided from what the switch read) and the lock's release in one round trip."""
    read_at_switch = run.read_at_switch.results if run.read_at_switch else ()
    removal, removed = prune_after_deploy(run.layout, releases_to_keep(ask.loaded.profile, ask.sweep), tags,
                                          read_at_switch)
    run.record("deploy", HEALTHY, tags, then=removal, last=True)
    if removed:
        run.progress.note("pruned " + "; ".join(removed))


def check_before_start(run: Transition, plan: Plan) -> None:
    """preflight.gpu_check: stop the old server, verify NCCL's all-reduce with the new release's venv and
    environment, and raise GpuCheckFailed (a failed start: the caller rolls back) unless it verified."""
    from deploy_lib import gpu_check  # loads only for a deploy that runs the check

    subject = gpu_check.subject_of_release(plan.release.id, plan.release.metadata())
    if run.before_restart is not None:  # the check stops the old server
        run.before_restart()
    if run.serving_before:  # its batch stops the old server first
        run.stopped_at = run.clock()
    try:
        results = run.phase(BatchKind.gpu_check, plan.batches.gpu_check)
    except RemoteError as lost:  # the old server may be stopped already: roll back as after any failed start
        raise GpuCheckFailed(f"the NCCL check did not complete: {lost.message}", "gpu check",
                             (f"{gpu_check.REPORT_PREFIX}error: {lost.message}",)) from lost
    report = gpu_check.read_check_batch(subject, results)
    for warning in report.advice.warnings if report.advice else ():
        run.progress.note(f"gpu check: {warning}")
    if not report.check.verified:
        raise GpuCheckFailed(f"release {plan.release.id}'s NCCL check failed; SGLang was not started", "gpu check",
                             tuple(gpu_check.REPORT_PREFIX + line for line in report.check.lines()))
    run.progress.note(f"gpu check: {report.check.summary()}")


def stage_weights(run: Transition, model: Weights, venv: str, plan: Plan, facts: HostFacts) -> None:
    """The model phase: bring the weights the release names onto the host, while the old release serves."""
    from deploy_lib.host.models import push_model, stage_model  # loads only for a deploy that stages weights

    run.progress.phase_started(f"model: {model.label}")
    started = run.clock()
    if isinstance(model, HubModel):
        staged = stage_model(run.remote, model, venv, plan.release.model["commit"], run.progress, run.clock)
    else:
        assert isinstance(model, PushedModel)
        staged = push_model(run.remote, model, facts.model_results[0].stdout, run.progress, run.clock)
    run.timings["model"] = round(run.clock() - started, 3)
    run.progress.step_done(f"model: {len(staged.files)} files, {size_text(staged.total_bytes)} staged",
                           run.timings["model"])


def page_cache_plan(plan: Plan, facts: HostFacts, model_facts: ModelFacts,
                    readings: Mapping[str, Residency | str]) -> tuple[str, ...]:
    """A plan's lines on the page cache: how much of the current and the new release's weights it holds (`readings`
    of `page_cache_roots`), and whether the deploy reads the new ones in before the stop."""
    current = facts.store.release(plan.current_id) if plan.current_id else None
    current_root = weights_root(current.metadata.get("model") or {}) if current else None
    new_root = weights_root(plan.release.model)
    staged = model_facts.complete
    same = staged and current_root is not None and current_root == new_root
    new_label = "the new release" if plan.release_id is None else f"release {plan.release_id}"
    shown_current = None if current_root not in readings else (f"current release {plan.current_id}",
                                                                readings[str(current_root)])
    shown_new = (new_label, readings[new_root]) if staged and new_root is not None and new_root in readings \
        and not same else None
    return plan_lines(shown_current, shown_new, staged, model_facts.files, same)


PRE_READ_OFF = ("page cache: not read before the stop (--no-pre-read); the server reads the weights from disk as it "
                "starts")


def pre_read(run: Transition, options: Options, model: Mapping[str, str],
             measured: Mapping[str, Residency | str]) -> None:
    """A deploy's `warm_page_cache` (a single host's or each node's of a multi-node release), unless --no-pre-read
    turned it off: then a note says so."""
    if options.pre_read:
        warm_page_cache(run, model, measured)
    else:
        run.progress.note(PRE_READ_OFF)


def warm_page_cache(run: Transition, model: Mapping[str, str], measured: Mapping[str, Residency | str]) -> None:
    """Read the weights of the release switched to (its `model`, as its release.json records it) into the page cache
    before the old server stops, when the host's memory holds them and they are not resident already
    (models/page_cache.py decides); the figures go to a note either way. Weights `measured` already (with
    preflight's facts) are not measured again; others (staged now, or a recorded release's) are, here."""
    root = weights_root(model)
    if root is None:
        return
    remote = run.remote if run.lock is None else run.lock.inner  # read-only: the lock is taken by the first change
    reading = measured.get(root)
    decision = decide(read_residency(remote, root) if reading is None else reading)
    run.progress.note(decision.line())
    if decision.warm is not Warm.read:
        return
    run.progress.phase_started("page cache")
    started = run.clock()
    read = warm_weights(remote, decision, run.progress, run.clock)
    run.timings["page cache"] = round(run.clock() - started, 3)
    if read:
        run.progress.step_done(f"page cache: {size_text(read)} read", run.timings["page cache"])


def rollback(target: Target, service: str, remote: Remote, progress: Progress, to: str | None,
             environ: Mapping[str, str], clock: Callable[[], float] = time.monotonic,
             grace_s: float = GRACE_S, before_restart: Callable[[], None] | None = None, alone: bool = True
             ) -> Outcome:
    """Switch to release `to` (default: the last healthy one before current) after the same preflight as a deploy,
    and verify it; when it fails (or a signal comes), switch back to the release that was serving. A host `alone`
    (not one of a group acting together) is refused when either release is one node of a multi-node release."""
    run = Transition(remote, target.layout(service), target, progress, environ, clock, grace_s=grace_s,
                     before_restart=before_restart)
    with signals_raise():
        try:
            with lock_on_first_change(remote, run.layout, "rollback", target.host.name,
                                      LockContext(where=target.host.name, note=progress.note)) as lock:
                run.lock = run.remote = lock
                return _rollback(run, lock, to, alone)
        except KeyboardInterrupt as stop:
            raise run.interrupted_outside(stop) from None
        except ConnectionLost as lost:
            raise run.connection_lost(lost, "rollback") from None


def _rollback(run: Transition, lock: LockOnFirstChange, to: str | None, alone: bool) -> Outcome:
    """The target chosen from one read of the store and checked with the host facts; the lock is taken, if the
    store is still as first read, with the first change (a crash record, else the switch) and released with the
    history line."""
    store = read_store_facts(run.remote, run.layout)
    run.previous = store.current
    if alone:
        refuse_one_node(store, (to or store.last_healthy(exclude=store.current), store.current), run.where,
                        "rolled back", "`invoke rollback --group G` rolls every node of the release back together")
    record = rollback_record(store, to, run.where, run.layout)
    target_id = record.id
    tags = recorded_tags(run.target, target_id, record.metadata)
    facts = run.check_target(target_id, record.metadata)
    run.serving_before = facts.unit.active_state == "active"
    lock.decided_from(facts.store.lock, store.digest, f"rollback to {target_id}")
    serving = store.current if store.current != target_id and facts.store.release(store.current or "") else None
    restore_id = serving or facts.store.last_healthy(exclude=target_id)
    record_new_crashes(run.remote, run.layout, facts.store, facts.unit)  # a crash loop: why a person rolls back
    warm_page_cache(run, record.metadata.get("model") or {}, {})  # while the old release serves, as a deploy does
    try:
        ready = run.activate(target_id, record.metadata, start_prediction(facts.store, tags.profile), run.grace_s,
                             recorded_switch(run.layout, facts, target_id))
    except ReadinessFailed as failure:
        diagnosis = run.journal_diagnosis(run.cursor, tags.profile)
        run.record("rollback", FAILED, tags, failure_line(failure, diagnosis))
        restore(run, facts.store, target_id, failure, diagnosis, restore_id, store.current)
    except KeyboardInterrupt as stop:
        interrupt, diagnosis = interruption(stop)
        run.record("rollback", FAILED, tags, diagnosis.cause)
        restore(run, facts.store, target_id, interrupt, diagnosis, restore_id, store.current)
    run.record("rollback", HEALTHY, tags, f"by hand from {store.current or 'none'}", last=True)
    return Outcome(Action.rolled_back, target_id, store.current, ready=ready, timings=run.timings,
                   downtime=run.downtime)


def start(target: Target, service: str, remote: Remote, progress: Progress, environ: Mapping[str, str],
          restart: bool, clock: Callable[[], float] = time.monotonic,
          before_restart: Callable[[], None] | None = None, alone: bool = True) -> Outcome:
    """Start (or restart) the current release and climb the readiness ladder, as a deploy does; a release that
    does not come up is rolled back to the last healthy one like a failed deploy. Under the host's lock, taken with
    the switch (`lock_on_first_change`): a start that finds the server running changes nothing. The unit file
    systemd holds is the current release's already, so the restart reloads systemd only when it reports the file
    changed (`unit_held`)."""
    layout = target.layout(service)
    event = "restart" if restart else "start"
    with lock_on_first_change(remote, layout, event, target.host.name,
                              LockContext(where=target.host.name, note=progress.note)) as lock:
        facts = read_host_facts(lock, FactRequest(layout, venv=None, port=None))
        lock.decided_from(facts.store.lock, facts.store.digest)
        record = current_record(facts.store, target.host.name)
        if alone:
            refuse_one_node(facts.store, (record.id,), target.host.name, f"{event}ed",
                            "`invoke deploy --profile P --group G` starts every node of the release together")
        if not restart and facts.unit.active_state == "active":
            return Outcome(Action.already_running, record.id, record.id)
        tags = Tags.from_dict(record.metadata["tags"])
        run = Transition(lock, layout, target, progress, environ, clock, before_restart=before_restart, lock=lock,
                         serving_before=facts.unit.active_state == "active")
        try:
            ready = run.activate(record.id, record.metadata, start_prediction(facts.store, tags.profile), GRACE_S,
                                 recorded_switch(layout, facts, record.id))
        except ReadinessFailed as failure:
            diagnosis = run.journal_diagnosis(run.cursor, tags.profile)
            run.record(event, FAILED, tags, failure_line(failure, diagnosis))
            restore(run, facts.store, record.id, failure, diagnosis, facts.store.last_healthy(exclude=record.id),
                     record.id)
        run.record(event, HEALTHY, tags, last=True)
    return Outcome(Action.restarted if restart else Action.started, record.id, record.id, ready=ready,
                   timings=run.timings, downtime=run.downtime)


def stop(target: Target, service: str, remote: Remote, before_stop: Callable[[], None] | None = None,
         alone: bool = True) -> Outcome:
    """Stop the current release's unit (SGLang drains in-flight requests first); recorded in history. `before_stop`
    runs just before the server stops (a router takes it out). A node of a multi-node release is stopped only with
    the others (`alone` False: the group's command)."""
    layout = target.layout(service)
    with host_lock(remote, layout, "stop", target.host.name):
        store = read_store_facts(remote, layout)
        record = current_record(store, target.host.name)
        if alone:
            refuse_one_node(store, (record.id,), target.host.name, "stopped",
                            "`invoke stop --group G` stops every node of the release together")
        tags = Tags.from_dict(record.metadata["tags"])
        if before_stop is not None:
            before_stop()
        hand_pid = hand_run_pid(record.metadata, remote.run(hand_run_check(record.metadata)))
        if hand_pid:
            # read leniently: a release recorded by an older version may hold what a profile now refuses (an env
            # value that looks like a credential), and the stop must not fail on it
            remote.run(stop_hand_run(hand_pid, read_stored_profile(record.metadata["profile"]).service
                                     .stop_timeout_s))
        stop_unit(remote, layout, stop_bound_s(record.metadata))
        Transition(remote, layout, target, NullProgress(), {}).record("stop", STOPPED, tags, "by hand")
    return Outcome(Action.stopped, record.id, record.id)
