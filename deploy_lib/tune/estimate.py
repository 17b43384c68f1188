"""How long a sweep takes, from this host's history (pure). Starts: the median of its recorded starts (a switch's
downtime, else a release's `ready` timing), counted as commands/tune.py performs them. A benchmark, level by level:
the mean pace of the host's runs of that level at the same lengths, scaled to the prompts it sends, plus what a
level costs around its timed requests (its client process, the GPU sampler, reading the results back) from the
host's recorded wall times.
Where the host has no such record a stated default stands in, and the estimate says so."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from deploy_lib.health.downtime import DOWNTIME
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.store import HEALTHY, HistoryEntry
from deploy_lib.throughput.results import WALL_KEY

RERUNS = 2                   # decide.decide: the top two, once each, when they are within the noise
DEFAULT_START_S = 300.0      # a host with no healthy start recorded: a large model's cold start, minutes
DEFAULT_STREAM_TOK_S = 20.0  # a level never run here: each request decodes at this pace, in waves of its concurrency
DEFAULT_LEVEL_OVERHEAD_S = 10.0  # no wall time recorded: a level's client process (imports, tokenizer) and the rest
SERVING = ""                 # the release serving before the sweep, among the candidates' labels


@dataclass(frozen=True)
class Between:
    """A count that depends on what the sweep measures: at least `fewest`, at most `most`."""

    fewest: int
    most: int

    def text(self) -> str:
        return str(self.fewest) if self.fewest == self.most else f"{self.fewest}-{self.most}"


@dataclass(frozen=True)
class LevelEstimate:
    """One level of the ladder: the prompts it sends and how long it will take."""

    concurrency: int
    prompts: int
    timed_s: float           # its requests: the recorded run's pace, else DEFAULT_STREAM_TOK_S per request
    overhead_s: float        # around them: the client process, the sampler, reading the results back
    recorded: bool = True    # False: this host never ran this level at these lengths (timed_s is the default)

    @property
    def seconds(self) -> float:
        return self.timed_s + self.overhead_s


@dataclass(frozen=True)
class Estimate:
    starts: Between             # releases started: each candidate; a survivor, a re-run or the end switched to
    start_s: float
    start_samples: int          # 0: no start recorded on this host, start_s is DEFAULT_START_S
    runs: int                   # full benchmarks: the base's runs and each candidate's (search: halving: survivors')
    reruns: Between             # the top two again when they are within the noise of each other
    levels: tuple[LevelEstimate, ...] = ()  # one benchmark's levels
    overhead_samples: int = 0   # recorded benchmarks the per-level overhead came from; 0: the default
    short_runs: int = 0         # search: halving: the short round's benchmarks (their timed part ~short_fraction)
    short_fraction: float = 1.0

    @property
    def bench_s(self) -> float:
        """One full benchmark over the whole ladder."""
        return sum(level.seconds for level in self.levels)

    @property
    def short_s(self) -> float:
        return sum(level.timed_s * self.short_fraction + level.overhead_s for level in self.levels)

    def _total_s(self, starts: int, reruns: int) -> float:
        return starts * self.start_s + (self.runs + reruns) * self.bench_s + self.short_runs * self.short_s

    @property
    def fewest_s(self) -> float:
        return self._total_s(self.starts.fewest, self.reruns.fewest)

    @property
    def most_s(self) -> float:
        return self._total_s(self.starts.most, self.reruns.most)

    @property
    def defaults(self) -> bool:
        """Some figure is a default, not this host's record."""
        return self.start_samples == 0 or self.overhead_samples == 0 or not all(lv.recorded for lv in self.levels)


def recorded_start_s(history: Sequence[HistoryEntry]) -> tuple[float, int]:
    """The median start of this host's healthy starts (any profile), and how many there were: a start's downtime
    where it recorded one (what a candidate's switch costs, from the stop), else its time to ready."""
    durations = [e.timings.get(DOWNTIME) or e.timings["ready"] for e in history
                 if e.outcome == HEALTHY and e.timings.get("ready", 0) > 0]
    return (statistics.median(durations), len(durations)) if durations else (DEFAULT_START_S, 0)


def _level_durations(figures: Mapping[str, float]) -> list[float]:
    return [value for key, value in figures.items() if key.startswith("c") and key.endswith(".duration_s")]


def level_overhead_s(history: Sequence[HistoryEntry]) -> tuple[float, int]:
    """What a level costs beyond its timed requests: the median over this host's recorded benchmarks of their wall
    time less their levels' durations, per level; and how many there were."""
    overheads = [(entry.figures[WALL_KEY] - sum(durations)) / len(durations) for entry in history
                 if entry.event in ("bench", "tune") and WALL_KEY in entry.figures
                 and (durations := _level_durations(entry.figures))]
    return (max(0.0, statistics.median(overheads)), len(overheads)) if overheads else (DEFAULT_LEVEL_OVERHEAD_S, 0)


