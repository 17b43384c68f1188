"""The report's charts, drawn by matplotlib (Agg, SVG text): each returns one inline <svg> element, or None when
its table is empty. Every plotted series carries an SVG id starting `series-` (matplotlib's gid), so a browser
test can count what was drawn. matplotlib is imported here only: no other command pays for it."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from deploy_lib.health.startup import PHASE_LABELS, PHASES
from deploy_lib.report.data import BenchPoint, DowntimeRow, GpuReading, HistoryEvent, StartRow
from deploy_lib.report.served import ServedRow
from deploy_lib.report.sweep import SweepCandidate, SweepGpu, SweepLevel

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FAILED_COLOR = "#c62828"
LIMIT_COLOR = "#444444"
WIDTH_IN = 10.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "sglang-deploy-report"  # the same history draws the same bytes
    matplotlib.rcParams["svg.fonttype"] = "path"  # glyphs as paths: the page needs no font
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def _figure(rows: int, height_in: float) -> Iterator[tuple[Figure, Any]]:
    plt = _pyplot()
    figure, axes = plt.subplots(rows, 1, figsize=(WIDTH_IN, height_in), squeeze=False, layout="constrained")
    try:
        yield figure, [row[0] for row in axes]
    finally:
        plt.close(figure)


def _svg(figure: Figure) -> str:
    out = io.StringIO()
    figure.savefig(out, format="svg")
    text = out.getvalue()
    return text[text.index("<svg"):]  # inline: no XML declaration or DOCTYPE inside the HTML


def _tag_bars(bars: Any, gid: str) -> None:
    """A bar chart's series: each bar its own id (`gid-N`), as matplotlib writes one group per patch."""
    for number, bar in enumerate(bars):
        bar.set_gid(f"{gid}-{number}")


