"""Reading `/metrics`: a scrape parsed into typed samples, histogram quantiles, and the figures of the traffic served
between two scrapes (deploy_lib/metrics/exposition.py, window.py).

The exposition text is written by prometheus_client itself, with SGLang 0.5.23's names, labels and default buckets
(deploy_lib/metrics/names.py, checked against the wheel in test_metrics_names.py), so the parser reads what a server
writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from deploy_lib.metrics import ExpositionError, Metric, parse_scrape, window_figures
from deploy_lib.metrics.exposition import Histogram as Parsed
from deploy_lib.metrics.names import SPECS, Kind, default_buckets, label_names

VERSION = "0.5.23"
MODEL = "glm-5"


class FakeServer:
    """SGLang 0.5.23's tokenizer and scheduler collectors on a registry of their own (one rank)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics: dict[Metric, Counter | Gauge | Histogram] = {}
        for metric, spec in SPECS.items():
            labels = label_names(metric, VERSION)
            name = metric.full_name.removesuffix("_total")  # prometheus_client adds _total to a counter
            if spec.kind is Kind.HISTOGRAM:
                self.metrics[metric] = Histogram(name, metric.value, labels, registry=self.registry,
                                                 buckets=default_buckets(metric, VERSION))
            elif spec.kind is Kind.COUNTER:
                self.metrics[metric] = Counter(name, metric.value, labels, registry=self.registry)
            else:
                self.metrics[metric] = Gauge(name, metric.value, labels, registry=self.registry)

    def _labels(self, metric: Metric, streaming: bool, source: str = "device") -> dict[str, str]:
        values = {"model_name": MODEL, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0",
                  "is_streaming": "true" if streaming else "false", "cache_source": source}
        return {name: values[name] for name in label_names(metric, VERSION)}

    def finish(self, prompt: int, output: int, cached: int, ttft_s: float, itl_s: float,
               streaming: bool = True) -> None:
        """One finished request, as TokenizerMetricsCollector.observe_one_finished_request and the TTFT / ITL
        observers record it."""
        def labelled(metric: Metric) -> Counter | Gauge | Histogram:
            return self.metrics[metric].labels(**self._labels(metric, streaming))

        for metric, value in ((Metric.PROMPT_TOKENS, prompt), (Metric.GENERATION_TOKENS, output),
                              (Metric.REQUESTS, 1), (Metric.CACHED_TOKENS, cached)):
            if value:
                labelled(metric).inc(value)  # type: ignore[union-attr]
        labelled(Metric.TTFT).observe(ttft_s)  # type: ignore[union-attr]
        for _ in range(output - 1):
            labelled(Metric.INTER_TOKEN).observe(itl_s)  # type: ignore[union-attr]
        labelled(Metric.E2E).observe(ttft_s + (output - 1) * itl_s)  # type: ignore[union-attr]
        labelled(Metric.PROMPT_LENGTH).observe(prompt)  # type: ignore[union-attr]
        labelled(Metric.GENERATION_LENGTH).observe(output)  # type: ignore[union-attr]

    def gauges(self, running: int, queued: int, usage: float, tok_s: float) -> None:
        for metric, value in ((Metric.RUNNING, running), (Metric.QUEUED, queued), (Metric.TOKEN_USAGE, usage),
                              (Metric.GEN_THROUGHPUT, tok_s)):
            self.metrics[metric].labels(**self._labels(metric, True)).set(value)  # type: ignore[union-attr]

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def serve(server: FakeServer, requests: Iterable[tuple[int, int, int, float, float]]) -> None:
    for prompt, output, cached, ttft, itl in requests:
        server.finish(prompt, output, cached, ttft, itl)


def test_a_scrape_keeps_the_metrics_read_with_their_labels_and_drops_the_rest() -> None:
    server = FakeServer()
    server.finish(prompt=2000, output=10, cached=1500, ttft_s=0.5, itl_s=0.02, streaming=False)
    server.gauges(running=3, queued=1, usage=0.25, tok_s=120.0)
    text = server.text() + "# TYPE sglang:unrelated gauge\nsglang:unrelated 7\n"
    scrape = parse_scrape(text, at_s=10.0)
    assert scrape.total(Metric.PROMPT_TOKENS) == 2000
    assert scrape.total(Metric.PROMPT_TOKENS, is_streaming="false") == 2000
    assert scrape.total(Metric.PROMPT_TOKENS, is_streaming="true") is None
    assert scrape.total(Metric.CACHED_TOKENS, cache_source="device") == 1500
    assert scrape.total(Metric.RUNNING) == 3 and scrape.total(Metric.QUEUED) == 1
    assert scrape.highest(Metric.TOKEN_USAGE) == 0.25
    ttft = scrape.histogram(Metric.TTFT)
    assert ttft is not None and ttft.count == 1 and ttft.sum == 0.5
    assert ttft.bounds == (*default_buckets(Metric.TTFT, VERSION), math.inf)
    assert {s.metric for s in scrape.samples} <= set(Metric)


def test_a_server_without_metrics_gives_empty_readings_and_garbage_is_refused() -> None:
    empty = parse_scrape("", at_s=0.0)
    assert empty.total(Metric.RUNNING) is None and empty.histogram(Metric.TTFT) is None
    with pytest.raises(ExpositionError):
        parse_scrape('<html>{"detail": "Not Found"}</html>\nsglang:num_running_reqs{x="1" 3\n', at_s=0.0)


