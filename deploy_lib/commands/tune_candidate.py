"""One candidate's life on the host, and the state of the sweep run it belongs to: deployed as a release through the
deploy engine (its own venv for a patch set; the engine rolls back a failed start), benchmarked, judged against the
objective and the SLA, recorded in history. The order of the candidates and the sweep's end are commands/tune.py's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from deploy_lib.commands.deploy import Options, Outcome, SweepCandidate
from deploy_lib.commands.deploy import deploy as deploy_release
from deploy_lib.commands.deploy import rollback as switch_to
from deploy_lib.commands.tune_request import Request
from deploy_lib.deploy.plan import release_tags
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, Interrupted, PreflightError, ReadinessFailed
from deploy_lib.health.downtime import Downtime
from deploy_lib.host.benchmark import run_benchmark
from deploy_lib.host.store import read_store_facts
from deploy_lib.patches.profiles import base_profile
from deploy_lib.profile import LoadedProfile
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.progress import Progress
from deploy_lib.release.model import resolve_secrets
from deploy_lib.release.server_args import API_KEY_ENV
from deploy_lib.remote import Remote
from deploy_lib.store import FAILED, HistoryEntry, StoreFacts, StoreLayout, Tags, append_history
from deploy_lib.throughput import BenchResult
from deploy_lib.tune import decide
from deploy_lib.tune.record import CANDIDATE, TuneReport, read_tune, run_line
from deploy_lib.tune.spec import TuneSpec
from deploy_lib.tune.sweep import Candidate, HostView, Sweep, differences


@dataclass(frozen=True)
class Unit:
    """How a sweep changes what serves when the server is more than the host it reads, records and benchmarks on
    (a multi-node release: every node at once, through ops.multinode_deploy); None: that host alone."""

    deploy: Callable[[Candidate, Options, SweepCandidate], Outcome]
    switch: Callable[[str], None]


@dataclass
class SweepRun:
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
        api_key = resolve_secrets(self.loaded.profile, self.request.environ, str(self.loaded.path)).get(API_KEY_ENV)
        result = run_benchmark(self.remote, self.layout, self.metadata[release_id], bench or self.sweep.bench,
                               self.progress, api_key, self.clock, self.modules)
        return result, decide.score(result, self.spec.objective, self.spec.level or self.sweep.level, self.spec.sla)


def tags_of(metadata: Mapping[str, Any]) -> Tags:
    return Tags.from_dict(metadata["tags"])


def stop_if_asked(run: SweepRun) -> None:
    """A group's sweep noted a signal: start no further candidate (_stopped: the best so far serves)."""
    if run.request.stop is not None and run.request.stop():
        raise Interrupted("a signal was noted")


def deploy_candidate(candidate: Candidate, target: Target, remote: Remote, progress: Progress, options: Options,
                     before_restart: Callable[[], None] | None = None, sweep: SweepCandidate | None = None
                     ) -> Outcome:
    """The candidate as a release (its own venv when it carries a patch set); the engine rolls back a failed start.
    Also a group's rollout of the winner to each host (`before_restart`: its router's drain)."""
    if candidate.patch_set is None:
        return deploy_release(candidate.loaded, target, remote, progress, options, before_restart=before_restart,
                              sweep=sweep)
    from deploy_lib.commands.patches import enable  # loads only for a sweep over patch sets

    base = base_profile(candidate.loaded, candidate.patch_set)
    return enable(remote, candidate.patch_set, base, candidate.loaded, target, progress, options, before_restart,
                  sweep)[1]


def _deploy(run: SweepRun, candidate: Candidate) -> tuple[str, Mapping[str, Any], Tags, Downtime | None]:
    options = Options(environ=run.request.environ, grace_s=run.request.grace_s, skip_gate=True)
    sweep = SweepCandidate(keep_releases_at_least=len(run.store.releases) + len(run.sweep.candidates) + 1)
    run.serving_id = None  # a failed start's rollback leaves serving what the store says
    outcome = (run.unit.deploy(candidate, options, sweep) if run.unit is not None
               else deploy_candidate(candidate, run.target, run.remote, run.progress, options, sweep=sweep))
    assert outcome.plan is not None and outcome.release_id is not None
    run.serving_id = outcome.release_id
    release = outcome.plan.release
    return outcome.release_id, release.metadata(), release_tags(run.target, release), outcome.downtime


def _failed_tags(run: SweepRun, known: int) -> Tags | None:
    """The tags of the release the engine recorded as failed after the first `known` history lines (the store is
    read again); None when it recorded none (refused before anything was staged)."""
    failed = next((e for e in reversed(run.read().history[known:]) if e.event == "deploy" and e.outcome == FAILED),
                  None)
    return failed.tags if failed is not None else None


def run_candidate(run: SweepRun, candidate: Candidate, host: HostView, bench: BenchSettings | None = None,
               role: str = CANDIDATE) -> bool:
    """Deploy, benchmark (`bench`, default the sweep's), judge and record one candidate (its run under `role`; a
    start that failed is always a candidate's final line); True when it was healthy and met the SLA."""
    original = run.store.release(run.original)
    changes = [str(c) for c in differences(original.metadata if original else run.metadata[run.original],
                                           candidate, host)]
    known = len(run.store.history)
    try:
        release_id, metadata, tags, downtime = _deploy(run, candidate)
    except (ReadinessFailed, PreflightError, ConfigError) as failed:  # diagnosed, rolled back, recorded by the engine
        run.progress.note(f"candidate {candidate.label} failed: {failed.message}")
        failed_tags = _failed_tags(run, known)
        run.record(run_line(run.tune, CANDIDATE, candidate.label, failed_tags or tags_of(run.metadata[run.original]),
                            datetime.now(UTC), None, decide.Score(None, False), cause=failed.message.splitlines()[0],
                            changes=changes, has_release=failed_tags is not None))
        return False
    run.metadata[release_id] = {**metadata, "tags": tags.as_dict()}  # as release.json holds it
    result, score = run.benchmark(release_id, bench)
    run.record(run_line(run.tune, role, candidate.label, tags, datetime.now(UTC), result, score, changes=changes,
                        downtime=downtime))
    if downtime is not None:
        run.progress.note(f"candidate {candidate.label}: {downtime.line()}")
    if not score.qualifies:
        run.progress.note(f"candidate {candidate.label}: {'; '.join(score.misses) or 'no figures'}")
    return score.qualifies