def level_estimate(history: Sequence[HistoryEntry], settings: BenchSettings, concurrency: int,
                   overhead_s: float) -> LevelEstimate:
    """This host's benchmarks of this level at the same lengths and API (any prompts count): the mean time a prompt
    took, times the prompts this level sends (at one concurrency a run lasts in proportion to its requests). The
    mean, not the newest run: a sweep's candidates differ in pace (a patch set can be ten times slower), and the
    next sweep's are like those recorded. None such: the requests in waves of the concurrency, each wave
    output_len tokens at DEFAULT_STREAM_TOK_S."""
    prompts = settings.prompts_at(concurrency)
    lengths = {key: value for key, value in settings.identity().items()
               if key in ("settings.input_len", "settings.output_len", "settings.openai_api")}
    duration, completed = f"c{concurrency}.duration_s", f"c{concurrency}.completed"
    per_prompt = [entry.figures[duration] / entry.figures[completed] for entry in history
                  if entry.event in ("bench", "tune") and all(entry.figures.get(k) == v for k, v in lengths.items())
                  and entry.figures.get(completed, 0) > 0 and duration in entry.figures]
    if per_prompt:
        return LevelEstimate(concurrency, prompts, round(statistics.mean(per_prompt) * prompts, 1), overhead_s)
    waves = -(-prompts // concurrency)
    return LevelEstimate(concurrency, prompts, round(waves * settings.output_len / DEFAULT_STREAM_TOK_S, 1),
                         overhead_s, recorded=False)


@dataclass(frozen=True)
class _Outcome:
    """One way the figures can fall: which candidates lead (halving: the first and last survivor to run in full),
    whether the top two re-run, which release serves at the end."""

    first: str
    last: str
    top: str
    second: str
    rerun: bool
    end: str


def _starts(order: Sequence[str], unchanged: Set[str], survivors: int | None, outcome: _Outcome) -> int:
    """The starts commands/tune.py performs for `outcome`, every candidate healthy: a deploy or switch starts a
    release unless it is the one serving (a candidate rendered as the serving release is a no-op)."""
    serving, starts = SERVING, 0

    def start(label: str) -> None:
        nonlocal serving, starts
        release = SERVING if label in unchanged else label
        starts, serving = starts + (release != serving), release

    for label in order:
        start(label)
    if survivors is not None:
        start(outcome.first)
        if survivors > 1:  # each survivor after the first follows another: always a switch
            starts, serving = starts + survivors - 1, SERVING if outcome.last in unchanged else outcome.last
    if outcome.rerun:
        start(outcome.top)
        start(outcome.second)
    start(outcome.end)
    return starts


def sweep_starts(order: Sequence[str], unchanged: Set[str], survivors: int | None, keep_winner: bool) -> Between:
    """The fewest and most starts over every way the figures can fall: the leaders, a re-run of the top two (when
    two or more run in full), the winner kept or the pre-sweep release (SERVING) serving again at the end."""
    if not order:
        return Between(0, 0)
    full = len(order) if survivors is None else survivors
    # the leaders matter only as the last to run, one rendered as the serving release, or another: a few of each
    roles = list(dict.fromkeys([order[-1], *(label for label in order if label in unchanged), *order[:4]]))
    pairs = [(a, b) for a in roles for b in roles if a != b] or [(order[0], order[0])]
    counts = []
    for top, second in pairs:
        for rerun in (False, True) if full > 1 else (False,):
            winners = (top, second) if rerun else (top,)
            for end in (*winners, SERVING) if keep_winner else (SERVING,):
                for first, last in pairs if survivors is not None else ((top, top),):
                    counts.append(_starts(order, unchanged, survivors, _Outcome(first, last, top, second, rerun,
                                                                                end)))
    return Between(min(counts), max(counts))


def estimate(history: Sequence[HistoryEntry], settings: BenchSettings, candidates: Sequence[str], base_runs: int,
             survivors: int | None = None, short: BenchSettings | None = None, keep_winner: bool = True,
             unchanged: Set[str] = frozenset()) -> Estimate:
    """`candidates`: their labels in the order they run; `unchanged`: those rendered as the serving release.
    `survivors` and `short` for search: halving: every candidate runs `short`, the survivors (each switched to
    again) the full benchmark."""
    start_s, samples = recorded_start_s(history)
    overhead_s, overheads = level_overhead_s(history)
    full = len(candidates) if survivors is None else survivors
    return Estimate(starts=sweep_starts(candidates, unchanged, survivors, keep_winner), start_s=start_s,
                    start_samples=samples,
                    runs=base_runs + full, reruns=Between(0, RERUNS if full > 1 else 0),
                    levels=tuple(level_estimate(history, settings, c, overhead_s) for c in settings.concurrency),
                    overhead_samples=overheads, short_runs=len(candidates) if survivors is not None else 0,
                    short_fraction=short.output_len / settings.output_len if short else 1.0)
