"""Throughput gate: SGLang's own serving benchmark on the host, GPU telemetry while it runs, and the gate
(`invoke bench`, profile keys `bench:` and `gate:`; the tool's own timings are `make bench`, in bench/).

The benchmark is `python -m sglang.benchmark.serving` (`sglang.bench_serving` before 0.5.15; versions.BENCH_MODULES),
run by the release's venv python on the host against the local server, on the `random-ids` dataset (no download)
with the model's local tokenizer (HF_HUB_OFFLINE=1), one run per concurrency level, each writing one JSONL line that
is read back (the printed table is not parsed). An nvidia-smi sampler runs in the background for the whole
benchmark and is stopped by its PID.

    results     what a benchmark measured (levels, GPU telemetry) and the parsers of its JSONL and telemetry CSV
    gate        the verdict: every level's throughput and p99 TTFT against the baseline's (pure)
    history     figures in history.jsonl: the baseline, the newest benchmark of a release, comparisons

The benchmark run on the host (the gate after a deploy, `invoke bench`) is deploy_lib/host/benchmark.py.
"""

from deploy_lib.throughput.gate import evaluate_gate
from deploy_lib.throughput.history import (
    ComparisonRow,
    bench_history_entry,
    compare,
    compare_releases,
    comparison_records,
    find_baseline,
    power_by_release,
    throughput_by_release,
)
from deploy_lib.throughput.results import BenchResult, Latency, LevelResult, parse_level, parse_telemetry

__all__ = [
    "BenchResult", "ComparisonRow", "Latency", "LevelResult", "bench_history_entry", "compare", "compare_releases",
    "comparison_records", "evaluate_gate", "find_baseline", "parse_level", "parse_telemetry", "power_by_release",
    "throughput_by_release",
]
