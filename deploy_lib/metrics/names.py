"""The SGLang metrics the tool reads from `/metrics` (`--enable-metrics`), their labels and their bucket rules, as
the released wheels define them.

Read in the 0.5.23 wheel (`srt/observability/metrics_collector.py`: SchedulerMetricsCollector.__init__ from line
334, TokenizerMetricsCollector.__init__ from line 1822, the tokenizer's labels in `tokenizer_metric_labels` line
1804, the bucket rules in `srt/observability/utils.py` `generate_buckets`) and in the 0.5.9 wheel
(`srt/metrics/collector.py`: SchedulerMetricsCollector line 291, TokenizerMetricsCollector line 1088, the bucket
rules in `srt/metrics/utils.py`). tests/data/metrics/sglang_metrics.yaml holds the same facts with file and line per
version; tests/test_metrics_names.py checks this module against that file, and that file against the wheels.

What differs between the two releases, and is modelled here:
- the prompt / generation length histograms exist in 0.5.9 only with `--collect-tokens-histogram` (from the 0.5.15
  wheel on: always served with --enable-metrics), and their default buckets differ;
- 0.5.23 adds the label `is_streaming` to the request, prompt and generation token counters, TTFT and end-to-end
  latency (present in the 0.5.20 wheel, absent in 0.5.15).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.versions import reached

PREFIX = "sglang:"

# The labels every series of a collector carries (more with priority scheduling, dp, or --extra-metric-labels).
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS_SINCE_0_5_15 = ("model_name", "engine_type")  # 0.5.23 tokenizer_metric_labels
TOKENIZER_LABELS_0_5_9 = ("model_name",)                        # 0.5.9 TokenizerManager.init_metric_collector_watchdog

# `--collect-tokens-histogram`: needed up to the 0.5.9 wheel; a DeprecatedAction in 0.5.15 (the histograms come with
# --enable-metrics alone), removed by 0.5.20. The renderer writes it where needed (versions.SPELLINGS["metrics"]).
TOKENS_HISTOGRAM_FLAG_UNTIL = "0.5.15"
# `is_streaming` on the tokenizer's request metrics: absent in the 0.5.15 wheel, present in 0.5.20
IS_STREAMING_SINCE = "0.5.20"


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Collector(enum.StrEnum):
    SCHEDULER = "scheduler"   # one series per logging rank (tp rank 0 of each dp / pp rank)
    TOKENIZER = "tokenizer"   # one series per label set (the HTTP side: every request once)


class Metric(enum.StrEnum):
    """The metrics the tool reads; the value is the name after `sglang:` (a counter's samples end in `_total`)."""

    RUNNING = "num_running_reqs"
    QUEUED = "num_queue_reqs"
    TOKEN_USAGE = "token_usage"
    GEN_THROUGHPUT = "gen_throughput"
    CACHE_HIT_RATE = "cache_hit_rate"
    PROMPT_TOKENS = "prompt_tokens_total"
    GENERATION_TOKENS = "generation_tokens_total"
    CACHED_TOKENS = "cached_tokens_total"
    REQUESTS = "num_requests_total"
    TTFT = "time_to_first_token_seconds"
    INTER_TOKEN = "inter_token_latency_seconds"
    E2E = "e2e_request_latency_seconds"
    PROMPT_LENGTH = "prompt_tokens_histogram"
    GENERATION_LENGTH = "generation_tokens_histogram"

    @property
    def full_name(self) -> str:
        return PREFIX + self.value


@dataclass(frozen=True)
class MetricSpec:
    metric: Metric
    kind: Kind
    collector: Collector
    extra_labels: tuple[str, ...] = ()       # beyond the collector's own labels
    streaming_label: bool = False            # gets `is_streaming` from IS_STREAMING_SINCE
    meaning: str = ""


SPECS: dict[Metric, MetricSpec] = {spec.metric: spec for spec in (
    MetricSpec(Metric.RUNNING, Kind.GAUGE, Collector.SCHEDULER, meaning="requests in the running batch"),
    MetricSpec(Metric.QUEUED, Kind.GAUGE, Collector.SCHEDULER, meaning="requests waiting for the batch"),
    MetricSpec(Metric.TOKEN_USAGE, Kind.GAUGE, Collector.SCHEDULER, meaning="share of the KV cache pool in use, 0-1"),
    MetricSpec(Metric.GEN_THROUGHPUT, Kind.GAUGE, Collector.SCHEDULER,
               meaning="decode tokens/s over the scheduler's last logging interval"),
    MetricSpec(Metric.CACHE_HIT_RATE, Kind.GAUGE, Collector.SCHEDULER,
               meaning="share of prefill tokens found in the prefix cache, last interval"),
    MetricSpec(Metric.PROMPT_TOKENS, Kind.COUNTER, Collector.TOKENIZER, streaming_label=True,
               meaning="prompt tokens of finished requests"),
    MetricSpec(Metric.GENERATION_TOKENS, Kind.COUNTER, Collector.TOKENIZER, streaming_label=True,
               meaning="generated tokens of finished requests"),
    MetricSpec(Metric.CACHED_TOKENS, Kind.COUNTER, Collector.TOKENIZER, extra_labels=("cache_source",),
               meaning="prompt tokens served from the prefix cache, by source (device/host/storage, or total)"),
    MetricSpec(Metric.REQUESTS, Kind.COUNTER, Collector.TOKENIZER, streaming_label=True,
               meaning="finished requests"),
    MetricSpec(Metric.TTFT, Kind.HISTOGRAM, Collector.TOKENIZER, streaming_label=True,
               meaning="arrival to first token, seconds"),
    MetricSpec(Metric.INTER_TOKEN, Kind.HISTOGRAM, Collector.TOKENIZER,
               meaning="seconds between output tokens; a chunk of n tokens counts n times its interval / n"),
    MetricSpec(Metric.E2E, Kind.HISTOGRAM, Collector.TOKENIZER, streaming_label=True,
               meaning="arrival to last token, seconds"),
    MetricSpec(Metric.PROMPT_LENGTH, Kind.HISTOGRAM, Collector.TOKENIZER, meaning="prompt tokens per request"),
    MetricSpec(Metric.GENERATION_LENGTH, Kind.HISTOGRAM, Collector.TOKENIZER,
               meaning="generated tokens per request"),
)}


def label_names(metric: Metric, sglang_version: str) -> tuple[str, ...]:
    """The labels a series of `metric` carries by default in that release (no priority, dp or extra labels)."""
    spec = SPECS[metric]
    base: tuple[str, ...]
    if spec.collector is Collector.SCHEDULER:
        base = SCHEDULER_LABELS
    else:
        base = TOKENIZER_LABELS_SINCE_0_5_15 if reached(sglang_version, "0.5.15") else TOKENIZER_LABELS_0_5_9
    streaming = ("is_streaming",) if spec.streaming_label and reached(sglang_version, IS_STREAMING_SINCE) else ()
    return (*base, *spec.extra_labels, *streaming)


def length_histograms_need_flag(sglang_version: str) -> bool:
    """Whether the release serves the prompt / generation length histograms only with `--collect-tokens-histogram`."""
    return not reached(sglang_version, TOKENS_HISTOGRAM_FLAG_UNTIL)


# Default upper bounds (the `+Inf` bucket is added by prometheus_client), as the collectors write them.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
INTER_TOKEN_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                       0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
PROMPT_TOKENS_BUCKETS_0_5_9 = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
                               12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000,
                               600000, 900000, 1100000)
