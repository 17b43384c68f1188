"""One scrape of `/metrics` as typed data: the Prometheus text exposition parsed by prometheus_client's own parser
(`prometheus_client.parser.text_string_to_metric_families`, the library SGLang itself writes it with), kept as
samples of the metrics in names.Metric, and read back as sums over series and histograms.

A scrape holds every series of a metric (one per label set: tp/dp ranks, `is_streaming`, `cache_source`); readers sum
them unless asked for one label's value. Series of other metrics are dropped when parsing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from deploy_lib.metrics.names import SPECS, Kind, Metric

if TYPE_CHECKING:
    from prometheus_client.samples import Sample as PrometheusSample


class ExpositionError(ValueError):
    """The text is not Prometheus text exposition."""


@dataclass(frozen=True)
class Sample:
    metric: Metric
    suffix: str                              # "" for a gauge or counter; "_bucket", "_sum" or "_count"
    labels: Mapping[str, str]                # without `le`
    value: float
    le: float | None = None                  # a bucket's upper bound (math.inf for `+Inf`)


@dataclass(frozen=True)
class Histogram:
    """A histogram summed over its series: cumulative counts per upper bound (the last is +Inf), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made between `earlier` and this scrape (both of one server: same bounds). A counter
        that went down means the server restarted in between; ValueError then."""
        if earlier.bounds != self.bounds:
            raise ValueError(f"bucket bounds differ between scrapes: {earlier.bounds} vs {self.bounds}")
        if self.count < earlier.count or any(a < b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)):
            raise ValueError("a histogram counter went down between scrapes (the server restarted)")
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)),
                         self.sum - earlier.sum, self.count - earlier.count)

    def quantile(self, q: float) -> float | None:
        """Prometheus' `histogram_quantile`: linear within the bucket holding rank q*count, the lowest bucket from
        0; a rank in the +Inf bucket gives the highest finite bound. None without observations."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile {q} is outside 0-1")
        if self.count <= 0 or not self.bounds:
            return None
        rank = q * self.cumulative[-1]
        index = next(i for i, below in enumerate(self.cumulative) if below >= rank)
        if math.isinf(self.bounds[index]):
            finite = [b for b in self.bounds if not math.isinf(b)]
            return finite[-1] if finite else None
        lower = self.bounds[index - 1] if index > 0 else 0.0
        below = self.cumulative[index - 1] if index > 0 else 0.0
        inside = self.cumulative[index] - below
        if inside <= 0:
            return self.bounds[index]
        return lower + (self.bounds[index] - lower) * (rank - below) / inside

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


@dataclass(frozen=True)
class Scrape:
    """The samples of one `/metrics` answer, with the time it was read (seconds, any monotonic origin)."""

    at_s: float
    samples: tuple[Sample, ...]
    _by_metric: Mapping[Metric, tuple[Sample, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grouped: dict[Metric, list[Sample]] = {}
        for sample in self.samples:
            grouped.setdefault(sample.metric, []).append(sample)
        object.__setattr__(self, "_by_metric", MappingProxyType({m: tuple(s) for m, s in grouped.items()}))

    def has(self, metric: Metric) -> bool:
        return metric in self._by_metric

    def total(self, metric: Metric, **labels: str) -> float | None:
        """A gauge's or counter's value summed over its series (those with the given label values); None when the
        server serves no such series."""
        if SPECS[metric].kind is Kind.HISTOGRAM:
            raise ValueError(f"{metric.full_name} is a histogram: use histogram()")
        found = [s.value for s in self._by_metric.get(metric, ()) if _matches(s, labels)]
        return math.fsum(found) if found else None

    def highest(self, metric: Metric) -> float | None:
        """A gauge's highest value over its series (token usage: the fullest rank's pool)."""
        found = [s.value for s in self._by_metric.get(metric, ())]
        return max(found) if found else None

    def histogram(self, metric: Metric, **labels: str) -> Histogram | None:
        """A histogram summed over its series (those with the given label values); None when none is served."""
        if SPECS[metric].kind is not Kind.HISTOGRAM:
            raise ValueError(f"{metric.full_name} is a {SPECS[metric].kind}, not a histogram")
        samples = [s for s in self._by_metric.get(metric, ()) if _matches(s, labels)]
        buckets: dict[float, float] = {}
        for s in samples:
            if s.suffix == "_bucket" and s.le is not None:
                buckets[s.le] = buckets.get(s.le, 0.0) + s.value
        if not buckets:
            return None
        bounds = tuple(sorted(buckets))
        return Histogram(bounds, tuple(buckets[b] for b in bounds),
                         math.fsum(s.value for s in samples if s.suffix == "_sum"),
                         math.fsum(s.value for s in samples if s.suffix == "_count"))


def _matches(sample: Sample, labels: Mapping[str, str]) -> bool:
    return all(sample.labels.get(key) == value for key, value in labels.items())


_BY_NAME = {metric.full_name: metric for metric in Metric}
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _sample(name: str, labels: Mapping[str, str], value: float) -> Sample | None:
    metric = _BY_NAME.get(name)
    if metric is not None and SPECS[metric].kind is not Kind.HISTOGRAM:
        return Sample(metric, "", MappingProxyType(dict(labels)), value)
    for suffix in _HISTOGRAM_SUFFIXES:
        metric = _BY_NAME.get(name.removesuffix(suffix)) if name.endswith(suffix) else None
        if metric is not None and SPECS[metric].kind is Kind.HISTOGRAM:
            rest = {k: v for k, v in labels.items() if k != "le"}
            le = float(labels["le"]) if suffix == "_bucket" else None  # float("+Inf") is inf
            return Sample(metric, suffix, MappingProxyType(rest), value, le)
    return None


def text_samples(text: str) -> Iterator[PrometheusSample]:
    """Every sample in Prometheus text exposition, by prometheus_client's parser; ExpositionError when it is not."""
    from prometheus_client.parser import text_string_to_metric_families  # 60 ms of imports: only where parsed

    try:
        for family in text_string_to_metric_families(text):
            yield from family.samples
    except (ValueError, KeyError, IndexError) as error:
        raise ExpositionError(f"not Prometheus text exposition: {error}") from error


def parse_scrape(text: str, at_s: float) -> Scrape:
    """The samples of the metrics the tool reads, from the text `/metrics` answered at `at_s`."""
    samples = [sample for raw in text_samples(text) if (sample := _sample(raw.name, raw.labels, raw.value)) is not None]
    return Scrape(at_s, tuple(samples))
