"""The sweep on one host: the base benchmarked twice (its noise), then each candidate deployed as a release through
the deploy engine (stage, switch, readiness ladder, automatic rollback), benchmarked over the ladder with the GPU
sampler, judged and recorded in history (search: halving benchmarks all short first, the best 1 in eta in full);
after a candidate that failed or missed the SLA the best healthy release so far serves again. At the end the winner
stays or the pre-sweep release is restored (a group's host benchmarks the base its part of BASE_RUNS and ends with
its share: the group decides once, over every host, in ops.tune_group). A signal leaves the best verified release
(or the original) serving; `resume` continues a sweep without running its finished candidates."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from deploy_lib.deploy import Options, Outcome, release_tags
from deploy_lib.deploy import deploy as deploy_release
from deploy_lib.deploy import rollback as switch_to
from deploy_lib.errors import ConfigError, DeployError, Interrupted, PreflightError, ReadinessFailed
from deploy_lib.facts.read import read_host_facts
from deploy_lib.interrupts import interrupted, signals_raise
from deploy_lib.patches.profiles import base_profile
from deploy_lib.profile import LoadedProfile
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.progress import Progress
from deploy_lib.project import Target
from deploy_lib.release.model import resolve_secrets
from deploy_lib.release.server_args import API_KEY_ENV
from deploy_lib.remote import Remote
from deploy_lib.store import FAILED, HistoryEntry, StoreFacts, StoreLayout, Tags, append_history, read_store_facts
from deploy_lib.throughput import BenchResult, run_benchmark
from deploy_lib.tune import decide
from deploy_lib.tune.estimate import estimate
from deploy_lib.tune.record import (
    BASE,
    CANDIDATE,
    ELIMINATED,
    END,
    RERUN,
    SHORT,
    SKIPPED,
    TuneReport,
    read_tune,
    run_line,
    start_line,
    tune_id,
    tune_line,
)
from deploy_lib.tune.request import Planned, Request, unit_of
from deploy_lib.tune.spec import Keep, Search, TuneSpec
from deploy_lib.tune.sweep import Candidate, HostView, Sweep, build_sweep, check_values, differences

BASE_RUNS = 2  # the base's repeated runs give the noise a winner must beat (a group's: over all its hosts)


@dataclass(frozen=True)
class Unit:
    """How a sweep changes what serves when the server is more than the host it reads, records and benchmarks on
    (a multi-node release: every node at once, through ops.multinode_deploy); None: that host alone."""

    deploy: Callable[[Candidate, Options], Outcome]
    switch: Callable[[str], None]


@dataclass
class _Sweep:
    """One run of the loop: the host, what it has written, and the releases it can switch to."""

    loaded: LoadedProfile
    target: Target
    remote: Remote
    progress: Progress
    request: Request
    spec: TuneSpec
    sweep: Sweep
    tune: str
    original: str
    store: StoreFacts
    clock: Callable[[], float]
    unit: Unit | None = None
    serving_id: str | None = None     # what this run's last deploy or switch left serving; None: read it
    written: list[HistoryEntry] = field(default_factory=list)
    metadata: dict[str, Mapping[str, Any]] = field(default_factory=dict)   # release id -> release.json
    modules: dict[str, str] = field(default_factory=dict)  # venv python -> its benchmark module (run_benchmark)

    @property
    def layout(self) -> StoreLayout:
        return self.target.layout(self.loaded.profile.service.name)

    @property
    def history(self) -> list[HistoryEntry]:
        return [*self.store.history, *self.written]

    def record(self, *entries: HistoryEntry) -> None:  # in one round trip
        self.remote.run([step for entry in entries for step in append_history(self.layout, entry)])
        self.written.extend(entries)

    def report(self) -> TuneReport:
        return read_tune(self.history, self.tune)

    def standings(self) -> list[decide.Standing]:
        return [row.standing() for row in self.report().rows]

    def best(self) -> str | None:
        return self.report().best_release()

    def serving(self) -> str | None:  # read from the host after a failed start's rollback or a signal
        return self.serving_id if self.serving_id is not None else self.read().current

    def read(self) -> StoreFacts:
        self.store = read_store_facts(self.remote, self.layout)
        self.written = []  # the host's history holds them now
        self.serving_id = self.store.current
        return self.store

    def switch(self, release_id: str) -> None:
        self.progress.phase_started(f"tune: switch to release {release_id}")
        self.serving_id = None  # unknown until the switch returns
        if self.unit is not None:
            self.unit.switch(release_id)
        else:
            switch_to(self.target, self.loaded.profile.service.name, self.remote, self.progress, release_id,
                      self.request.environ, grace_s=self.request.grace_s)
        self.serving_id = release_id

    def benchmark(self, release_id: str, bench: BenchSettings | None = None) -> tuple[BenchResult, decide.Score]:
        api_key = resolve_secrets(self.loaded.profile, self.request.environ).get(API_KEY_ENV)
        result = run_benchmark(self.remote, self.layout, self.metadata[release_id], bench or self.sweep.bench,
                               self.progress, api_key, self.clock, self.modules)
        return result, decide.score(result, self.spec.objective, self.spec.level or self.sweep.level, self.spec.sla)


def _host_view(remote: Remote, target: Target, loaded: LoadedProfile, write_caches: bool
               ) -> tuple[StoreFacts, HostView, str]:
    layout = target.layout(loaded.profile.service.name)
    store = read_store_facts(remote, layout)
    current = store.release(store.current) if store.current else None
    if current is None:
        raise ConfigError(f"{target.host.name}: no release serves, so there is nothing to compare a candidate with",
                          f"`invoke deploy --profile {loaded.name}` first")
    # `write_caches` (not a dry run): the SGLang facts' cache this leaves spares the first candidate's deploy a Python
    facts = read_host_facts(remote, layout, venv=str(current.metadata.get("venv") or target.venv_of(loaded.profile)),
                            port=None, write_caches=write_caches)
    gpus = facts.gpus or ()
    version = facts.sglang.sglang_version or str(current.metadata.get("sglang_version") or "")
    return store, HostView(layout, version, facts.sglang.flashinfer_version, facts.sglang.options,
                           gpus[0].arch if gpus else ""), current.id


def tune(loaded: LoadedProfile, target: Target, remote: Remote, progress: Progress, request: Request,
         clock: Callable[[], float] = time.monotonic, unit: Unit | None = None) -> TuneReport | Planned:
    """Run (or, dry, plan) the sweep of `request` over `loaded` on one host (or the `unit` it heads); the table,
    read back from history. A key or value the profile refuses is a ConfigError before the host is read."""
    if request.spec is not None:
        check_values(loaded, request.spec, request.sources, request.patch_sets)
    store, host, current = _host_view(remote, target, loaded, not request.dry_run)
    spec, sources, original = request.spec, request.sources, current
    if request.resume is not None:
        done = read_tune(store.history, request.resume)
        if done.profile != loaded.name:
            raise ConfigError(f"sweep {request.resume} tuned profile {done.profile}, not {loaded.name}",
                              f"resume it with --profile {done.profile}")
        spec, original = done.spec, done.original
        request = replace(request, share=done.share or None)
        sources = {key: f"sweep {request.resume}: vary.{key}" for key in spec.vary}
    if spec is None:
        raise ConfigError("tune needs something to vary: --vary KEY=V1,V2,... or --spec tune/NAME.yaml",
                          "or --resume TUNE_ID to finish a sweep")
    sweep = build_sweep(loaded, spec, sources, request.patch_sets, host)
    if request.share is not None:  # a group's host: its share of the candidates (the skipped ones are everyone's)
        sweep = replace(sweep, candidates=tuple(c for c in sweep.candidates if c.label in request.share))
    if request.dry_run:  # a resumed sweep's estimate counts what it still runs
        finished = read_tune(store.history, request.resume) if request.resume else None
        left = decide.to_run([c.label for c in sweep.candidates], finished.finished_labels if finished else [])
        base = store.release(current)
        changes = {c.label: tuple(differences(base.metadata if base else None, c, host)) for c in sweep.candidates}
        halving = spec.halving if spec.search is Search.halving else None
        return Planned(sweep, current, changes, estimate(
            store.history, sweep.bench, len(left), 0 if finished and finished.base else BASE_RUNS,
            halving.survivors(len(sweep.candidates)) if halving else None,
            halving.short_bench(sweep.bench) if halving else None))
    run = _Sweep(loaded, target, remote, progress, request, spec, sweep,
                 request.resume or request.tune_id or tune_id(datetime.now(UTC), secrets.token_hex(2)), original,
                 store, clock, unit, store.current)
    run.metadata |= {r.id: r.metadata for r in store.releases}
    with signals_raise():
        try:
            return _run(run, host)
        except (KeyboardInterrupt, Interrupted) as stop:
            raise _stopped(run, stop) from None


def _tags(metadata: Mapping[str, Any]) -> Tags:
    return Tags.from_dict(metadata["tags"])


def _run(run: _Sweep, host: HostView) -> TuneReport:
    now = datetime.now(UTC)
    if run.request.resume is None:
        tags = _tags(run.metadata[run.original])
        run.record(start_line(run.tune, run.spec, run.loaded.name, tags, now, len(run.sweep.candidates),
                              run.request.share),
                   *(tune_line(run.tune, SKIPPED, tags, now, outcome=FAILED, cause=skipped.reason, label=skipped.label,
                               extra={"release": ""}) for skipped in run.sweep.skipped))
    for note in run.sweep.notes:
        run.progress.note(note)
    if run.report().base is None:
        if run.serving() != run.original:
            run.switch(run.original)
        for _ in range(-(-BASE_RUNS // run.request.sharing)):  # a group's hosts split them (rounded up), at once
            run.progress.phase_started(f"tune {run.tune}: the pre-sweep release {run.original}")
            result, score = run.benchmark(run.original)
            run.record(run_line(run.tune, BASE, "base", _tags(run.metadata[run.original]), datetime.now(UTC),
                                result, score))
    if run.spec.search is Search.halving:
        _halving_rounds(run, host)
        return _finish(run)
    remaining = decide.to_run([c.label for c in run.sweep.candidates], run.report().finished_labels)
    by_label = {c.label: c for c in run.sweep.candidates}
    for number, label in enumerate(remaining, start=1):
        _stop_if_asked(run)
        run.progress.phase_started(f"tune {run.tune}: candidate {number}/{len(remaining)}: {label}")
        ok = _candidate(run, by_label[label], host)
        back = decide.serve_next(run.serving(), ok, run.best(), run.original)
        if back is not None:
            run.switch(back)
    return _finish(run)


def _stop_if_asked(run: _Sweep) -> None:
    """A group's sweep noted a signal: start no further candidate (_stopped: the best so far serves)."""
    if run.request.stop is not None and run.request.stop():
        raise Interrupted("a signal was noted")