PROMPT_TOKENS_BUCKETS_0_5_23 = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000,
                                10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000,
                                80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000)
# the release whose wheel first shows PROMPT_TOKENS_BUCKETS_0_5_23 among those read (0.5.9 and 0.5.23)
PROMPT_BUCKETS_CHANGED_BY = "0.5.23"


def default_buckets(metric: Metric, sglang_version: str) -> tuple[float, ...]:
    """The upper bounds `metric` gets in that release when no bucket flag is given (without `+Inf`)."""
    if metric is Metric.TTFT:
        return tuple(map(float, TTFT_BUCKETS))
    if metric is Metric.E2E:
        return tuple(map(float, E2E_BUCKETS))
    if metric is Metric.INTER_TOKEN:
        return tuple(map(float, INTER_TOKEN_BUCKETS))
    if metric in (Metric.PROMPT_LENGTH, Metric.GENERATION_LENGTH):  # generation uses the prompt's defaults too
        new = reached(sglang_version, PROMPT_BUCKETS_CHANGED_BY)
        return tuple(map(float, sorted(set(PROMPT_TOKENS_BUCKETS_0_5_23 if new else PROMPT_TOKENS_BUCKETS_0_5_9))))
    raise ValueError(f"{metric.full_name} is not a histogram")


class BucketRuleError(ValueError):
    """A `--prompt-tokens-buckets` / `--generation-tokens-buckets` value SGLang would refuse."""


def two_sides_exponential(middle: float, base: float, count: int) -> tuple[float, ...]:
    """SGLang's `two_sides_exponential_buckets`: middle, then middle +- base**i for i in 1..ceil(count/2), floored at
    0, sorted without repeats ('tse 1000 2 8' -> 984 992 996 998 1000 1002 1004 1008 1016)."""
    bounds = {middle}
    distance = 1.0
    for _ in range(math.ceil(count / 2)):
        distance *= base
        bounds.update((middle + distance, max(0.0, middle - distance)))
    return tuple(sorted(bounds))


def bucket_bounds(rule: Sequence[str], defaults: Sequence[float]) -> tuple[float, ...]:
    """The bounds a length histogram gets from its bucket rule (SGLang's `generate_buckets`, the same in 0.5.9 and
    0.5.23): empty or `default` -> the defaults; `tse <middle> <base> <count>`; `custom <v1> <v2> ...`."""
    words = list(rule) or ["default"]
    kind, args = words[0], words[1:]
    if kind == "default":
        return tuple(sorted(set(map(float, defaults))))
    if kind == "tse":
        if len(args) != 3:
            raise BucketRuleError(f"'tse' takes <middle> <base> <count>, got {' '.join(args)!r}")
        middle, base, count = float(args[0]), float(args[1]), int(args[2])
        if base <= 1.0:
            raise BucketRuleError(f"'tse' base must be greater than 1.0, got {base:g}")
        return two_sides_exponential(middle, base, count)
    if kind == "custom":
        if not args:
            raise BucketRuleError("'custom' takes at least one bound")
        return tuple(sorted({float(value) for value in args}))
    raise BucketRuleError(f"bucket rule {kind!r} is none of default, tse, custom")
