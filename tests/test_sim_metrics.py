"""The simulator's `/metrics` (sandbox/sim/sglang_sim/served.py, server.py): SGLang 0.5.23's names, labels, default
buckets and bucket flags, observing the requests it serves. The simulated server runs in this process on 127.0.0.1
(an ephemeral port) with a fast flat pacing model; requests go to it over loopback HTTP, and its answer is read with
deploy_lib's own parser (deploy_lib/metrics). Counts are asserted, never timings.
"""

from __future__ import annotations

import math
import urllib.error
from collections.abc import Iterator

import pytest
from helpers.sim_http import MODEL, FlatModel, SimClient, running_sim
from sglang_sim import served as sim_served

from deploy_lib.metrics import Metric, Scrape, parse_scrape
from deploy_lib.metrics.names import SPECS, Kind, default_buckets, label_names

VERSION = "0.5.23"


class Sim(SimClient):
    def scrape(self) -> tuple[str, Scrape]:
        text = self.metrics_text()
        return text, parse_scrape(text, at_s=0.0)


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> Iterator[Sim]:
    """The simulator with metrics on (or the launch arguments a test gives), fast: 5 ms to the first token, then
    4,000 tokens/s."""
    with running_sim({"enable_metrics": True, **getattr(request, "param", {})}, FlatModel()) as client:
        yield Sim(int(client.base.rsplit(":", 1)[1]))


SHARED = list(range(1000, 1256))  # a 256-token shared prefix (16 pages of 16)


def shaped_traffic(sim: Sim) -> None:
    """Six requests one after another: 320-token prompts (the shared prefix, then 64 tokens of their own), 4 output
    tokens; three streamed with /generate, three not; then one chat completion of 2,000 characters (500 tokens)."""
    for number in range(6):
        own = [number * 100 + i for i in range(64)]
        sim.post("/generate", {"input_ids": SHARED + own, "stream": number % 2 == 0,
                               "sampling_params": {"max_new_tokens": 4}})
    sim.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 60})


def test_the_metrics_are_sglangs_names_labels_and_default_buckets(sim: Sim) -> None:
    shaped_traffic(sim)
    text, scrape = sim.scrape()
    for metric in Metric:
        if metric is Metric.CACHE_HIT_RATE:
            continue  # the simulator keeps no per-interval hit rate
        assert scrape.has(metric), metric
        labelled = {tuple(sample.labels) for sample in scrape.samples if sample.metric is metric}
        assert labelled == {label_names(metric, VERSION)}, metric
        if SPECS[metric].kind is Kind.HISTOGRAM:
            histogram = scrape.histogram(metric)
            assert histogram is not None
            assert histogram.bounds == (*default_buckets(metric, VERSION), math.inf), metric
    assert "sglang:prompt_tokens_total{" in text  # a counter's samples end in _total, as prometheus_client's do


def test_the_metrics_count_the_requests_served(sim: Sim) -> None:
    shaped_traffic(sim)
    _, scrape = sim.scrape()
    assert scrape.total(Metric.REQUESTS) == 7
    assert scrape.total(Metric.REQUESTS, is_streaming="true") == 3
    assert scrape.total(Metric.PROMPT_TOKENS) == 6 * 320 + 500
    assert scrape.total(Metric.GENERATION_TOKENS) == 6 * 4 + 60
    # the first request brings the shared prefix; the five after it find its 256 tokens in the cache
    assert scrape.total(Metric.CACHED_TOKENS, cache_source="device") == 5 * 256
    prompt = scrape.histogram(Metric.PROMPT_LENGTH)
    assert prompt is not None and prompt.count == 7
    in_bucket = dict(zip(prompt.bounds, (b - a for a, b in zip((0.0, *prompt.cumulative), prompt.cumulative,
                                                               strict=False)), strict=True))
    assert in_bucket[500.0] == 7   # 320 and 500 tokens: all in (300, 500]
    generated = scrape.histogram(Metric.GENERATION_LENGTH)
    assert generated is not None and generated.cumulative[0] == 7 and generated.sum == 6 * 4 + 60
    for metric in (Metric.TTFT, Metric.E2E):
        observed = scrape.histogram(metric)
        assert observed is not None and observed.count == 7 and observed.sum > 0
    # inter-token: a streamed answer of 4 tokens sends its first, then 3 more (3 observations); a non-streamed one
    # sends once at its end (SGLang sends a non-streamed request every 50 tokens): 0 for 4 tokens, 1 chunk of 10
    # after the first 50 for the chat completion of 60
    inter_token = scrape.histogram(Metric.INTER_TOKEN)
    assert inter_token is not None and inter_token.count == 3 * 3 + 10
    assert (scrape.total(Metric.RUNNING), scrape.total(Metric.QUEUED)) == (0, 0)
    assert scrape.total(Metric.TOKEN_USAGE) == 0 and scrape.total(Metric.GEN_THROUGHPUT) is not None


