"""The sweep's decisions, pure: a run's score under the objective and the SLA, the noise of the base's repeated runs,
the winner (or a re-run of the top two when they are within the noise), which release the host serves next, and
what a resumed sweep still has to run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.throughput import BenchResult
from deploy_lib.tune.spec import Objective, Sla

# bench_serving against one server varies by a few percent from run to run even when the base's two runs agree:
# below this a difference is never taken for an improvement.
NOISE_FLOOR = 0.02


@dataclass(frozen=True)
class Score:
    value: float | None          # the objective's figure; None: the run has none (failed, or no level met the SLA)
    sla_met: bool
    misses: tuple[str, ...] = ()  # what missed the SLA, at which level

    @property
    def qualifies(self) -> bool:
        return self.value is not None and self.sla_met


def score(result: BenchResult | None, objective: Objective, level: int, sla: Sla) -> Score:
    """throughput: output tok/s at `level`, the SLA met there; goodput: the highest request rate over the levels
    whose p99 figures meet the SLA."""
    if result is None or not result.ok:
        return Score(None, False, (result.error or "no benchmark",) if result else ("no benchmark",))
    if objective is Objective.throughput:
        found = result.level(level)
        if found is None:
            return Score(None, False, (f"no figures at concurrency {level}",))
        misses = sla.misses(found)
        return Score(found.output_tok_s, not misses, tuple(f"at {level}: {miss}" for miss in misses))
    met = [run for run in result.levels if not sla.misses(run)]
    misses = tuple(f"at {run.concurrency}: {miss}" for run in result.levels for miss in sla.misses(run))
    if not met:
        return Score(None, False, misses)
    return Score(max(run.request_rate for run in met), True, misses)


def noise(values: Sequence[float]) -> float:
    """Relative spread of repeated runs of one release ((max - min) / mean), at least NOISE_FLOOR."""
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, (max(values) - min(values)) / statistics.fmean(values))


@dataclass(frozen=True)
class Standing:
    """One candidate as the decision sees it: its label, release and objective values (one per run)."""

    label: str
    release_id: str | None
    values: tuple[float, ...]         # runs that qualified (healthy, SLA met); empty: it does not compete

    @property
    def value(self) -> float:
        return statistics.fmean(self.values)


@dataclass(frozen=True)
class Decision:
    winner: Standing | None
    keep: bool                        # the winner stays serving; False: the pre-sweep release serves again
    rerun: tuple[Standing, ...]       # benchmark these once more, then decide again
    reason: str


def _ranked(standings: Sequence[Standing]) -> list[Standing]:
    return sorted((s for s in standings if s.values), key=lambda s: s.value, reverse=True)


def best_so_far(standings: Sequence[Standing]) -> Standing | None:
    ranked = _ranked(standings)
    return ranked[0] if ranked else None


def survivors(short: Sequence[Standing], count: int) -> list[Standing]:
    """search: halving: the `count` best short runs that qualified (healthy, SLA met), best first."""
    return sorted((s for s in short if s.values), key=lambda s: s.value, reverse=True)[:count]


def decide(base: float | None, standings: Sequence[Standing], base_noise: float, keep_winner: bool,
           unit: str, rerun: bool = True) -> Decision:
    """The winner by the objective; the top two re-run once when within the noise of each other (unless not
    `rerun`: a group's top two ran on different hosts, whose spread the noise already is); kept when it beats the
    pre-sweep release (`base`, None when it did not qualify) by more than the noise."""
    ranked = _ranked(standings)
    if not ranked:
        return Decision(None, False, (), "no candidate was healthy and met the SLA: the pre-sweep release serves")
    top = ranked[0]
    if rerun and len(ranked) > 1 and all(len(s.values) == 1 for s in ranked[:2]):
        second = ranked[1]
        if second.value > 0 and (top.value - second.value) / second.value <= base_noise:
            return Decision(None, False, (top, second),
                            f"{top.label} ({top.value:,.1f} {unit}) and {second.label} ({second.value:,.1f} {unit}) "
                            f"are within the noise ({base_noise:.1%}): each runs once more")
    if base is None or base <= 0:
        gain, beats = "the pre-sweep release did not meet the SLA", True
    else:
        ratio = top.value / base - 1
        gain, beats = f"{ratio:+.1%} over the pre-sweep release's {base:,.1f} {unit}", ratio > base_noise
    figures = f"{top.label}: {top.value:,.1f} {unit}, {gain} (noise {base_noise:.1%})"
    if not keep_winner:
        return Decision(top, False, (), f"winner {figures}; keep: none, so the pre-sweep release serves")
    if beats:
        return Decision(top, True, (), f"winner {figures}: kept")
    return Decision(top, False, (), f"winner {figures}: not beyond the noise, so the pre-sweep release serves")


def serve_next(serving: str | None, candidate_ok: bool, best: str | None, original: str) -> str | None:
    """The release to switch back to before the next candidate, or None to leave the host as it is: a candidate
    that was healthy and met the SLA may serve on; after any other the best healthy release so far serves (the
    pre-sweep one when none was)."""
    if candidate_ok:
        return None
    wanted = best or original
    return None if serving == wanted else wanted


def end_release(decision: Decision, original: str) -> str:
    """The release that serves when the sweep ends."""
    if decision.keep and decision.winner is not None and decision.winner.release_id:
        return decision.winner.release_id
    return original


def to_run(labels: Sequence[str], finished: Sequence[str]) -> list[str]:
    """A resumed sweep's candidates: those not finished before (their figures are in history), in grid order."""
    done = set(finished)
    return [label for label in labels if label not in done]