@pytest.mark.parametrize(("q", "expected"), [
    (0.5, 0.125),  # rank 5 of 10 is the first of the 4 in (0.1, 0.2]: a quarter of the way in
    (0.9, 0.3),    # rank 9 is the first of the 2 in (0.2, 0.4]: half way
    (1.0, 0.4),    # rank 10, the last: the bucket's upper bound
    (0.2, 0.05),   # in the lowest bucket, from 0
])
def test_quantile_interpolates_as_prometheus_histogram_quantile(q: float, expected: float) -> None:
    # cumulative 4, 8, 10, 10: 4 in (0, 0.1], 4 in (0.1, 0.2], 2 in (0.2, 0.4], none above
    histogram = Parsed(bounds=(0.1, 0.2, 0.4, math.inf), cumulative=(4, 8, 10, 10), sum=1.6, count=10)
    assert histogram.quantile(q) == pytest.approx(expected)


def test_quantile_in_the_inf_bucket_and_of_an_empty_histogram() -> None:
    overflow = Parsed(bounds=(0.1, math.inf), cumulative=(1, 10), sum=50, count=10)
    assert overflow.quantile(0.5) == 0.1
    assert Parsed(bounds=(0.1, math.inf), cumulative=(0, 0), sum=0, count=0).quantile(0.5) is None


def test_the_window_counts_only_what_was_served_between_the_scrapes() -> None:
    server = FakeServer()
    serve(server, [(100, 50, 0, 8.0, 0.5)] * 20)        # before the window: slow, short prompts
    before = parse_scrape(server.text(), at_s=100.0)
    # in the window: 30 requests of 2,000 prompt tokens (1,000 cached), 11 output tokens, TTFT 0.15 s, ITL 15 ms
    serve(server, [(2000, 11, 1000, 0.15, 0.015)] * 30)
    server.gauges(running=4, queued=0, usage=0.5, tok_s=99.0)
    after = parse_scrape(server.text(), at_s=160.0)
    figures = window_figures(before, after)
    assert figures.window_s == 60 and figures.requests == 30 and figures.request_rate == pytest.approx(0.5)
    assert (figures.prompt_tokens, figures.generation_tokens, figures.cached_tokens) == (60_000, 330, 30_000)
    assert figures.cached_share == pytest.approx(0.5)
    assert figures.generation_tok_s == pytest.approx(330 / 60)
    # all 30 in (0.1, 0.2]: the median interpolates to the middle; none of the 8 s ones before the window
    assert figures.ttft_s.p50 == pytest.approx(0.15) and figures.ttft_s.count == 30
    assert figures.ttft_s.p99 is not None and figures.ttft_s.p99 <= 0.2
    assert figures.inter_token_s.count == 300 and figures.inter_token_s.p50 is not None
    assert 0.010 < figures.inter_token_s.p50 <= 0.015
    e2e_each = 0.15 + 10 * 0.015
    assert figures.mean_in_flight == pytest.approx(30 * e2e_each / 60)
    assert figures.prompt_length.count == 30 and figures.prompt_length.p50 is not None
    assert 1500 < figures.prompt_length.p50 <= 2000          # the 1,500-2,000 bucket of 0.5.23's defaults
    assert (figures.running, figures.queued, figures.token_usage, figures.gen_throughput) == (4, 0, 0.5, 99.0)


def test_a_window_with_no_traffic_has_counts_of_zero_and_no_percentiles() -> None:
    server = FakeServer()
    serve(server, [(100, 5, 0, 0.2, 0.01)] * 3)
    scrape = parse_scrape(server.text(), at_s=0.0)
    figures = window_figures(scrape, parse_scrape(server.text(), at_s=30.0))
    assert figures.requests == 0 and figures.ttft_s.count == 0 and figures.ttft_s.p99 is None
    assert figures.cached_share is None and figures.mean_in_flight == 0


def test_a_restart_between_the_scrapes_or_scrapes_out_of_order_are_no_window() -> None:
    old = FakeServer()
    serve(old, [(100, 5, 0, 0.2, 0.01)] * 3)
    before = parse_scrape(old.text(), at_s=0.0)
    restarted = FakeServer()
    serve(restarted, [(100, 5, 0, 0.2, 0.01)])
    with pytest.raises(ValueError, match="restarted"):
        window_figures(before, parse_scrape(restarted.text(), at_s=30.0))
    with pytest.raises(ValueError, match="not later"):
        window_figures(before, parse_scrape(old.text(), at_s=0.0))


def test_series_of_several_ranks_are_summed() -> None:
    text = "\n".join([
        "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{model_name="m",dp_rank="0"} 3',
        'sglang:num_running_reqs{model_name="m",dp_rank="1"} 5',
        "# TYPE sglang:token_usage gauge",
        'sglang:token_usage{model_name="m",dp_rank="0"} 0.2',
        'sglang:token_usage{model_name="m",dp_rank="1"} 0.7',
        "# TYPE sglang:time_to_first_token_seconds histogram",
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="true",le="0.1"} 1',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="true",le="+Inf"} 2',
        'sglang:time_to_first_token_seconds_sum{model_name="m",is_streaming="true"} 1.05',
        'sglang:time_to_first_token_seconds_count{model_name="m",is_streaming="true"} 2',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="false",le="0.1"} 3',
        'sglang:time_to_first_token_seconds_bucket{model_name="m",is_streaming="false",le="+Inf"} 3',
        'sglang:time_to_first_token_seconds_sum{model_name="m",is_streaming="false"} 0.15',
        'sglang:time_to_first_token_seconds_count{model_name="m",is_streaming="false"} 3', ""])
    scrape = parse_scrape(text, at_s=0.0)
    assert scrape.total(Metric.RUNNING) == 8 and scrape.highest(Metric.TOKEN_USAGE) == 0.7
    both = scrape.histogram(Metric.TTFT)
    assert both == Parsed(bounds=(0.1, math.inf), cumulative=(4, 5), sum=pytest.approx(1.2), count=5)
    streamed = scrape.histogram(Metric.TTFT, is_streaming="true")
    assert streamed is not None and streamed.count == 2
