"""What the simulated server's `/metrics` reports about the requests it serves, as SGLang 0.5.23 does: the same
names, labels, default buckets and bucket flags, the same moments of observation.

SGLang 0.5.23, srt/observability/metrics_collector.py (TokenizerMetricsCollector from line 1822, the scheduler's
gauges from line 365) and srt/managers/tokenizer_manager.py `collect_metrics` (line 3219):
- TTFT is observed when the HTTP side gets a request's first output: a streamed request's first token, a
  non-streamed one's first chunk of SGLANG_FORCE_STREAM_INTERVAL (50) tokens or its whole answer
  (scheduler_components/output_streamer.py `accept`);
- each later output of n new tokens after `interval` seconds adds n observations of interval / n to the inter-token
  histogram and `interval` to its sum (`observe_inter_token_latency`);
- a finished request adds its prompt, generated and cached tokens, one request, its end-to-end latency and its
  prompt / uncached prompt / generation lengths; the token counters, request counter, TTFT and e2e carry
  `is_streaming`; cached tokens from the GPU radix cache carry `cache_source="device"`.
The simulator keeps a prefix cache of its own (pages of PAGE_TOKENS tokens, least recently used dropped beyond the
KV pool) so that cached tokens follow the prompts actually sent.

The defaults are deploy_lib/metrics/names.py's (which tests/test_metrics_names.py checks against the wheels);
tests/test_sim_metrics.py checks that the two agree. This package runs on a guest without deploy_lib, so they are
written out here.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
INTER_TOKEN_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                       0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
PROMPT_TOKENS_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
                         12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000,
                         200000, 300000, 400000, 600000, 800000, 1000000, 1100000)
FORCE_STREAM_INTERVAL = 50  # SGLANG_FORCE_STREAM_INTERVAL (srt/environ.py)
PAGE_TOKENS = 16


def bucket_rule(rule: Sequence[str] | None, defaults: Sequence[float]) -> tuple[float, ...]:
    """SGLang's generate_buckets (srt/observability/utils.py): default, `tse <middle> <base> <count>`, `custom ...`."""
    words = list(rule or ()) or ["default"]
    if words[0] == "tse":
        middle, base, count = float(words[1]), float(words[2]), int(words[3])
        bounds, distance = {middle}, 1.0
        for _ in range(math.ceil(count / 2)):
            distance *= base
            bounds.update((middle + distance, max(0.0, middle - distance)))
        return tuple(sorted(bounds))
    if words[0] == "custom":
        return tuple(sorted({float(word) for word in words[1:]}))
    return tuple(sorted({float(value) for value in defaults}))


def number(value: float) -> str:
    """A value as prometheus_client writes it (floatToGoString): 1.0, 0.25, +Inf."""
    return "+Inf" if math.isinf(value) else repr(float(value))


def label_text(labels: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in labels) + "}"


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1, adds: float | None = None) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += times
        self.total += value * times if adds is None else adds

    def lines(self, name: str, labels: tuple[tuple[str, str], ...]) -> list[str]:
        out, cumulative = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            out.append(f"{name}_bucket{label_text((*labels, ('le', number(bound))))} {number(cumulative)}")
        return [*out, f"{name}_sum{label_text(labels)} {number(self.total)}",
                f"{name}_count{label_text(labels)} {number(cumulative)}"]


