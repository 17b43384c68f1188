"""Throughput model: aggregate output tokens/s as a function of concurrency (parameters: throughput.toml)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class ThroughputModel:
    peak_tok_s: float
    half_concurrency: float
    fusion_sm120_factor: float
    prefill_base_s: float
    prefill_tok_s: float
    loaded_idle_w: float
    full_load_w: float
    full_load_concurrency: int

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ThroughputModel:
        (c1, t1), (c2, t2) = ((a["concurrency"], a["output_tok_s"]) for a in params["reference"]["anchors"])
        # T(c) = peak*c/(c+half) through both anchors: t1*(c1+half)/c1 == t2*(c2+half)/c2
        half = (t2 - t1) / (t1 / c1 - t2 / c2)
        peak = t1 * (c1 + half) / c1
        fusion = params["fusion_sm120"]
        reference_there = peak * fusion["concurrency"] / (fusion["concurrency"] + half)
        return cls(
            peak_tok_s=peak,
            half_concurrency=half,
            fusion_sm120_factor=fusion["output_tok_s"] / reference_there,
            prefill_base_s=params["prefill"]["base_latency_s"],
            prefill_tok_s=params["prefill"]["tok_s"],
            loaded_idle_w=params["power"]["loaded_idle_w"],
            full_load_w=params["power"]["full_load_w"],
            full_load_concurrency=params["power"]["full_load_concurrency"],
        )

    @classmethod
    def default(cls) -> ThroughputModel:
        text = resources.files("sglang_sim").joinpath("throughput.toml").read_text()
        return cls.from_params(tomllib.loads(text))

    def aggregate_tok_s(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        if concurrency <= 0:
            return 0.0
        total = self.peak_tok_s * concurrency / (concurrency + self.half_concurrency)
        return total * self.fusion_sm120_factor if fused_on_sm120 else total

    def per_request_tok_s(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        return self.aggregate_tok_s(max(concurrency, 1), fused_on_sm120) / max(concurrency, 1)

    def time_to_first_token_s(self, prompt_tokens: int) -> float:
        return self.prefill_base_s + prompt_tokens / self.prefill_tok_s

    def load(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        """GPU load in [0, 1]: the throughput produced relative to full load on the reference profile (a fused
        release on SM120 waits on its allreduce: fewer tokens, less power)."""
        return min(1.0, self.aggregate_tok_s(concurrency, fused_on_sm120)
                   / self.aggregate_tok_s(self.full_load_concurrency))

    def power_w(self, concurrency: int, fused_on_sm120: bool = False) -> float:
        return self.loaded_idle_w + (self.full_load_w - self.loaded_idle_w) * self.load(concurrency, fused_on_sm120)