def deploy_candidate(candidate: Candidate, target: Target, remote: Remote, progress: Progress,
                     options: Options) -> Outcome:
    """The candidate as a release (its own venv when it carries a patch set); the engine rolls back a failed start.
    Also a group's rollout of the winner to each host."""
    if candidate.patch_set is None:
        return deploy_release(candidate.loaded, target, remote, progress, options)
    from deploy_lib.commands.patches import enable  # loads only for a sweep over patch sets

    base = base_profile(candidate.loaded, candidate.patch_set)
    return enable(remote, candidate.patch_set, base, candidate.loaded, target, progress, options)[1]


def _deploy(run: _Sweep, candidate: Candidate) -> tuple[str, Mapping[str, Any], Tags]:
    keep = len(run.store.releases) + len(run.sweep.candidates) + 1
    options = Options(environ=run.request.environ, grace_s=run.request.grace_s, skip_gate=True,
                      keep_releases_at_least=keep, expect_change=True)
    run.serving_id = None  # a failed start's rollback leaves serving what the store says
    outcome = (run.unit.deploy(candidate, options) if run.unit is not None
               else deploy_candidate(candidate, run.target, run.remote, run.progress, options))
    assert outcome.plan is not None and outcome.release_id is not None
    run.serving_id = outcome.release_id
    release = outcome.plan.release
    return outcome.release_id, release.metadata(), release_tags(run.target, release)


