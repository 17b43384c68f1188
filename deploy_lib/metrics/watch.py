"""The watch's verdict (issue 42): the old release's live traffic in a window before the switch against the new
release's in a window after it, by the profile's `watch:` bounds.

In this order:
1. too little traffic: either window finished fewer than `min_requests` requests, or has no TTFT percentile. The
   release is kept; the message says how many requests each window saw.
2. load not comparable: the request rates, or the mean prompt or output lengths per request, differ by more than
   `max_load_ratio` either way. Latency follows load, so a busier hour is no evidence against a release; it is
   kept. Load is judged by what was offered (rate and shape), not by requests in flight: a slower server has more in
   flight at the same rate (Little's law), which would hide the very regression looked for.
3. regression: p99 TTFT or p99 inter-token latency after exceeds its bound times the one before. Inter-token latency
   is judged only when both windows observed some (a window of non-streamed short answers has none).
4. otherwise no regression.
Throughput is reported, not judged: at the same offered rate a server generates what is asked of it.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict

from deploy_lib.metrics.window import WindowFigures
from deploy_lib.profile.settings import WatchSettings


class WatchOutcome(enum.StrEnum):
    REGRESSION = "regression"
    NO_REGRESSION = "no regression"
    TOO_LITTLE_TRAFFIC = "too little traffic"
    LOAD_NOT_COMPARABLE = "load not comparable"


class WatchCheck(BaseModel):
    """One figure before and after the switch against its bound (after / before at most `bound`); `passed` None when
    it could not be judged."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    before: float | None
    after: float | None
    ratio: float | None
    bound: float
    passed: bool | None

    def describe(self) -> str:
        if self.before is None or self.after is None or self.ratio is None:
            return f"{self.name}: not judged (no observations in {'both windows' if self.after is None else 'one'})"
        verdict = "within" if self.passed else "beyond"
        return (f"{self.name} {_figure(self.before)} -> {_figure(self.after)} ({self.ratio:.2f}x, {verdict} "
                f"{self.bound:g}x)")


class WatchVerdict(BaseModel):
    """The watch's decision with both windows' figures (for the diagnosis, history and the webhook)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    outcome: WatchOutcome
    before: WindowFigures
    after: WindowFigures
    checks: tuple[WatchCheck, ...]
    message: str

    @property
    def rolls_back(self) -> bool:
        return self.outcome is WatchOutcome.REGRESSION


def _figure(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def _ratio(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return after / before


def _check(name: str, before: float | None, after: float | None, bound: float) -> WatchCheck:
    ratio = _ratio(before, after)
    return WatchCheck(name=name, before=before, after=after, ratio=ratio, bound=bound,
                      passed=None if ratio is None else ratio <= bound)


def _load_differences(before: WindowFigures, after: WindowFigures, bound: float) -> list[str]:
    """What of the offered load differs by more than `bound` either way, described."""
    pairs = (("request rate", before.request_rate, after.request_rate, "/s"),
             ("mean prompt", before.prompt_tokens / before.requests, after.prompt_tokens / after.requests, " tokens"),
             ("mean output", before.generation_tokens / before.requests, after.generation_tokens / after.requests,
              " tokens"))
    found = []
    for name, old, new, unit in pairs:
        ratio = _ratio(old, new)
        if ratio is None or not 1 / bound <= ratio <= bound:
            found.append(f"{name} {old:.3g}{unit} -> {new:.3g}{unit}")
    return found


def judge_watch(before: WindowFigures, after: WindowFigures, settings: WatchSettings) -> WatchVerdict:
    """The verdict on a new release from the windows before and after its switch (see the module's docstring)."""
    checks = (_check("p99 TTFT", before.ttft_s.p99, after.ttft_s.p99, settings.max_ttft_p99_ratio),
              _check("p99 inter-token latency", before.inter_token_s.p99, after.inter_token_s.p99,
                     settings.max_inter_token_p99_ratio))

    def verdict(outcome: WatchOutcome, message: str) -> WatchVerdict:
        return WatchVerdict(outcome=outcome, before=before, after=after, checks=checks, message=message)

    seen = f"{before.requests:.0f} requests in {before.window_s:.0f} s before, {after.requests:.0f} in " \
           f"{after.window_s:.0f} s after"
    if min(before.requests, after.requests) < settings.min_requests or checks[0].ratio is None:
        return verdict(WatchOutcome.TOO_LITTLE_TRAFFIC,
                       f"too little traffic to judge ({seen}; at least {settings.min_requests} each): kept")
    differences = _load_differences(before, after, settings.max_load_ratio)
    if differences:
        return verdict(WatchOutcome.LOAD_NOT_COMPARABLE,
                       f"load not comparable ({'; '.join(differences)}: beyond {settings.max_load_ratio:g}x): kept")
    judged = "; ".join(check.describe() for check in checks)
    if any(check.passed is False for check in checks):
        return verdict(WatchOutcome.REGRESSION, f"live latency regressed ({judged}; {seen})")
    return verdict(WatchOutcome.NO_REGRESSION, f"no regression in live latency ({judged}; {seen})")
