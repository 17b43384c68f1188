"""The simulator paces a generation by its throughput model (sandbox/sim/sglang_sim/server.py), on a virtual clock
here: how long a short answer takes is what the deploy's readiness figure pays for its one real generation."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sandbox" / "sim"))
from sglang_sim import server

TTFT_S = 0.1
TOK_S = 40.0  # one request alone


class FlatModel:
    """Every request gets TOK_S whatever the concurrency; the first token after TTFT_S."""

    def aggregate_tok_s(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        return TOK_S * concurrency

    def per_request_tok_s(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        return TOK_S

    def time_to_first_token_s(self, prompt_tokens: int) -> float:
        return TTFT_S


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize(("max_tokens", "tick_s"), [(4, server.BATCH_TICK_S), (4, server.STREAM_TICK_S),
                                                    (30, server.BATCH_TICK_S), (1, server.BATCH_TICK_S)])
def test_an_answer_takes_its_first_token_then_one_token_time_per_token_not_a_whole_tick(
        monkeypatch: pytest.MonkeyPatch, max_tokens: int, tick_s: float) -> None:
    clock = VirtualClock()
    monkeypatch.setattr(server, "time", SimpleNamespace(sleep=clock.sleep, monotonic=clock.monotonic))
    engine = server.Engine(model=FlatModel(), launch=server.Launch.from_args({"model_path": "m"}),
                           fused_on_sm120=False, scale=1.0, hang_generation=False, die_after=None,
                           on_fatal=lambda message: None)
    assert sum(engine.generate(prompt_tokens=5, max_tokens=max_tokens, tick_s=tick_s)) == max_tokens
    assert clock.now == pytest.approx(TTFT_S + (max_tokens - 1) / TOK_S)
