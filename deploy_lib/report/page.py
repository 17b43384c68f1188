"""The report's files: one self-contained HTML page (charts inline as SVG, no request at view time), a CSV file per
table and one JSON document of them all, written side by side."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import Environment, StrictUndefined
from markupsafe import Markup

from deploy_lib.errors import ConfigError
from deploy_lib.report import charts
from deploy_lib.report.data import COLUMNS, TABLES, ReportData, Row

TEMPLATE = "report.html.j2"


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    text: str
    svg: Markup | None
    columns: Sequence[str]
    rows: Sequence[Row]
    open: bool = False  # the table shows without a click (the causes the chart numbers)


def sections(data: ReportData) -> list[Section]:
    """The page's sections in order: each chart with the table it draws (or the causes it numbers)."""
    tables = data.tables()
    marks = [{"#": number, **row} for number, row in enumerate(tables["marks"], 1)]

    def svg(text: str | None) -> Markup | None:
        return Markup(text) if text is not None else None  # matplotlib escapes the text it draws

    return [
        Section("throughput", "Throughput and p99 TTFT of every benchmark",
                "Output tok/s (top) and p99 time to first token (bottom) of each benchmark, one line per concurrency; "
                "a red cross is a benchmark the gate failed, a numbered line a failed release or a rollback (causes "
                "below).", svg(charts.throughput_over_time(data.benchmarks, data.marks)),
                ("#", *COLUMNS["marks"]), marks, open=True),
        Section("concurrency", "Throughput against concurrency",
                "Each chosen release's newest benchmark at every concurrency level it ran, one line per release.",
                svg(charts.throughput_vs_concurrency(data.concurrency)),
                ("release", "when", "outcome", "concurrency", "output_tok_s", "ttft_p99_ms"), tables["concurrency"]),
        Section("power", "GPU power and utilisation during each benchmark",
                "Mean power per GPU (bars), its peak (black tick) and the power limit (dashed): a GPU far under its "
                "limit waits on something else. Below: mean utilisation.",
                svg(charts.gpu_power(data.gpus)), COLUMNS["gpus"], tables["gpus"]),
        Section("starts", "Start phases per release",
                "Each start's phases from the server's own log lines, stacked: init (restart to weights), weights, "
                "KV cache, CUDA graph capture, warmup (to \"fired up\"), and the ladder's first generation. A phase "
                "whose line was not logged is unknown: left out of the bar, never guessed.",
                svg(charts.start_phases(data.starts)), COLUMNS["starts"], tables["starts"]),
        Section("events", "Starts, failures, crashes and restarts",
                "Every start, stop, failure and crash on one time line; red: failed (or a crash systemd gave up on), "
                "orange: a crash systemd restarted.", svg(charts.host_events(data.events)), COLUMNS["events"],
                tables["events"]),
    ]


def render_html(data: ReportData) -> str:
    environment = Environment(autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
    template = resources.files("deploy_lib.report").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return environment.from_string(template).render(data=data, sections=sections(data))


def csv_text(columns: Sequence[str], rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def json_text(data: ReportData) -> str:
    document: dict[str, Any] = {"host": data.host, "service": data.service, "generated_at": data.generated_at,
                                **data.tables()}
    return json.dumps(document, indent=1) + "\n"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def file_stem(data: ReportData) -> str:
    """report-<host>-<service>, with anything but letters, digits, `_.-` as `_` (a host name is inventory text)."""
    return _UNSAFE.sub("_", f"report-{data.host}-{data.service}")


def write_report(data: ReportData, out_dir: Path) -> tuple[Path, ...]:
    """Write the page, its JSON and a CSV per table into `out_dir` (made if missing); the paths written, page first."""
    stem = file_stem(data)
    files = {out_dir / f"{stem}.html": render_html(data), out_dir / f"{stem}.json": json_text(data)}
    tables = data.tables()
    files |= {out_dir / f"{stem}-{name}.csv": csv_text(COLUMNS[name], tables[name]) for name in TABLES}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
    except OSError as failed:
        raise ConfigError(f"cannot write the report to {out_dir}: {failed.strerror or failed}",
                          "give --out a directory you can write to") from None
    return tuple(files)
