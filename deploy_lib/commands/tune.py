"""The sweep on one host: the base benchmarked twice (its noise), then each candidate deployed as a release through
the deploy engine (stage, switch, readiness ladder, automatic rollback), benchmarked over the ladder with the GPU
sampler, judged and recorded in history (search: halving benchmarks all short first, the best 1 in eta in full);
after a candidate that failed or missed the SLA the best healthy release so far serves again. At the end the winner
stays or the pre-sweep release is restored (a group's host benchmarks the base its part of BASE_RUNS and ends with
its share: the group decides once, over every host, in ops.tune_group). A signal leaves the best verified release
(or the original) serving; `resume` continues a sweep without running its finished candidates. One candidate's
deploy, benchmark and record, and the run's state: commands/tune_candidate.py."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from deploy_lib.commands.tune_candidate import SweepRun, Unit, run_candidate, stop_if_asked, tags_of
from deploy_lib.commands.tune_request import Planned, Request, unit_of
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, DeployError, Interrupted
from deploy_lib.facts.host import FactRequest
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.store import read_store_facts
from deploy_lib.interrupts import interrupted, signals_raise
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote
from deploy_lib.store import FAILED, HistoryEntry, StoreFacts
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
from deploy_lib.tune.spec import Keep, Search
from deploy_lib.tune.sweep import HostView, build_sweep, check_values, differences

BASE_RUNS = 2  # the base's repeated runs give the noise a winner must beat (a group's: over all its hosts)


def _host_view(remote: Remote, target: Target, loaded: LoadedProfile, write_caches: bool
               ) -> tuple[StoreFacts, HostView, str]:
    layout = target.layout(loaded.profile.service.name)
    store = read_store_facts(remote, layout)
    current = store.release(store.current) if store.current else None
    if current is None:
        raise ConfigError(f"{target.host.name}: no release serves, so there is nothing to compare a candidate with",
                          f"`invoke deploy --profile {loaded.name}` first")
    # `write_caches` (not a dry run): the SGLang facts' cache this leaves spares the first candidate's deploy a Python
    venv = str(current.metadata.get("venv") or target.venv_of(loaded.profile))
    facts = read_host_facts(remote, FactRequest(layout, venv, port=None, write_caches=write_caches))
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
            store.history, sweep.bench, left, 0 if finished and finished.base else BASE_RUNS,
            halving.survivors(len(sweep.candidates)) if halving else None,
            halving.short_bench(sweep.bench) if halving else None, spec.keep is Keep.winner,
            frozenset(label for label in left if not changes[label])))
    run = SweepRun(loaded, target, remote, progress, request, spec, sweep,
                 request.resume or request.tune_id or tune_id(datetime.now(UTC), secrets.token_hex(2)), original,
                 store, clock, unit, store.current)
    run.metadata |= {r.id: r.metadata for r in store.releases}
    with signals_raise():
        try:
            return _run(run, host)
        except (KeyboardInterrupt, Interrupted) as stop:
            raise _stopped(run, stop) from None


def _run(run: SweepRun, host: HostView) -> TuneReport:
    now = datetime.now(UTC)
    if run.request.resume is None:
        tags = tags_of(run.metadata[run.original])
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
            run.record(run_line(run.tune, BASE, "base", tags_of(run.metadata[run.original]), datetime.now(UTC),
                                result, score))
    if run.spec.search is Search.halving:
        _halving_rounds(run, host)
        return _finish(run)
    remaining = decide.to_run([c.label for c in run.sweep.candidates], run.report().finished_labels)
    by_label = {c.label: c for c in run.sweep.candidates}
    for number, label in enumerate(remaining, start=1):
        stop_if_asked(run)
        run.progress.phase_started(f"tune {run.tune}: candidate {number}/{len(remaining)}: {label}")
        ok = run_candidate(run, by_label[label], host)
        back = decide.serve_next(run.serving(), ok, run.best(), run.original)
        if back is not None:
            run.switch(back)
    return _finish(run)


def _short_entry(history: Sequence[HistoryEntry], tune: str, label: str) -> HistoryEntry:
    return next(e for e in reversed(history) if e.event == "tune" and e.tune.get("id") == tune
                and e.tune.get("role") == SHORT and e.tune.get("candidate") == label)


def _halving_rounds(run: SweepRun, host: HostView) -> None:
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
        stop_if_asked(run)
        run.progress.phase_started(f"tune {run.tune}: short round {number}/{len(left)}: {label} "
                                   f"({short_bench.output_len} output tokens)")
        ok = run_candidate(run, by_label[label], host, short_bench, SHORT)
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


def _finish(run: SweepRun) -> TuneReport:
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
            run.record(run_line(run.tune, RERUN, standing.label, tags_of(run.metadata[standing.release_id]),
                                datetime.now(UTC), result, score))
    serving = decide.end_release(decision, run.original)
    if run.serving() != serving:
        run.switch(serving)
    run.progress.note(decision.reason)
    run.record(tune_line(run.tune, END, tags_of(run.metadata[serving]), datetime.now(UTC), cause=decision.reason,
                         label=decision.winner.label if decision.winner else ""))
    return run.report()


def _stopped(run: SweepRun, stop: BaseException) -> DeployError:
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