def _failed_tags(run: _Sweep, known: int) -> Tags | None:
    """The tags of the release the engine recorded as failed after the first `known` history lines (the store is
    read again); None when it recorded none (refused before anything was staged)."""
    failed = next((e for e in reversed(run.read().history[known:]) if e.event == "deploy" and e.outcome == FAILED),
                  None)
    return failed.tags if failed is not None else None


def _candidate(run: _Sweep, candidate: Candidate, host: HostView, bench: BenchSettings | None = None,
               role: str = CANDIDATE) -> bool:
    """Deploy, benchmark (`bench`, default the sweep's), judge and record one candidate (its run under `role`; a
    start that failed is always a candidate's final line); True when it was healthy and met the SLA."""
    original = run.store.release(run.original)
    changes = [str(c) for c in differences(original.metadata if original else run.metadata[run.original],
                                           candidate, host)]
    known = len(run.store.history)
    try:
        release_id, metadata, tags = _deploy(run, candidate)
    except (ReadinessFailed, PreflightError, ConfigError) as failed:  # diagnosed, rolled back, recorded by the engine
        run.progress.note(f"candidate {candidate.label} failed: {failed.message}")
        failed_tags = _failed_tags(run, known)
        run.record(run_line(run.tune, CANDIDATE, candidate.label, failed_tags or _tags(run.metadata[run.original]),
                            datetime.now(UTC), None, decide.Score(None, False), cause=failed.message.splitlines()[0],
                            changes=changes, has_release=failed_tags is not None))
        return False
    run.metadata[release_id] = {**metadata, "tags": tags.as_dict()}  # as release.json holds it
    result, score = run.benchmark(release_id, bench)
    run.record(run_line(run.tune, role, candidate.label, tags, datetime.now(UTC), result, score, changes=changes))
    if not score.qualifies:
        run.progress.note(f"candidate {candidate.label}: {'; '.join(score.misses) or 'no figures'}")
    return score.qualifies


