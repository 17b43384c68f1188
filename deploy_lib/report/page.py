"""The report's files: one self-contained HTML page (charts inline as SVG, no request at view time), a CSV file per
table and one JSON document of them all, written side by side; for a host's history or for one tuning sweep."""

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
from deploy_lib.program_name import spoken
from deploy_lib.report import charts
from deploy_lib.report.data import COLUMNS, ReportData, Row
from deploy_lib.report.sweep import SWEEP_COLUMNS, SweepData

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
    chart: bool = True  # False: a table alone, no "nothing recorded" where a chart would be
    detail: Sequence[str] = ()  # long columns, shown under each row across the table ("column: value")
    missing: str = "unknown"  # an empty cell: a start phase not logged is unknown; a failed run has no figure (-)

    def details(self, row: Row) -> list[tuple[str, Any]]:
        """The row's detail columns that hold something."""
        return [(column, row[column]) for column in self.detail if row[column]]


@dataclass(frozen=True)
class Page:
    """What one report writes: the page's text and sections, and the tables for its CSV files and JSON document."""

    title: str
    intro: str
    notes: Sequence[str]              # lines under the intro: a sweep's winner and why
    sections: Sequence[Section]
    stem: str                         # of every file name
    head: dict[str, Any]              # the JSON document's fields before its tables
    tables: dict[str, list[Row]]
    columns: dict[str, tuple[str, ...]]


def _svg(text: str | None) -> Markup | None:
    return Markup(text) if text is not None else None  # matplotlib escapes the text it draws


def sections(data: ReportData) -> list[Section]:
    """The page's sections in order: each chart with the table it draws (or the causes it numbers)."""
    tables = data.tables()
    marks = [{"#": number, **row} for number, row in enumerate(tables["marks"], 1)]
    svg = _svg
    return [
        Section("throughput", "Throughput and p99 TTFT of every benchmark",
                "Output tok/s (top) and p99 time to first token (bottom) of each benchmark, one line per concurrency; "
                "a red cross is a benchmark the gate failed, a numbered line a failed release or a rollback (causes "
                "below).", svg(charts.throughput_over_time(data.benchmarks, data.marks)),
                ("#", *COLUMNS["marks"]), marks, open=True),
        Section("concurrency", "Throughput against concurrency",
                "Each chosen release's newest benchmark at every concurrency level it ran, one line per release, "
                "with the workload it was measured on where it is not the default benchmark.",
                svg(charts.throughput_vs_concurrency(data.concurrency)),
                ("release", "when", "outcome", "benchmark", "concurrency", "output_tok_s", "ttft_p99_ms"),
                tables["concurrency"]),
        served_section(data),
        Section("power", "GPU power and utilisation during each benchmark",
                "Mean power per GPU (bars), its peak (black tick) and the power limit (dashed): a GPU far under its "
                "limit waits on something else. Below: mean utilisation.",
                svg(charts.gpu_power(data.gpus)), COLUMNS["gpus"], tables["gpus"]),
        Section("starts", "Start phases per release",
                "Each start's phases from the server's own log lines, stacked: init (restart to weights), weights, "
                "KV cache, CUDA graph capture, warmup (to \"fired up\"), and the ladder's first generation. A phase "
                "whose line was not logged is unknown: left out of the bar, never guessed.",
                svg(charts.start_phases(data.starts)), COLUMNS["starts"], tables["starts"]),
        Section("downtime", "Downtime per release",
                "Each switch that stopped a running server (deploy, rollback, restart), per release switched to: how "
                "long the endpoint did not answer, from the old server's stop to the new one's first generation; "
                "blue: the new server's own start, orange: the tool's part (the stop, systemd, round trips). A "
                "failed start and the rollback after it are one downtime, on the release rolled back to: the failed "
                "start is in its orange part.",
                svg(charts.switch_downtime(data.downtimes)), COLUMNS["downtimes"], tables["downtimes"]),
        Section("events", "Starts, failures, crashes and restarts",
                "Every start, stop, failure and crash on one time line; red: failed (or a crash systemd gave up on), "
                "orange: a crash systemd restarted.", svg(charts.host_events(data.events)), COLUMNS["events"],
                tables["events"]),
    ]


def served_section(data: ReportData) -> Section:
    """The live traffic each release served (the watch's windows, recorded workloads) beside its benchmark."""
    return Section("served", "Served traffic beside the benchmarks",
                   "What each release served live: the watch's windows around each watched deploy (the one before "
                   "the switch is the release then serving) and the workloads recorded from it, beside the release's "
                   "newest benchmark at its highest concurrency. Live figures come from SGLang's /metrics "
                   "(features.metrics); a workload records no latency.",
                   _svg(charts.served_beside_benchmark(data.served)), COLUMNS["served"],
                   data.tables()["served"])


