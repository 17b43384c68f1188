"""The watch's verdict (deploy_lib/metrics/watch.py) on recorded /metrics answers, and its profile settings.

tests/data/metrics/watch/ holds /metrics answers of the simulated server read before and after a window of traffic
(tests/helpers/record_watch_metrics.py says how they were made): `old` is the release before the switch; `same` a
new release as fast, `slow` one ten times slower, `quiet` one that saw 5 requests, `busy` one that saw four times
the traffic. Each recorded window is taken as WINDOW_S long (the times of the scrapes are the caller's to give).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from deploy_lib.metrics import WindowFigures, parse_scrape, window_figures
from deploy_lib.metrics.watch import WatchOutcome, judge_watch
from deploy_lib.profile import Profile
from deploy_lib.profile.settings import WatchSettings

RECORDED = Path(__file__).parent / "data" / "metrics" / "watch"
WINDOW_S = 60.0
DEFAULT = WatchSettings()


def window(name: str) -> WindowFigures:
    return window_figures(parse_scrape((RECORDED / f"{name}.start.prom").read_text(), at_s=1000.0),
                          parse_scrape((RECORDED / f"{name}.end.prom").read_text(), at_s=1000.0 + WINDOW_S))


def test_the_recordings_are_the_traffic_they_are_said_to_be() -> None:
    """Guards the verdict tests below: what each window served, counted (not timed)."""
    assert [window(name).requests for name in ("old", "same", "slow", "quiet", "busy")] == [60, 60, 60, 5, 240]
    old = window("old")
    assert old.prompt_tokens == 60 * 600 and old.generation_tokens == 60 * 8
    assert old.inter_token_s.count == 30 * 7  # 30 streamed answers of 8 tokens: 7 after the first each


def test_a_release_as_fast_is_kept() -> None:
    verdict = judge_watch(window("old"), window("same"), DEFAULT)
    assert verdict.outcome is WatchOutcome.NO_REGRESSION and not verdict.rolls_back
    assert all(check.passed for check in verdict.checks)
    assert verdict.message.startswith("no regression in live latency (p99 TTFT")


def test_a_release_ten_times_slower_is_rolled_back_with_both_figures() -> None:
    before, after = window("old"), window("slow")
    verdict = judge_watch(before, after, DEFAULT)
    assert verdict.outcome is WatchOutcome.REGRESSION and verdict.rolls_back
    assert [check.passed for check in verdict.checks] == [False, False]
    ttft = verdict.checks[0]
    assert ttft.before == before.ttft_s.p99 and ttft.after == after.ttft_s.p99
    assert ttft.ratio is not None and ttft.ratio > 5
    assert "p99 TTFT" in verdict.message and "beyond 1.5x" in verdict.message
    assert verdict.before == before and verdict.after == after


def test_the_bound_decides() -> None:
    """The same slow release within bounds set wide enough is kept: the verdict follows the profile, not a
    constant."""
    lenient = WatchSettings(max_ttft_p99_ratio=20, max_inter_token_p99_ratio=20)
    assert judge_watch(window("old"), window("slow"), lenient).outcome is WatchOutcome.NO_REGRESSION
    ttft_only = WatchSettings(max_ttft_p99_ratio=20, max_inter_token_p99_ratio=1.5)
    assert judge_watch(window("old"), window("slow"), ttft_only).outcome is WatchOutcome.REGRESSION


def test_too_little_traffic_keeps_the_release_and_says_so() -> None:
    verdict = judge_watch(window("old"), window("quiet"), DEFAULT)
    assert verdict.outcome is WatchOutcome.TOO_LITTLE_TRAFFIC and not verdict.rolls_back
    assert verdict.message == ("too little traffic to judge (60 requests in 60 s before, 5 in 60 s after; "
                               "at least 50 each): kept")
    # with min_requests 5 the window is enough to judge, and then its rate (5 vs 60 requests) is what differs
    assert judge_watch(window("old"), window("quiet"), WatchSettings(min_requests=5)).outcome is \
        WatchOutcome.LOAD_NOT_COMPARABLE


def test_too_little_traffic_is_said_before_a_slow_release_is_judged() -> None:
    assert judge_watch(window("quiet"), window("slow"), DEFAULT).outcome is WatchOutcome.TOO_LITTLE_TRAFFIC


def test_load_not_comparable_keeps_the_release_and_says_what_differs() -> None:
    verdict = judge_watch(window("old"), window("busy"), DEFAULT)
    assert verdict.outcome is WatchOutcome.LOAD_NOT_COMPARABLE and not verdict.rolls_back
    assert "request rate 1/s -> 4/s" in verdict.message
    assert judge_watch(window("old"), window("busy"), WatchSettings(max_load_ratio=5)).outcome is \
        WatchOutcome.NO_REGRESSION


def test_a_different_shape_at_the_same_rate_is_not_comparable() -> None:
    old = window("old")
    longer = window("same").model_copy(update={"prompt_tokens": old.prompt_tokens * 3})
    verdict = judge_watch(old, longer, DEFAULT)
    assert verdict.outcome is WatchOutcome.LOAD_NOT_COMPARABLE and "mean prompt 600 tokens -> 1.8e+03" in \
        verdict.message


def test_inter_token_latency_is_not_judged_without_observations() -> None:
    """Non-streamed answers shorter than 50 tokens give SGLang no inter-token observations: TTFT alone judges."""
    old, slow = window("old"), window("slow")
    empty = slow.inter_token_s.model_copy(update={"p50": None, "p90": None, "p99": None, "mean": None, "count": 0})
    verdict = judge_watch(old, slow.model_copy(update={"inter_token_s": empty}), DEFAULT)
    assert verdict.outcome is WatchOutcome.REGRESSION
    assert [check.passed for check in verdict.checks] == [False, None]
    assert "p99 inter-token latency: not judged" in verdict.message


def test_the_verdict_is_data_for_history_and_the_webhook() -> None:
    verdict = judge_watch(window("old"), window("slow"), DEFAULT)
    assert type(verdict).model_validate_json(verdict.model_dump_json()) == verdict


PROFILE = {"model": {"path": "m"}, "features": {"metrics": True}}


def test_the_watch_is_off_unless_the_profile_asks_and_needs_metrics() -> None:
    assert Profile.model_validate({"model": {"path": "m"}}).watch is None
    assert Profile.model_validate({**PROFILE, "watch": {"window_s": 120}}).watch == WatchSettings(window_s=120)
    with pytest.raises(ValidationError, match=r"features\.metrics: true"):
        Profile.model_validate({"model": {"path": "m"}, "watch": {}})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Profile.model_validate({**PROFILE, "watch": {"window": 120}})
    with pytest.raises(ValidationError):
        Profile.model_validate({**PROFILE, "watch": {"max_ttft_p99_ratio": 1.0}})  # a bound of 1x flags noise
