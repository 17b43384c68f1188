"""`invoke report` from a recorded history (tests/data/report/history.jsonl: the demo's week on th1, as the tool's
own serializers write it): what each table collects, the files written, and the page opened in headless Chromium."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from browser import MIN_DRAWN_PX, REPORT_AREAS, chart_areas, open_page, series_per_chart
from test_deploy_plan import target
from test_rollback import a_host

from deploy_lib import store
from deploy_lib.errors import ConfigError
from deploy_lib.report import ReportData, collect, read_report, write_report
from deploy_lib.report.data import COLUMNS, TABLES
from deploy_lib.store import HistoryEntry

HISTORY = Path(__file__).parent / "data" / "report" / "history.jsonl"
A, B, C, D = "ac2a8743bd47", "21a6cd18cbea", "9da6e34445c9", "faf22e9b79da"
CHARTS = ("chart-throughput", "chart-concurrency", "chart-power", "chart-starts", "chart-events")


def recorded() -> list[HistoryEntry]:
    return [HistoryEntry.from_json(line) for line in HISTORY.read_text().splitlines()]


def report(releases: tuple[str, ...] = ()) -> ReportData:
    return collect(recorded(), "th1", "sglang", "2026-11-30T20:00:00+00:00", releases)


def test_every_benchmark_is_a_point_per_concurrency_and_failed_releases_are_marked_with_their_cause() -> None:
    data = report()
    assert [(p.release, p.concurrency) for p in data.benchmarks][:3] == [(A, 64), (A, 256), (A, 1024)]
    assert len(data.benchmarks) == 9, "three benchmarks of three levels"
    [gated] = {p.cause for p in data.benchmarks if p.outcome == "failed"}
    assert "below the gate" in gated
    assert [(m.release, m.event, m.outcome) for m in data.marks] == [
        (B, "deploy", "failed"), (A, "rollback", "healthy"), (C, "bench", "failed"), (C, "deploy", "failed"),
        (A, "rollback", "healthy"), (A, "rollback", "healthy")]
    assert "[fusion_gate]" in data.marks[0].cause


def test_throughput_against_concurrency_is_each_chosen_releases_newest_benchmark() -> None:
    every = report()
    assert {(p.release, p.when) for p in every.concurrency} == {(C, "2026-11-30T19:05:50+00:00"),
                                                                (A, "2026-11-30T19:36:50+00:00")}
    chosen = report((A,))
    assert [(p.concurrency, p.output_tok_s) for p in chosen.concurrency] == [(64, 1530.0), (256, 2652.0),
                                                                            (1024, 3284.4)]


def test_a_chosen_release_never_benchmarked_is_named_with_the_ones_that_were() -> None:
    """Input tried: --release faf22e9b79da, deployed but never benchmarked."""
    with pytest.raises(ConfigError, match=f"release {D} has no benchmark") as refused:
        report((D,))
    assert f"{A}, {C}" in (refused.value.hint or "")


def test_power_per_gpu_per_benchmark_against_the_limit() -> None:
    gpus = report().gpus
    assert len(gpus) == 24 and {r.gpu for r in gpus} == set(range(8))
    first = [r for r in gpus if r.when == gpus[0].when]
    assert (first[0].power_mean_w, first[0].power_peak_w, first[0].power_limit_w) == (222.0, 242.0, 600.0)


def test_start_phases_are_per_start_and_a_missing_phase_stays_unknown() -> None:
    starts = report().starts
    assert [(row.release, row.event) for row in starts] == [(A, "deploy"), (A, "rollback"), (C, "deploy"),
                                                           (C, "deploy"), (A, "rollback"), (D, "deploy"),
                                                           (A, "rollback")]
    assert (starts[0].weights, starts[0].cuda_graphs, starts[0].first_generation) == (4.4, 2.2, 0.21)
    assert starts[4].warmup is None, "its ready line was not logged: unknown"
    assert starts[-1].weights is None and starts[-1].ready_s == 9.1, "ladder times only"


def test_crashes_and_restarts_are_on_the_time_line() -> None:
    crashes = [(e.release, e.outcome) for e in report().events if e.event == "crash"]
    assert crashes == [(D, "restarted"), (D, "failed")]


def test_the_files_hold_the_same_tables_as_csv_and_json(tmp_path: Path) -> None:
    data = report()
    paths = write_report(data, tmp_path / "out")
    assert paths[0].name == "report-th1-sglang.html" and all(path.is_file() for path in paths)
    document = json.loads((tmp_path / "out" / "report-th1-sglang.json").read_text())
    for name in TABLES:
        with (tmp_path / "out" / f"report-th1-sglang-{name}.csv").open() as table:
            rows = list(csv.DictReader(table))
        assert tuple(rows[0]) == COLUMNS[name] if rows else True
        assert len(rows) == len(document[name]) == len(getattr(data, name)), name
    assert document["starts"][4]["warmup"] is None


def test_a_hostile_cause_and_host_name_stay_text(tmp_path: Path) -> None:
    """Input tried: a failure cause holding markup and a host name with a path in it."""
    entries = recorded()
    entries[2] = HistoryEntry(**{**entries[2].__dict__, "cause": '<script>alert("x")</script> & "quotes"'})
    data = collect(entries, "../th 1", "sglang", "2026-11-30T20:00:00+00:00")
    [page, *_] = write_report(data, tmp_path)
    html = page.read_text()
    assert page.parent == tmp_path and page.name == "report-.._th_1-sglang.html"
    assert "<script>" not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp;" in html


def test_an_out_directory_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    """Input tried: --out under a regular file."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=f"cannot write the report to {tmp_path / 'file' / 'out'}"):
        write_report(report(), tmp_path / "file" / "out")