def _when(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def throughput_over_time(points: Sequence[BenchPoint], marks: Sequence[HistoryEvent]) -> str | None:
    """Output tok/s and p99 TTFT of each benchmark, one line per concurrency and benchmark (figures of different
    workloads are not joined); failed benchmarks as red crosses, failed releases and rollbacks as numbered vertical
    lines (their causes are listed under the chart)."""
    if not points:
        return None
    benchmarks = sorted({p.benchmark for p in points}, key=lambda b: (b != "default", b))
    series = [(benchmark, concurrency) for benchmark in benchmarks
              for concurrency in sorted({p.concurrency for p in points if p.benchmark == benchmark})]
    with _figure(2, 6.0) as (figure, (tok_s, ttft)):
        for benchmark, concurrency in series:
            level = [p for p in points if p.concurrency == concurrency and p.benchmark == benchmark]
            on = "" if benchmark == "default" else f", {benchmark}"
            for axes, value, name in ((tok_s, lambda p: p.output_tok_s, "tok_s"),
                                      (ttft, lambda p: p.ttft_p99_ms, "ttft")):
                shown = [p for p in level if value(p) is not None]
                line, = axes.plot([_when(p.when) for p in shown], [value(p) for p in shown], marker="o",
                                  label=f"concurrency {concurrency}{on}")
                line.set_gid(f"series-{name}-c{concurrency}" + (f"-w{benchmarks.index(benchmark)}" if on else ""))
                failed = [p for p in shown if p.outcome == "failed"]
                if failed:
                    axes.scatter([_when(p.when) for p in failed], [value(p) for p in failed], marker="x", s=80,
                                 color=FAILED_COLOR, zorder=3, label="failed (gate or run)" if
                                 (benchmark, concurrency) == series[0] else None).set_gid(f"series-{name}-failed")
        for number, mark in enumerate(marks, 1):
            for axes in (tok_s, ttft):
                axes.axvline(_when(mark.when), color=FAILED_COLOR if mark.outcome == "failed" else LIMIT_COLOR,
                             linestyle="--", linewidth=0.8)
            tok_s.annotate(str(number), (_when(mark.when), 1.0), xycoords=("data", "axes fraction"),
                           ha="center", va="bottom", color=FAILED_COLOR if mark.outcome == "failed" else LIMIT_COLOR)
        tok_s.set_ylabel("output tok/s")
        ttft.set_ylabel("p99 TTFT (ms)")
        tok_s.set_ylim(bottom=0)
        ttft.set_ylim(bottom=0)
        tok_s.legend(loc="lower left", fontsize="small")
        figure.autofmt_xdate()
        return _svg(figure)


def served_beside_benchmark(rows: Sequence[ServedRow]) -> str | None:
    """Per release: p99 TTFT (top) and output tok/s (bottom) of each live window (dots: the watch's windows,
    diamonds: a recorded workload's, which has no latency) beside its newest benchmark (a bar)."""
    if not rows:
        return None
    releases = list(dict.fromkeys(r.release for r in rows))
    measured_on = {r.release: r.bench_measured_on for r in rows if r.bench_measured_on is not None}
    with _figure(2, 5.0) as (figure, (ttft, tok_s)):
        for axes, live, bench, name in ((ttft, lambda r: r.ttft_p99_ms, lambda r: r.bench_ttft_p99_ms, "ttft"),
                                        (tok_s, lambda r: r.output_tok_s, lambda r: r.bench_output_tok_s, "tok_s")):
            benched = {r.release: bench(r) for r in rows if bench(r) is not None}
            _tag_bars(axes.bar([releases.index(release) for release in benched], list(benched.values()), width=0.5,
                               color="#cfd8dc", label="newest benchmark (highest concurrency)"),
                      f"series-served-{name}-bench")
            for marker, kind in (("o", "watch"), ("D", "workload")):
                shown = [r for r in rows if r.source.startswith(kind) and live(r) is not None]
                if shown:
                    axes.scatter([releases.index(r.release) for r in shown], [live(r) for r in shown], marker=marker,
                                 zorder=3, label=f"served ({kind})").set_gid(f"series-served-{name}-{kind}")
            axes.set_xticks(range(len(releases)), [f"{release}\n(benchmark: {measured_on[release]})"
                                                   if release in measured_on else release for release in releases])
            axes.set_xlim(-0.5, len(releases) - 0.5)
            axes.set_ylim(bottom=0)
            axes.legend(fontsize="small")  # each panel its own: a workload has a point below, none above
        ttft.set_ylabel("p99 TTFT (ms)")
        tok_s.set_ylabel("output tok/s")
        return _svg(figure)


def _lines_vs_concurrency(lines: Sequence[tuple[str, str, Sequence[tuple[int, float]], dict[str, Any]]]) -> str:
    """One line per (label, series id, points of concurrency and output tok/s, matplotlib style)."""
    with _figure(1, 4.0) as (figure, (axes,)):
        for label, gid, points, style in lines:
            shown = sorted(points)
            line, = axes.plot([c for c, _ in shown], [v for _, v in shown], marker="o", label=label, **style)
            line.set_gid(gid)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel("output tok/s")
        axes.set_ylim(bottom=0)
        axes.legend(fontsize="small")
        return _svg(figure)


def throughput_vs_concurrency(points: Sequence[BenchPoint]) -> str | None:
    """One line per release: its newest benchmark's output tok/s at each concurrency level, labelled with the
    workload it was measured on where it is not the default benchmark."""
    if not points:
        return None
    releases = {p.release: p for p in points}

    def label(point: BenchPoint) -> str:
        return f"{point.release} ({point.profile}{'' if point.benchmark == 'default' else f', {point.benchmark}'})"

    return _lines_vs_concurrency([
        (label(point), f"series-concurrency-{release}",
         [(p.concurrency, p.output_tok_s) for p in points if p.release == release], {})
        for release, point in releases.items()])


def sweep_vs_concurrency(levels: Sequence[SweepLevel], candidates: Sequence[SweepCandidate]) -> str | None:
    """One line per candidate measured (the pre-sweep release dashed grey, the winner thick)."""
    drawn = [c for c in candidates if any(level.number == c.number for level in levels)]
    if not drawn:
        return None

    def style(candidate: SweepCandidate) -> dict[str, Any]:
        if candidate.number == 0:
            return {"color": LIMIT_COLOR, "linestyle": "--"}
        return {"linewidth": 3.0} if candidate.winner else {}

    return _lines_vs_concurrency([
        (f"{c.number}: {c.candidate}{' (winner)' if c.winner else ''}", f"series-tune-concurrency-{c.number}",
         [(lv.concurrency, lv.output_tok_s) for lv in levels if lv.number == c.number], style(c)) for c in drawn])


class _Power(Protocol):
    """A GPU's figures during one run (GpuReading, SweepGpu)."""

    @property
    def gpu(self) -> int: ...
    @property
    def power_mean_w(self) -> float | None: ...
    @property
    def power_peak_w(self) -> float | None: ...
    @property
    def power_limit_w(self) -> float | None: ...
    @property
    def util_mean_pct(self) -> float | None: ...


def _power_bars(runs: Sequence[tuple[str, Sequence[_Power]]], prefix: str) -> str:
    """Per run (its tick label, its GPUs' figures): each GPU's mean power (bar) and peak (tick) against the power
    limit (dashed), and its mean utilisation below; series ids `series-PREFIXpower-gpuN`, `series-PREFIXutil-gpuN`."""
    readings = [r for _, shown in runs for r in shown]
    gpus = sorted({r.gpu for r in readings})
    width = 0.8 / len(gpus)
    with _figure(2, 6.0) as (figure, (power, util)):
        for slot, gpu in enumerate(gpus):
            placed = [(i + (slot - (len(gpus) - 1) / 2) * width, r) for i, (_, of_run) in enumerate(runs)
                      for r in of_run if r.gpu == gpu]
            xs, shown = [x for x, _ in placed], [r for _, r in placed]
            _tag_bars(power.bar(xs, [r.power_mean_w or 0 for r in shown], width, label=f"GPU {gpu}"),
                      f"series-{prefix}power-gpu{gpu}")
            peaks = [(x, r.power_peak_w) for x, r in placed if r.power_peak_w is not None]
            if peaks:
                power.scatter(*zip(*peaks, strict=True), marker="_", s=120, color="black", zorder=3)
            _tag_bars(util.bar(xs, [r.util_mean_pct or 0 for r in shown], width), f"series-{prefix}util-gpu{gpu}")
        for i, (_, of_run) in enumerate(runs):
            limits = [r.power_limit_w for r in of_run if r.power_limit_w]
            if limits:
                power.hlines(max(limits), i - 0.45, i + 0.45, colors=LIMIT_COLOR, linestyles="--",
                             label="power limit" if i == 0 else None)
        for axes in (power, util):
            axes.set_xticks(range(len(runs)), [label for label, _ in runs], fontsize="small")
        top = max((r.power_limit_w or r.power_peak_w or r.power_mean_w or 0 for r in readings), default=0)
        power.set_ylim(0, top * 1.3 or None)  # room above the limit for the legend
        power.set_ylabel("power (W): mean, peak")
        util.set_ylabel("utilisation % (mean)")
        util.set_ylim(0, 100)
        power.legend(fontsize="small", ncols=min(len(gpus) + 1, 5), loc="upper left")
        return _svg(figure)


def gpu_power(readings: Sequence[GpuReading]) -> str | None:
    """Per benchmark (release and time), each GPU's power against its limit and its utilisation."""
    if not readings:
        return None
    runs = list(dict.fromkeys((r.when, r.release) for r in readings))
    return _power_bars([(f"{release}\n{when[5:16].replace('T', ' ')}",
                         [r for r in readings if (r.when, r.release) == (when, release)]) for when, release in runs],
                       "")


def sweep_power(gpus: Sequence[SweepGpu], candidates: Sequence[SweepCandidate]) -> str | None:
    """Per candidate measured (numbered as in the table), each GPU's power against its limit and its utilisation."""
    runs = [(f"{c.number}{' (winner)' if c.winner else ''}" if c.number else "base",
             [g for g in gpus if g.number == c.number]) for c in candidates]
    runs = [(label, shown) for label, shown in runs if shown]
    return _power_bars(runs, "tune-") if runs else None


def start_phases(starts: Sequence[StartRow]) -> str | None:
    """One horizontal bar per start, its known phases stacked in order; an unknown phase is left out of the bar (the
    table under the chart says "unknown")."""
    known = [row for row in starts if any(v is not None for v in row.phases().values())]
    if not known:
        return None
    with _figure(1, 1.2 + 0.45 * len(known)) as (figure, (axes,)):
        left = [0.0] * len(known)
        for name in PHASES:
            seconds = [row.phases()[name] or 0.0 for row in known]
            _tag_bars(axes.barh(range(len(known)), seconds, left=left, label=PHASE_LABELS[name]),
                      f"series-phase-{name}")
            left = [a + b for a, b in zip(left, seconds, strict=True)]
        axes.set_yticks(range(len(known)), [f"{row.release} {row.event} {row.when[5:16].replace('T', ' ')}"
                                            for row in known], fontsize="small")
        axes.invert_yaxis()
        axes.set_xlabel("seconds from the restart")
        axes.legend(fontsize="small", ncols=len(PHASES), loc="lower right")
        return _svg(figure)


TOOL_COLOR = "#ef6c00"


def switch_downtime(rows: Sequence[DowntimeRow]) -> str | None:
    """A panel per release switched to, one horizontal bar per switch: the new server's own start, then the tool's
    part, on one time axis for every panel; series ids `series-downtime-server-RELEASE`, `...-tool-RELEASE`."""
    if not rows:
        return None
    releases = list(dict.fromkeys(row.release for row in rows))
    longest = max(row.downtime_s for row in rows)
    counts = [sum(row.release == release for row in rows) for release in releases]
    with _figure(len(releases), 0.9 * len(releases) + 0.35 * sum(counts)) as (figure, panels):
        for release, axes in zip(releases, panels, strict=True):
            mine = [row for row in rows if row.release == release]
            server = [row.server_s for row in mine]
            _tag_bars(axes.barh(range(len(mine)), server, label="server start"), f"series-downtime-server-{release}")
            _tag_bars(axes.barh(range(len(mine)), [row.tool_s for row in mine], left=server, color=TOOL_COLOR,
                                label="tool"), f"series-downtime-tool-{release}")
            axes.set_yticks(range(len(mine)), [f"{row.event} {row.when[5:16].replace('T', ' ')}" for row in mine],
                            fontsize="small")
            axes.invert_yaxis()
            axes.set_xlim(0, longest * 1.05)
            axes.set_title(f"release {release}", fontsize="small", loc="left")
        figure.legend(*panels[0].get_legend_handles_labels(), fontsize="small", ncols=2, loc="outside upper right")
        panels[-1].set_xlabel("seconds from the old server's stop to the first answer")
        return _svg(figure)


def _event_color(event: HistoryEvent) -> str:
    if event.outcome in ("failed", "crashed"):
        return FAILED_COLOR
    return "#ef6c00" if event.outcome == "restarted" else "#2e7d32"


EVENT_ROWS = ("deploy", "rollback", "adopt", "start", "restart", "stop", "crash", "failure")


def host_events(events: Sequence[HistoryEvent]) -> str | None:
    """Starts, stops, failures and crashes on one time line: a row per kind, failed ones red."""
    if not events:
        return None
    rows = [kind for kind in EVENT_ROWS if any(e.event == kind for e in events)]
    with _figure(1, 1.0 + 0.4 * len(rows)) as (figure, (axes,)):
        for kind in rows:
            mine = [e for e in events if e.event == kind]
            axes.scatter([_when(e.when) for e in mine], [rows.index(kind)] * len(mine), s=60,
                         c=[_event_color(e) for e in mine], marker="o").set_gid(f"series-event-{kind}")
        axes.set_yticks(range(len(rows)), rows)
        axes.set_ylim(-0.5, len(rows) - 0.5)
        axes.invert_yaxis()
        figure.autofmt_xdate()
        return _svg(figure)