class PrefixCache:
    """Prompt prefixes by pages of PAGE_TOKENS tokens, least recently used dropped beyond `capacity_tokens`: how many
    leading tokens of a prompt an earlier prompt already brought (at most all but the last, as SGLang's radix cache
    leaves one token to compute)."""

    def __init__(self, capacity_tokens: int) -> None:
        self.pages: OrderedDict[int, None] = OrderedDict()
        self.capacity = max(1, capacity_tokens // PAGE_TOKENS)

    def match_and_insert(self, tokens: Sequence[Any]) -> int:
        matched, prefix, missed = 0, 0, False
        for start in range(0, len(tokens) - len(tokens) % PAGE_TOKENS, PAGE_TOKENS):
            prefix = hash((prefix, tuple(tokens[start:start + PAGE_TOKENS])))
            if not missed and prefix in self.pages:
                matched += PAGE_TOKENS
                self.pages.move_to_end(prefix)
            else:
                missed = True
                self.pages[prefix] = None
                if len(self.pages) > self.capacity:
                    self.pages.popitem(last=False)
        return min(matched, max(0, len(tokens) - 1))


class Request:
    """One request's observations, in the order SGLang makes them (see the module's docstring)."""

    def __init__(self, served: ServedMetrics, prompt_tokens: int, cached_tokens: int, stream: bool,
                 arrived_s: float) -> None:
        self.served, self.prompt_tokens, self.cached_tokens = served, prompt_tokens, cached_tokens
        self.stream, self.arrived_s = stream, arrived_s
        self.sent_tokens, self.last_sent_s = 0, arrived_s
        self.made_tokens, self.last_made_s = 0, arrived_s

    def produced(self, total_tokens: int, at_s: float, finished: bool) -> None:
        """The engine has `total_tokens` out at `at_s`. SGLang sends a streamed request's tokens now; a non-streamed
        one's at each 50th token and at its end. The engine paces the tokens of one step evenly, so a 50th token
        inside a step was out at its share of the step's time."""
        if not self.stream:
            made, step_s = self.made_tokens, at_s - self.last_made_s
            for mark in range((made // FORCE_STREAM_INTERVAL + 1) * FORCE_STREAM_INTERVAL, total_tokens + 1,
                              FORCE_STREAM_INTERVAL):
                self._send(mark, self.last_made_s + step_s * (mark - made) / (total_tokens - made))
        if self.stream or finished:
            self._send(total_tokens, at_s)
        self.made_tokens, self.last_made_s = total_tokens, at_s

    def _send(self, total_tokens: int, at_s: float) -> None:
        if total_tokens == self.sent_tokens:
            return
        if self.sent_tokens == 0:
            self.served.first_output(at_s - self.arrived_s, self.stream)
        else:
            self.served.later_output(at_s - self.last_sent_s, total_tokens - self.sent_tokens)
        self.sent_tokens, self.last_sent_s = total_tokens, at_s

    def finished(self, at_s: float) -> None:
        self.served.finished(self.prompt_tokens, self.sent_tokens, self.cached_tokens, at_s - self.arrived_s,
                             self.stream)


class ServedMetrics:
    """The tokenizer collector's counters and histograms (one label set per `is_streaming`), and the prefix cache."""

    def __init__(self, model_name: str, server_args: dict[str, Any], max_total_num_tokens: int) -> None:
        self.lock = threading.Lock()
        self.labels = (("model_name", model_name), ("engine_type", "unified"))
        self.bounds = {
            "time_to_first_token_seconds": tuple(server_args.get("bucket_time_to_first_token") or TTFT_BUCKETS),
            "inter_token_latency_seconds": tuple(server_args.get("bucket_inter_token_latency") or INTER_TOKEN_BUCKETS),
            "e2e_request_latency_seconds": tuple(server_args.get("bucket_e2e_request_latency") or E2E_BUCKETS),
            "prompt_tokens_histogram": bucket_rule(server_args.get("prompt_tokens_buckets"), PROMPT_TOKENS_BUCKETS),
            "uncached_prompt_tokens_histogram": bucket_rule(server_args.get("prompt_tokens_buckets"),
                                                            PROMPT_TOKENS_BUCKETS),
            "generation_tokens_histogram": bucket_rule(server_args.get("generation_tokens_buckets"),
                                                       PROMPT_TOKENS_BUCKETS),
        }
        self.histograms: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram] = {}
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.cache = None if server_args.get("disable_radix_cache") else PrefixCache(max_total_num_tokens)

    def request(self, prompt: Sequence[Any], stream: bool, arrived_s: float) -> Request:
        """A request arrives with its prompt tokens (ids, or the text's 4-character pieces)."""
        with self.lock:
            cached = self.cache.match_and_insert(prompt) if self.cache is not None else 0
        return Request(self, len(prompt), cached, stream, arrived_s)

    def _streaming(self, stream: bool) -> tuple[tuple[str, str], ...]:
        return (*self.labels, ("is_streaming", "true" if stream else "false"))

    def _histogram(self, name: str, labels: tuple[tuple[str, str], ...]) -> Histogram:
        return self.histograms.setdefault((name, labels), Histogram(self.bounds[name]))

    def _count(self, name: str, labels: tuple[tuple[str, str], ...], value: float) -> None:
        self.counters[(name, labels)] = self.counters.get((name, labels), 0.0) + value

    def first_output(self, ttft_s: float, stream: bool) -> None:
        with self.lock:
            self._histogram("time_to_first_token_seconds", self._streaming(stream)).observe(ttft_s)

    def later_output(self, interval_s: float, new_tokens: int) -> None:
        with self.lock:
            self._histogram("inter_token_latency_seconds", self.labels).observe(
                interval_s / new_tokens, times=new_tokens, adds=interval_s)

    def finished(self, prompt: int, generated: int, cached: int, e2e_s: float, stream: bool) -> None:
        streaming = self._streaming(stream)
        with self.lock:
            self._count("prompt_tokens_total", streaming, prompt)
            self._count("generation_tokens_total", streaming, generated)
            self._count("num_requests_total", streaming, 1)
            if cached > 0:
                self._count("cached_tokens_total", (*self.labels, ("cache_source", "device")), cached)
            self._histogram("e2e_request_latency_seconds", streaming).observe(e2e_s)
            self._histogram("prompt_tokens_histogram", self.labels).observe(prompt)
            self._histogram("uncached_prompt_tokens_histogram", self.labels).observe(prompt - cached)
            self._histogram("generation_tokens_histogram", self.labels).observe(generated)

    def text(self, gauges: dict[str, float]) -> str:
        """The exposition: the scheduler's gauges (given), then the counters and histograms served so far."""
        scheduler = (*self.labels, ("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))
        lines = []
        for name, value in gauges.items():
            lines += [f"# HELP sglang:{name} {name} (simulated)", f"# TYPE sglang:{name} gauge",
                      f"sglang:{name}{label_text(scheduler)} {number(value)}"]
        with self.lock:
            for counter in sorted({name for name, _ in self.counters}):
                lines += [f"# HELP sglang:{counter} {counter} (simulated)", f"# TYPE sglang:{counter} counter"]
                lines += [f"sglang:{counter}{label_text(labels)} {number(value)}"
                          for (name, labels), value in sorted(self.counters.items()) if name == counter]
            for histogram in self.bounds:
                series = sorted(((labels, h) for (name, labels), h in self.histograms.items() if name == histogram),
                                key=lambda item: item[0])
                if series:
                    lines += [f"# HELP sglang:{histogram} {histogram} (simulated)",
                              f"# TYPE sglang:{histogram} histogram"]
                    for labels, h in series:
                        lines += h.lines(f"sglang:{histogram}", labels)
        return "\n".join(lines) + "\n"
