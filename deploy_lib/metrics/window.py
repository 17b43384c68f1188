"""What a server served between two scrapes of its `/metrics`: latency percentiles from the histograms' deltas,
throughput and request rate from the counters' deltas, load, and the shape of the traffic.

Load is the mean number of requests in flight over the window, by Little's law from the end-to-end histogram: the
seconds its finished requests spent in the server divided by the window's seconds. Two scrapes cannot see the
running gauge between them; the sum of latencies can. The gauges of the later scrape are kept as they were read.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from deploy_lib.metrics.exposition import Histogram, Scrape
from deploy_lib.metrics.names import Metric


class Percentiles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    count: float

    @classmethod
    def of(cls, histogram: Histogram | None) -> Percentiles:
        if histogram is None:
            return cls(p50=None, p90=None, p99=None, mean=None, count=0)
        return cls(p50=histogram.quantile(0.5), p90=histogram.quantile(0.9), p99=histogram.quantile(0.99),
                   mean=histogram.mean, count=histogram.count)


class WindowFigures(BaseModel):
    """A server's served traffic over one window (seconds, tokens, requests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float
    requests: float                      # finished in the window
    request_rate: float                  # per second
    ttft_s: Percentiles
    inter_token_s: Percentiles
    e2e_s: Percentiles
    prompt_tokens: float
    generation_tokens: float
    cached_tokens: float
    generation_tok_s: float              # generated tokens per second of the window
    cached_share: float | None           # cached / prompt tokens
    mean_in_flight: float | None         # Little's law: e2e seconds served / window seconds
    prompt_length: Percentiles           # per request (an empty one where the release serves no length histogram)
    generation_length: Percentiles
    running: float | None                # the gauges at the window's end, summed over ranks
    queued: float | None
    token_usage: float | None            # the fullest rank's
    gen_throughput: float | None         # the scheduler's own last figure, tokens/s


def _counter_delta(before: Scrape, after: Scrape, metric: Metric) -> float:
    start, end = before.total(metric) or 0.0, after.total(metric) or 0.0
    if end < start:
        raise ValueError(f"{metric.full_name} went down between scrapes (the server restarted)")
    return end - start


def _histogram_delta(before: Scrape, after: Scrape, metric: Metric) -> Histogram | None:
    end = after.histogram(metric)
    if end is None:
        return None
    start = before.histogram(metric)
    return end if start is None else end.minus(start)


def window_figures(before: Scrape, after: Scrape) -> WindowFigures:
    """The figures of the traffic served between two scrapes of one server (`after` taken later). ValueError when
    they are not in order or a counter went down (the server restarted between them: no window to judge)."""
    window_s = after.at_s - before.at_s
    if window_s <= 0:
        raise ValueError(f"the second scrape is not later than the first ({before.at_s} -> {after.at_s})")
    requests = _counter_delta(before, after, Metric.REQUESTS)
    prompt = _counter_delta(before, after, Metric.PROMPT_TOKENS)
    generated = _counter_delta(before, after, Metric.GENERATION_TOKENS)
    cached = _counter_delta(before, after, Metric.CACHED_TOKENS)
    e2e = _histogram_delta(before, after, Metric.E2E)
    return WindowFigures(
        window_s=window_s, requests=requests, request_rate=requests / window_s,
        ttft_s=Percentiles.of(_histogram_delta(before, after, Metric.TTFT)),
        inter_token_s=Percentiles.of(_histogram_delta(before, after, Metric.INTER_TOKEN)),
        e2e_s=Percentiles.of(e2e),
        prompt_tokens=prompt, generation_tokens=generated, cached_tokens=cached,
        generation_tok_s=generated / window_s,
        cached_share=cached / prompt if prompt > 0 else None,
        mean_in_flight=e2e.sum / window_s if e2e is not None else None,
        prompt_length=Percentiles.of(_histogram_delta(before, after, Metric.PROMPT_LENGTH)),
        generation_length=Percentiles.of(_histogram_delta(before, after, Metric.GENERATION_LENGTH)),
        running=after.total(Metric.RUNNING), queued=after.total(Metric.QUEUED),
        token_usage=after.highest(Metric.TOKEN_USAGE), gen_throughput=after.total(Metric.GEN_THROUGHPUT))