def _short_entry(history: Sequence[HistoryEntry], tune: str, label: str) -> HistoryEntry:
    return next(e for e in reversed(history) if e.event == "tune" and e.tune.get("id") == tune
                and e.tune.get("role") == SHORT and e.tune.get("candidate") == label)


def _halving_rounds(run: _Sweep, host: HostView) -> None:
    """search: halving: every candidate a release benchmarked short; the best one in eta benchmarked again in full
    (they compete as a grid's candidates do), the others recorded as eliminated with their short figures. A resume
    repeats no short run in history, nor a survivor's full run."""
    halving = run.spec.halving
    short_bench = halving.short_bench(run.sweep.bench)
    labels = [c.label for c in run.sweep.candidates]
    by_label = {c.label: c for c in run.sweep.candidates}
    report = run.report()
    left = decide.to_run(labels, [*(row.label for row in report.short), *report.finished_labels])
    for number, label in enumerate(left, start=1):
        _stop_if_asked(run)
        run.progress.phase_started(f"tune {run.tune}: short round {number}/{len(left)}: {label} "
                                   f"({short_bench.output_len} output tokens)")
        ok = _candidate(run, by_label[label], host, short_bench, SHORT)
        back = decide.serve_next(run.serving(), ok, run.best(), run.original)
        if back is not None:
            run.switch(back)
    report = run.report()
    kept = decide.survivors([row.standing() for row in report.short], halving.survivors(len(labels)))
    kept_labels = [s.label for s in kept]
    finished = set(report.finished_labels)
    for row in report.short:
        if row.label in finished or row.label in kept_labels:
            continue
        entry = _short_entry(run.history, run.tune, row.label)
        why = (f"eliminated by the short benchmark ({short_bench.output_len} output tokens): "
               + (f"{row.values[-1]:,.1f} below the {len(kept)} survivors" if row.values else row.cause))
        run.record(tune_line(run.tune, ELIMINATED, entry.tags, datetime.now(UTC), outcome=FAILED, cause=why,
                             label=row.label, figures=entry.figures,
                             extra={"sla_met": entry.tune.get("sla_met", "no"), "changes": row.changes}))
    for number, standing in enumerate(kept, start=1):
        if standing.label in finished:
            continue
        assert standing.release_id is not None
        run.progress.phase_started(f"tune {run.tune}: full benchmark {number}/{len(kept)}: {standing.label}")
        if run.serving() != standing.release_id:
            run.switch(standing.release_id)
        entry = _short_entry(run.history, run.tune, standing.label)
        result, score = run.benchmark(standing.release_id)
        run.record(run_line(run.tune, CANDIDATE, standing.label, entry.tags, datetime.now(UTC), result, score,
                            changes=[entry.tune["changes"]] if entry.tune.get("changes") else []))


