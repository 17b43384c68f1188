"""A workload read from a live server (`workload`, issue 42): the shape of the traffic it served over a window, from
scrapes of its `/metrics`, as a typed file a benchmark can replay. Aggregates only: bucket counts, rates and shares;
no prompt text is ever read.

    prompt / output lengths   the deltas of sglang:prompt_tokens_histogram / generation_tokens_histogram per bucket
    cached share              cached / prompt tokens (the counters' deltas)
    request rate              finished requests / window seconds
    peak concurrency          the highest sum of num_running_reqs over the window's scrapes (every scrape, not two)

The file lives in the project as `inventory/workloads/<name>.yaml`, beside `inventory/profiles/`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.metrics.exposition import Histogram, Scrape
from deploy_lib.metrics.names import Metric
from deploy_lib.metrics.window import window_figures
from deploy_lib.profile.settings import BenchSettings

FORMAT = 1
WORKLOAD_SUFFIX = ".yaml"
MIN_REQUESTS = 20  # fewer finished requests in the window give no shape worth replaying


class Bucket(BaseModel):
    """Requests whose length fell in (the previous bucket's `upto`, `upto`]; `upto` null: above the last bound."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    upto: int | None
    requests: int = Field(ge=0)


class Lengths(BaseModel):
    """A distribution of token lengths per request: the histogram's buckets (counts, not cumulative) and its mean."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    mean: float = Field(ge=0)
    p50: float | None
    p90: float | None
    p99: float | None
    buckets: tuple[Bucket, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> Lengths:
        bounds = [b.upto for b in self.buckets]
        finite = [b for b in bounds if b is not None]
        if finite != sorted(set(finite)) or None in bounds[:-1]:
            raise ValueError("buckets must rise, each `upto` once, with only the last one null")
        return self

    @property
    def requests(self) -> int:
        return sum(b.requests for b in self.buckets)

    def highest_seen(self) -> int | None:
        """The upper bound of the highest bucket with requests (None: some were above every bound)."""
        seen = [b for b in self.buckets if b.requests > 0]
        return seen[-1].upto if seen else None


class Workload(BaseModel):
    """A recorded workload: what one release served over one window."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: int = Field(FORMAT, description="the file's format; this tool writes and reads 1")
    name: str
    release: str = Field(description="the release id it was read from")
    hosts: tuple[str, ...] = Field(min_length=1)
    sglang_version: str
    read_at: str = Field(description="when the window ended, ISO 8601 UTC")
    window_s: float = Field(gt=0)
    scrapes: int = Field(ge=2)
    requests: int = Field(ge=0)
    request_rate: float = Field(ge=0, description="finished requests per second over the window")
    peak_concurrency: int = Field(ge=0, description="the most requests running at one scrape")
    mean_concurrency: float | None = Field(ge=0, description="mean requests in flight (Little's law)")
    cached_share: float | None = Field(ge=0, le=1, description="cached / prompt tokens")
    prompt_length: Lengths
    output_length: Lengths

    def lines(self) -> tuple[str, ...]:
        """The workload in a few lines, as `workload` prints it."""
        def lengths(label: str, shape: Lengths) -> str:
            def n(value: float | None) -> str:
                return "?" if value is None else f"{value:.0f}"
            return f"{label}: mean {shape.mean:.0f} tokens, p50 {n(shape.p50)}, p90 {n(shape.p90)}, p99 {n(shape.p99)}"

        cached = "?" if self.cached_share is None else f"{self.cached_share:.0%}"
        return (f"workload {self.name}: release {self.release} (SGLang {self.sglang_version}) on "
                f"{', '.join(self.hosts)}, {self.window_s:.0f} s read at {self.read_at}",
                f"{self.requests} requests, {self.request_rate:.2f}/s, peak {self.peak_concurrency} running, "
                f"{cached} of prompt tokens cached",
                lengths("prompt", self.prompt_length), lengths("output", self.output_length))

    @model_validator(mode="after")
    def _known_format(self) -> Workload:
        if self.format != FORMAT:
            raise ValueError(f"format {self.format} is not one this tool reads ({FORMAT})")
        return self


def _lengths(histogram: Histogram | None, metric: Metric) -> Lengths:
    if histogram is None or histogram.count <= 0:
        raise PreflightError(f"{metric.full_name} saw no requests in the window",
                             "SGLang before 0.5.15 serves it only with --collect-tokens-histogram: deploy with "
                             "features.metrics on, which renders it")
    counts = [round(b - a) for a, b in zip((0.0, *histogram.cumulative), histogram.cumulative, strict=False)]
    buckets = tuple(Bucket(upto=None if math.isinf(bound) else round(bound), requests=count)
                    for bound, count in zip(histogram.bounds, counts, strict=True))
    if buckets[-1].upto is not None:
        buckets = (*buckets, Bucket(upto=None, requests=0))
    return Lengths(mean=histogram.sum / histogram.count, p50=histogram.quantile(0.5), p90=histogram.quantile(0.9),
                   p99=histogram.quantile(0.99), buckets=buckets)


def _delta(scrapes: Sequence[Scrape], metric: Metric) -> Histogram | None:
    end = scrapes[-1].histogram(metric)
    start = scrapes[0].histogram(metric)
    if end is None or start is None:
        return end
    try:
        return end.minus(start)
    except ValueError as restarted:
        raise PreflightError(f"no workload read: {restarted}", "read it again once the server runs") from restarted


def _summed(histograms: Sequence[Histogram | None]) -> Histogram | None:
    """The servers' histograms added (one service's replicas, the same bucket rules)."""
    present = [h for h in histograms if h is not None]
    if not present or len(present) < len(histograms):
        return None
    first = present[0]
    if any(h.bounds != first.bounds for h in present):
        raise PreflightError("the hosts' length histograms have different buckets: read them one host at a time")
    return Histogram(first.bounds, tuple(math.fsum(c) for c in zip(*(h.cumulative for h in present), strict=True)),
                     math.fsum(h.sum for h in present), math.fsum(h.count for h in present))


def workload_of(per_host: Sequence[Sequence[Scrape]], name: str, release: str, hosts: Sequence[str],
                sglang_version: str, read_at: str, min_requests: int = MIN_REQUESTS) -> Workload:
    """The workload the servers served between their first and last scrapes (each host's in time order, taken at
    the same moments; one host, or the replicas of one service, added). PreflightError with too little traffic, a
    restart in the window, or no length histograms: nothing to write then."""
    if not per_host or any(len(scrapes) < 2 for scrapes in per_host):
        raise PreflightError("a workload needs two scrapes of /metrics at least on each host")
    try:
        windows = [window_figures(scrapes[0], scrapes[-1]) for scrapes in per_host]
    except ValueError as unusable:
        raise PreflightError(f"no workload read: {unusable}", "read it again once the server runs") from unusable
    window_s = max(w.window_s for w in windows)
    requests = math.fsum(w.requests for w in windows)
    prompt = math.fsum(w.prompt_tokens for w in windows)
    cached = math.fsum(w.cached_tokens for w in windows)
    in_flight = [w.mean_in_flight for w in windows]
    if requests < min_requests:
        raise PreflightError(
            f"too little traffic to read a workload: {requests:.0f} requests finished in {window_s:.0f} s (at least "
            f"{min_requests}); nothing written", "read it over a longer --window, or at a busier hour")
    running = [math.fsum(scrape.total(Metric.RUNNING) or 0.0 for scrape in moment)
               for moment in zip(*per_host, strict=False)]
    return Workload(
        name=name, release=release, hosts=tuple(hosts), sglang_version=sglang_version, read_at=read_at,
        window_s=round(window_s, 3), scrapes=min(len(s) for s in per_host), requests=round(requests),
        request_rate=requests / window_s, peak_concurrency=round(max(running)),
        mean_concurrency=None if None in in_flight else math.fsum(f or 0.0 for f in in_flight),
        cached_share=cached / prompt if prompt > 0 else None,
        prompt_length=_lengths(_summed([_delta(s, Metric.PROMPT_LENGTH) for s in per_host]), Metric.PROMPT_LENGTH),
        output_length=_lengths(_summed([_delta(s, Metric.GENERATION_LENGTH) for s in per_host]),
                               Metric.GENERATION_LENGTH))


_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str, option: str) -> float:
    """`90`, `90s`, `10m`, `1h` in seconds; ConfigError naming the option otherwise."""
    given = text.strip().lower()
    number, unit = (given[:-1], given[-1]) if given[-1:] in _UNITS else (given, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{option} {text!r}: give a positive duration such as 90s, 10m or 1h")
    return seconds


def check_name(name: str, given_as: str = "workload name") -> str:
    """A workload's name: its file's stem under inventory/workloads/; a refusal names `given_as` (the option)."""
    if not name or "/" in name or name.startswith(".") or name.endswith(WORKLOAD_SUFFIX):
        raise ConfigError(f"{given_as} {name!r}: give a plain name such as `chat-peak` (it becomes "
                          f"inventory/workloads/<name>{WORKLOAD_SUFFIX})")
    return name


def replay_shape(workload: Workload) -> tuple[int, int, float]:
    """bench_serving's (--random-input-len, --random-output-len, --random-range-ratio) for a workload. Its random
    datasets draw each length uniformly from [ratio x len, len], one ratio for both, so the mean is len x (1 + ratio)
    / 2: the prompt's len is the recorded p99, the ratio the one that keeps the recorded mean prompt, and the output's
    len the one that keeps the recorded mean output at that ratio. The means and the prompts' high end are kept; the
    spread inside them is uniform, not the recorded one."""
    prompt_mean, output_mean = workload.prompt_length.mean, workload.output_length.mean
    high = max(workload.prompt_length.p99 or prompt_mean, prompt_mean, 1.0)
    ratio = min(1.0, max(0.0, 2 * prompt_mean / high - 1))
    return max(1, round(high)), max(1, round(2 * output_mean / (1 + ratio))), round(ratio, 3)


MIN_SHARED_SHARE = 0.05  # below this share of cached prompt tokens, the benchmark's prompts share no prefix


def shared_prefix(workload: Workload, input_len: int) -> int | None:
    """The tokens of input_len a group of requests shares (generated-shared-prefix), so that the recorded share of
    cached prompt tokens is cached again: None below MIN_SHARED_SHARE. One question token is always left."""
    share = workload.cached_share
    if share is None or share < MIN_SHARED_SHARE or input_len < 2:
        return None
    return min(input_len - 1, max(1, round(share * input_len)))


def bench_with_workload(settings: BenchSettings, workloads_dir: Path, source: str | None = None) -> BenchSettings:
    """The bench settings with a named workload's shape in input_len, output_len and range_ratio (unchanged without
    one); ConfigError naming the file when it cannot be read, and `source` (the file whose bench.workload names it)
    when there is none."""
    if settings.workload is None:
        return settings
    workload = read_workload(workload_path(workloads_dir, settings.workload),
                             f"{source}: bench.workload" if source else None)
    input_len, output_len, ratio = replay_shape(workload)
    return settings.model_copy(update={"input_len": input_len, "output_len": output_len, "range_ratio": ratio,
                                       "shared_prefix_len": shared_prefix(workload, input_len)})


def workload_path(workloads_dir: Path, given: str) -> Path:
    """A workload given by name (under the project's inventory/workloads/) or by path to its .yaml file."""
    if "/" in given or given.endswith(WORKLOAD_SUFFIX):
        return Path(given)
    return workloads_dir / f"{given}{WORKLOAD_SUFFIX}"


def workload_text(workload: Workload) -> str:
    import yaml
    header = (f"# workload {workload.name}: read from release {workload.release} over {workload.window_s:.0f} s "
              f"(sglang-deploy workload); aggregates only\n")
    return header + yaml.safe_dump(workload.model_dump(mode="json"), sort_keys=False, width=120)


def read_workloads(workloads_dir: Path) -> tuple[Workload, ...]:
    """Every recorded workload in the project (none when the folder is missing), by name; ConfigError naming the file
    and the key of one that is wrong."""
    return tuple(read_workload(path) for path in sorted(workloads_dir.glob(f"*{WORKLOAD_SUFFIX}")))


def recorded_names(workloads_dir: Path) -> tuple[str, ...]:
    """The names of the project's recorded workloads (their files' stems), without reading the files."""
    return tuple(sorted(path.stem for path in workloads_dir.glob(f"*{WORKLOAD_SUFFIX}")))


def read_workload(path: Path, named_by: str | None = None) -> Workload:
    """The workload file at `path`; ConfigError (exit 2) naming the file and the key when it is missing (and what
    named it) or wrong."""
    from deploy_lib.yaml_io import load_yaml_mapping
    if not path.exists():  # a directory or a device of that name is refused as such where it is read
        raise ConfigError((f"{named_by}: " if named_by else "") + f"workload file {path} does not exist",
                          "record one with `sglang-deploy workload --name NAME` against a serving release")
    data = load_yaml_mapping(path)  # ConfigError naming the file and line
    try:
        return Workload.model_validate(data)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ConfigError(f"workload file {path}: {key}: {first['msg']}",
                          f"{len(invalid.errors())} problem(s); record it again with `sglang-deploy workload`"
                          ) from invalid