INTRO = "The same tables are in the CSV files and the JSON document next to this page."


def host_page(data: ReportData) -> Page:
    return Page(f"{data.host}: {data.service}", f"From the host's history, read {data.generated_at} (UTC). {INTRO}",
                (), sections(data), file_stem(data.host, data.service),
                {"host": data.host, "service": data.service, "generated_at": data.generated_at}, data.tables(),
                dict(COLUMNS))


# the page marks the winner in bold and names it above; changes and causes go under their row
SHORT_COLUMNS = tuple(c for c in SWEEP_COLUMNS["candidates"] if c not in ("changes", "cause", "winner"))


def sweep_sections(data: SweepData) -> list[Section]:
    tables = data.tables()
    return [
        Section("candidates", "Candidates",
                f"The release serving before the sweep (0, base: {data.original}) and each candidate, numbered as the "
                "charts number them: what differs from the base flag by flag, the outcome (measured; missed SLA; "
                "failed: it did not start, or its benchmark did not run to the end; skipped: a rule refused it "
                f"before anything ran), whether it met the SLA ({data.sla}), the objective ({data.objective}, "
                f"measured on {'the default benchmark' if data.benchmark == 'default' else data.benchmark}: the "
                "mean of its runs that met the SLA), its gain over the base's best run, and its GPUs' power and "
                "utilisation during its newest run.", None, SHORT_COLUMNS, tables["candidates"], open=True,
                chart=False, detail=("changes", "cause"), missing="-"),
        Section("tune-concurrency", "Throughput against concurrency, per candidate",
                "Each candidate's newest run at every level of the ladder, one line each: the base dashed, the "
                "winner thick. A candidate that failed has no line.",
                _svg(charts.sweep_vs_concurrency(data.levels, data.candidates)), SWEEP_COLUMNS["levels"],
                tables["levels"], open=True, missing="-"),
        Section("tune-power", "GPU power against the limit, per candidate",
                "Each candidate's GPUs during its newest run (numbered as in the table): mean power (bars), peak "
                "(black tick) and the power limit (dashed); below, mean utilisation.",
                _svg(charts.sweep_power(data.gpus, data.candidates)), SWEEP_COLUMNS["gpus"], tables["gpus"],
                missing="-"),
    ]


def sweep_page(data: SweepData) -> Page:
    if data.finished:
        winner = next((c for c in data.candidates if c.winner), None)
        notes = [f"Winner: {f'{winner.number}: {winner.candidate}' if winner else 'none'}; serving at the end: "
                 f"release {data.serving}.", f"Why: {data.reason}"]
    else:
        notes = [spoken(f"Not finished: `invoke tune --profile {data.profile} --resume {data.tune_id}` runs the rest.")]
    return Page(f"{data.host}: {data.service}, tuning sweep {data.tune_id}",
                f"Profile {data.profile}, from the host's history, read {data.generated_at} (UTC). {INTRO}", notes,
                sweep_sections(data), file_stem(data.host, data.service, data.tune_id),
                {"kind": "tuning sweep", **data.summary()}, data.tables(), dict(SWEEP_COLUMNS))


def render_html(page: Page) -> str:
    environment = Environment(autoescape=True, undefined=StrictUndefined, keep_trailing_newline=True)
    template = resources.files("deploy_lib.report").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return environment.from_string(template).render(page=page)


def csv_text(columns: Sequence[str], rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def json_text(page: Page) -> str:
    return json.dumps({**page.head, **page.tables}, indent=1) + "\n"


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def file_stem(*names: str) -> str:
    """report-<host>-<service>[-<sweep>], with anything but letters, digits, `_.-` as `_` (a host name is inventory
    text)."""
    return _UNSAFE.sub("_", "-".join(("report", *names)))


def write_report(data: ReportData | SweepData, out_dir: Path) -> tuple[Path, ...]:
    """Write the page, its JSON and a CSV per table into `out_dir` (made if missing); the paths written, page first."""
    page = sweep_page(data) if isinstance(data, SweepData) else host_page(data)
    files = {out_dir / f"{page.stem}.html": render_html(page), out_dir / f"{page.stem}.json": json_text(page)}
    files |= {out_dir / f"{page.stem}-{name}.csv": csv_text(page.columns[name], rows)
              for name, rows in page.tables.items()}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
    except OSError as failed:
        raise ConfigError(f"cannot write the report to {out_dir}: {failed.strerror or failed}",
                          "give --out a directory you can write to") from None
    return tuple(files)