@pytest.mark.parametrize("sim", [{"prompt_tokens_buckets": ["custom", "400", "100"],
                                  "generation_tokens_buckets": ["tse", "10", "2", "2"],
                                  "bucket_time_to_first_token": [0.5, 5.0],
                                  "disable_radix_cache": True}], indirect=True)
def test_the_bucket_flags_and_a_disabled_radix_cache_are_followed(sim: Sim) -> None:
    shaped_traffic(sim)
    _, scrape = sim.scrape()
    prompt, generated, ttft = (scrape.histogram(m) for m in (Metric.PROMPT_LENGTH, Metric.GENERATION_LENGTH,
                                                             Metric.TTFT))
    assert prompt is not None and prompt.bounds == (100.0, 400.0, math.inf)
    assert prompt.cumulative == (0, 6, 7)
    assert generated is not None and generated.bounds == (8.0, 10.0, 12.0, math.inf)
    assert ttft is not None and ttft.bounds == (0.5, 5.0, math.inf)
    assert scrape.total(Metric.CACHED_TOKENS) is None


@pytest.mark.parametrize("sim", [{"enable_metrics": False}], indirect=True)
def test_without_enable_metrics_there_is_no_metrics_page(sim: Sim) -> None:
    with pytest.raises(urllib.error.HTTPError) as answer:
        sim.scrape()
    assert answer.value.code == 404


def test_the_simulators_defaults_are_those_checked_against_the_wheel() -> None:
    assert tuple(map(float, sim_served.TTFT_BUCKETS)) == default_buckets(Metric.TTFT, VERSION)
    assert tuple(map(float, sim_served.E2E_BUCKETS)) == default_buckets(Metric.E2E, VERSION)
    assert tuple(map(float, sim_served.INTER_TOKEN_BUCKETS)) == default_buckets(Metric.INTER_TOKEN, VERSION)
    assert tuple(map(float, sim_served.PROMPT_TOKENS_BUCKETS)) == default_buckets(Metric.PROMPT_LENGTH, VERSION)


def test_the_prefix_cache_matches_whole_pages_leaves_one_token_and_forgets_the_oldest() -> None:
    cache = sim_served.PrefixCache(capacity_tokens=4 * sim_served.PAGE_TOKENS)
    first = list(range(40))                      # 2 whole pages and 8 tokens
    assert cache.match_and_insert(first) == 0
    assert cache.match_and_insert(first) == 32
    assert cache.match_and_insert(list(range(32))) == 31   # all of it cached: one token is still computed
    assert cache.match_and_insert([0] * 16 + list(range(16, 40))) == 0  # differs in the first page
    cache.match_and_insert(list(range(500, 564)))  # 4 new pages: the first prompt's pages are the oldest
    assert cache.match_and_insert(first) == 0


def test_a_non_streamed_request_is_observed_at_each_50th_token_and_its_end_as_sglang_sends_it() -> None:
    """Input tried: one token at 1.0 s, then 120 more in one engine step ending at 2.0 s (arrived at 0). SGLang's
    scheduler sends a non-streamed request's output at its 50th and 100th token and at its end: TTFT is the 50th
    token's time, then two more sends of 50 and 21 tokens."""
    metrics = sim_served.ServedMetrics(MODEL, {}, 100_000)
    request = metrics.request(list(range(10)), stream=False, arrived_s=0.0)
    request.produced(1, at_s=1.0, finished=False)
    request.produced(121, at_s=2.0, finished=True)
    request.finished(at_s=2.0)
    streaming = (*metrics.labels, ("is_streaming", "false"))
    ttft = metrics.histograms[("time_to_first_token_seconds", streaming)]
    inter_token = metrics.histograms[("inter_token_latency_seconds", metrics.labels)]
    assert ttft.total == pytest.approx(1.0 + 49 / 120)
    assert sum(inter_token.counts) == 71 and inter_token.total == pytest.approx(1.0 - 49 / 120)
    assert metrics.histograms[("e2e_request_latency_seconds", streaming)].total == 2.0


def test_a_streamed_request_is_observed_at_every_output() -> None:
    metrics = sim_served.ServedMetrics(MODEL, {}, 100_000)
    request = metrics.request(list(range(10)), stream=True, arrived_s=0.0)
    for total, at_s in ((1, 0.5), (9, 0.9), (16, 1.3)):
        request.produced(total, at_s=at_s, finished=total == 16)
    streaming = (*metrics.labels, ("is_streaming", "true"))
    assert metrics.histograms[("time_to_first_token_seconds", streaming)].total == 0.5
    inter_token = metrics.histograms[("inter_token_latency_seconds", metrics.labels)]
    assert sum(inter_token.counts) == 15 and inter_token.total == pytest.approx(0.8)
    assert inter_token.counts[inter_token.bounds.index(0.06)] == 15  # 0.4 s / 8 and 0.4 s / 7: both in (0.04, 0.06]