def test_the_report_reads_the_history_through_one_read_of_the_store_and_writes_nothing() -> None:
    host = a_host()
    host.reply(store.FACT_HISTORY, stdout=HISTORY.read_text())
    data = read_report(target(), "sglang", host)
    assert len(data.benchmarks) == 9 and data.host == target().host.name
    assert all(name.startswith("store facts:") for name in host.ran_names())


def test_the_page_opens_in_chromium_with_no_console_message_no_request_and_every_chart_drawn(tmp_path: Path
                                                                                           ) -> None:
    [page, *_] = write_report(report(), tmp_path / "out")
    opened = open_page(page, tmp_path)
    assert opened.console == [] and opened.page_requests == []
    drawn = series_per_chart(opened.dom)
    assert set(drawn) == set(CHARTS) and all(drawn[chart] for chart in CHARTS), drawn
    areas = chart_areas(opened.screenshot)
    assert len(areas) == REPORT_AREAS and all(drawn >= MIN_DRAWN_PX for *_, drawn in areas), areas


def test_the_browser_check_sees_a_request_the_page_tries_and_blank_charts(tmp_path: Path) -> None:
    """The checks above can fail: input tried, a page with an image from the network, and the page without its
    charts' SVG."""
    [page, *_] = write_report(report(), tmp_path / "out")
    html = page.read_text()
    fetching = tmp_path / "fetching.html"
    fetching.write_text(html.replace("<h1>", '<img src="http://192.0.2.1/x.png"><h1>')
                        .replace('<meta http-equiv="Content-Security-Policy"', '<meta name="no-policy"'))
    tried = open_page(fetching, tmp_path / "fetching", height=800)
    assert tried.page_requests == ["http://192.0.2.1/x.png"]
    blank = tmp_path / "blank.html"
    blank.write_text("".join(part.split("</svg>", 1)[-1] for part in html.split("<svg")))
    opened = open_page(blank, tmp_path / "blank")
    assert not any(series_per_chart(opened.dom).values()) and chart_areas(opened.screenshot) == []


def test_the_report_task_writes_the_files_and_prints_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The task end to end, with a scripted host in place of the SSH connection (the default inventory's host)."""
    from invoke import Context

    from deploy_cli.report import report as report_task
    from deploy_lib import remote

    host = a_host()
    host.reply(store.FACT_HISTORY, stdout=HISTORY.read_text())

    class Connection:
        def __init__(self, *_: object, **__: object) -> None:
            pass

        def __enter__(self) -> object:
            return host

        def __exit__(self, *_: object) -> None:
            pass

    monkeypatch.setattr(remote, "FabricRemote", Connection)
    monkeypatch.delenv("SGLANG_DEPLOY_INVENTORY", raising=False)
    report_task(Context(), out=str(tmp_path / "out"), release=[A])
    page = tmp_path / "out" / f"report-{target().host.name}-sglang.html"
    assert f"report written to {page}" in capsys.readouterr().out and page.is_file()
    concurrency = (tmp_path / "out" / f"report-{target().host.name}-sglang-concurrency.csv").read_text()
    assert A in concurrency and C not in concurrency, "only the chosen release's line"


def test_the_report_task_refuses_host_and_group_together(capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `report --host a --group b`."""
    from invoke import Context, Exit

    from deploy_cli.report import report as report_task

    with pytest.raises(Exit) as refused:
        report_task(Context(), host="a", group="b")
    assert refused.value.code == 2
    assert "--host and --group are exclusive" in capsys.readouterr().err