def _finish(run: _Sweep) -> TuneReport:
    if run.request.share is not None:  # a group's host: the group decides once and switches every host at most once
        return run.report()
    base = run.report().base
    base_values = base.values if base else ()
    unit = unit_of(run.spec)
    while True:
        decision = decide.decide(max(base_values) if base_values else None, run.standings(),
                                 decide.noise(base_values), run.spec.keep is Keep.winner, unit)
        if not decision.rerun:
            break
        run.progress.note(decision.reason)
        for standing in decision.rerun:
            assert standing.release_id is not None
            if run.serving() != standing.release_id:
                run.switch(standing.release_id)
            result, score = run.benchmark(standing.release_id)
            run.record(run_line(run.tune, RERUN, standing.label, _tags(run.metadata[standing.release_id]),
                                datetime.now(UTC), result, score))
    serving = decide.end_release(decision, run.original)
    if run.serving() != serving:
        run.switch(serving)
    run.progress.note(decision.reason)
    run.record(tune_line(run.tune, END, _tags(run.metadata[serving]), datetime.now(UTC), cause=decision.reason,
                         label=decision.winner.label if decision.winner else ""))
    return run.report()


def _stopped(run: _Sweep, stop: BaseException) -> DeployError:
    """After a signal: the best verified release (or the original) serves; the error names the sweep to resume."""
    wanted = run.best() or run.original
    try:
        serving = run.serving()
        if serving != wanted:
            run.switch(wanted)
            serving = wanted
    except DeployError as lost:
        return Interrupted(f"tune {run.tune} interrupted, and switching to release {wanted} failed: {lost.message}",
                           f"`invoke rollback --to {wanted}`, then `invoke tune --resume {run.tune}`")
    message = f"tune {run.tune} interrupted: release {serving} is serving"
    hint = f"`invoke tune --resume {run.tune}` runs the candidates not finished"
    if isinstance(stop, Interrupted):  # the engine finished its own transition first: keep its signal's exit code
        error = type(stop)(message, hint)
    else:
        assert isinstance(stop, KeyboardInterrupt)
        error = interrupted(stop, message, hint)
    error.serving_id = serving  # a verified release serves: a router may take the replica back
    return error


def show(remote: Remote, target: Target, service: str, tune: str) -> TuneReport:
    """`tune.show`: the sweep's table, read back from the host's history."""
    return read_tune(read_store_facts(remote, target.layout(service)).history, tune)
