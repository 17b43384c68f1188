"""The gate's verdict: each concurrency level's throughput and p99 TTFT against the baseline's (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from deploy_lib.profile.settings import GateSettings
from deploy_lib.throughput.results import BenchResult, ratio


@dataclass(frozen=True)
class LevelCheck:
    concurrency: int
    new_tok_s: float
    baseline_tok_s: float
    throughput_ratio: float
    new_ttft_p99_ms: float | None
    baseline_ttft_p99_ms: float | None
    ttft_ratio: float | None
    passed: bool


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    message: str
    baseline_release: str | None = None
    checks: tuple[LevelCheck, ...] = ()


def evaluate_gate(new: BenchResult, baseline: BenchResult | None, gate: GateSettings) -> GateVerdict:
    """Pass, fail or record: a failed benchmark fails; no baseline passes and says so; else every level's ratios."""
    if not new.ok:
        return GateVerdict(False, f"release {new.release_id}: the benchmark failed, so the gate fails: {new.error}")
    if baseline is None:
        return GateVerdict(True, f"release {new.release_id}: no baseline at these settings ({new.settings.describe()})"
                                 f"; recorded {new.summary()} as the first figures and kept the release")
    checks = []
    for level in new.levels:
        old = baseline.level(level.concurrency)
        assert old is not None  # find_baseline only returns results with the same levels
        throughput = level.output_tok_s / old.output_tok_s if old.output_tok_s > 0 else math.inf
        ttft = ratio(level.ttft.p99_ms, old.ttft.p99_ms)
        passed = throughput >= gate.min_throughput_ratio and (ttft is None or ttft <= gate.max_ttft_p99_ratio)
        checks.append(LevelCheck(level.concurrency, level.output_tok_s, old.output_tok_s, throughput,
                                 level.ttft.p99_ms, old.ttft.p99_ms, ttft, passed))
    failed = [check for check in checks if not check.passed]
    shown = failed or checks

    def line(check: LevelCheck) -> str:
        text = (f"{check.new_tok_s:,.1f} tok/s at concurrency {check.concurrency} vs {check.baseline_tok_s:,.1f} "
                f"tok/s for release {baseline.release_id} ({check.throughput_ratio:.2f}x, minimum "
                f"{gate.min_throughput_ratio:.2f}x)")
        if check.ttft_ratio is not None:
            text += (f", p99 TTFT {check.new_ttft_p99_ms:,.0f} ms vs {check.baseline_ttft_p99_ms:,.0f} ms "
                     f"({check.ttft_ratio:.2f}x, maximum {gate.max_ttft_p99_ratio:.2f}x)")
        return text

    verdict = "below the gate" if failed else "within the gate"
    measured = f" on workload {new.settings.workload_name}" if new.settings.workload_name else ""
    message = f"release {new.release_id} is {verdict}{measured}: " + "; ".join(line(check) for check in shown)
    return GateVerdict(not failed, message, baseline.release_id, tuple(checks))
