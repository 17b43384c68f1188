"""The report's served traffic (issue 42): what each release served live, beside its newest benchmark. From what
the tool recorded of live figures: the watch's two windows in each watched deploy's history line (the one before
the switch belongs to the release that served then), and the workload files read from a release on this host.
Pure: the caller reads the history and the files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deploy_lib.metrics.recorded import RecordedWindow, Side
from deploy_lib.metrics.workload import Workload
from deploy_lib.store import ACTIVATIONS, HEALTHY, HistoryEntry


@dataclass(frozen=True)
class BenchFigures:
    """A release's newest benchmark at its highest concurrency level."""

    concurrency: int
    output_tok_s: float
    ttft_p99_ms: float | None
    measured_on: str  # default, or workload NAME (BenchPoint.benchmark)


@dataclass(frozen=True)
class ServedRow:
    """One window of a release's live traffic, and the release's newest benchmark beside it (None: never
    benchmarked on this host). Latencies in ms; a figure the window did not observe is None."""

    when: str
    release: str
    source: str  # watch before the switch to R / watch after the switch / workload NAME
    window_s: float
    requests: float
    request_rate: float
    output_tok_s: float | None
    ttft_p99_ms: float | None
    inter_token_p99_ms: float | None
    bench_concurrency: int | None
    bench_output_tok_s: float | None
    bench_ttft_p99_ms: float | None
    bench_measured_on: str | None  # what that benchmark ran: default, or workload NAME


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _watched(history: Sequence[HistoryEntry]) -> Iterator[tuple[str, str, str, RecordedWindow]]:
    """(when, release, source, window) of every watch window in history, oldest first."""
    serving: str | None = None  # the release the last healthy activation left serving
    for entry in history:
        if entry.event == "deploy":
            before = RecordedWindow.from_figures(entry.figures, Side.BEFORE)
            after = RecordedWindow.from_figures(entry.figures, Side.AFTER)
            if before is not None and serving is not None:
                yield entry.when, serving, f"watch before the switch to {entry.tags.release}", before
            if after is not None:
                yield entry.when, entry.tags.release, "watch after the switch", after
        if entry.event in ACTIVATIONS and entry.outcome == HEALTHY:
            serving = entry.tags.release


def served_rows(history: Sequence[HistoryEntry], host: str, workloads: Sequence[Workload],
                benches: dict[str, BenchFigures]) -> tuple[ServedRow, ...]:
    """The watch's windows from history and the workloads read on `host`, by time, each beside its release's
    benchmark in `benches`."""
    def row(when: str, release: str, source: str, window_s: float, requests: float, rate: float,
            tok_s: float | None, ttft_s: float | None, inter_token_s: float | None) -> ServedRow:
        bench = benches.get(release)
        return ServedRow(when=when, release=release, source=source, window_s=round(window_s, 1), requests=requests,
                         request_rate=round(rate, 3), output_tok_s=None if tok_s is None else round(tok_s, 1),
                         ttft_p99_ms=_ms(ttft_s), inter_token_p99_ms=_ms(inter_token_s),
                         bench_concurrency=bench.concurrency if bench else None,
                         bench_output_tok_s=bench.output_tok_s if bench else None,
                         bench_ttft_p99_ms=bench.ttft_p99_ms if bench else None,
                         bench_measured_on=bench.measured_on if bench else None)

    rows = [row(when, release, source, w.window_s, w.requests, w.request_rate, w.generation_tok_s, w.ttft_p99_s,
                w.inter_token_p99_s) for when, release, source, w in _watched(history)]
    rows += [row(w.read_at, w.release, f"workload {w.name}", w.window_s, w.requests, w.request_rate,
                 w.output_length.mean * w.requests / w.window_s, None, None)
             for w in workloads if host in w.hosts]
    return tuple(sorted(rows, key=lambda r: r.when))
