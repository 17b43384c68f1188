"""The report's served traffic (issue 42): the watch's windows recorded in a deploy's history line and the workloads
read on the host, each beside its release's newest benchmark; from the recorded demo history
(tests/data/report/history.jsonl) with one watched deploy and one workload added, as the tool writes them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.browser import REPORT_AREAS, REPORT_CHARTS, assert_page_drawn
from helpers.deploy_plan import target
from helpers.report_host import scripted_host

from deploy_lib.host.report import write_report
from deploy_lib.metrics.recorded import RecordedWindow, Side
from deploy_lib.metrics.workload import Bucket, Lengths, Workload, workload_text
from deploy_lib.profile.settings import WORKLOAD_KEY, workload_key
from deploy_lib.report import charts
from deploy_lib.report.data import ReportData, collect
from deploy_lib.store import HistoryEntry

HISTORY = Path(__file__).parent / "data" / "report" / "history.jsonl"
REPO = Path(__file__).resolve().parents[1]
A, D = "ac2a8743bd47", "faf22e9b79da"  # A served before D's deploy (line 8); A's newest benchmark is line 12
BEFORE = RecordedWindow(window_s=300, requests=900, request_rate=3.0, generation_tok_s=610.0, ttft_p99_s=0.396,
                        inter_token_p99_s=0.041, mean_in_flight=12.5)
AFTER = RecordedWindow(window_s=300, requests=870, request_rate=2.9, generation_tok_s=600.0, ttft_p99_s=0.402,
                       inter_token_p99_s=None, mean_in_flight=12.9)


def lengths(mean: float) -> Lengths:
    return Lengths(mean=mean, p50=mean, p90=mean, p99=mean, buckets=(Bucket(upto=3000, requests=120),
                                                                     Bucket(upto=None, requests=0)))


def workload(name: str, host: str, release: str = A) -> Workload:
    return Workload(name=name, release=release, hosts=(host,), sglang_version="0.5.23",
                    read_at="2026-11-30T19:40:00+00:00", window_s=600, scrapes=61, requests=120, request_rate=0.2,
                    peak_concurrency=9, mean_concurrency=4.0, cached_share=0.4, prompt_length=lengths(2000),
                    output_length=lengths(200))


def watched_history() -> list[HistoryEntry]:
    """The demo's history, D's deploy watched (both windows in its line, as the deploy writes them)."""
    entries = [HistoryEntry.from_json(line) for line in HISTORY.read_text().splitlines()]
    assert (entries[8].event, entries[8].tags.release) == ("deploy", D)
    line = json.loads(entries[8].to_json())
    line["figures"] = BEFORE.as_figures(Side.BEFORE) | AFTER.as_figures(Side.AFTER)
    entries[8] = HistoryEntry.from_json(json.dumps(line))
    return entries


def report(workloads: tuple[Workload, ...] = ()) -> ReportData:
    return collect(watched_history(), "th1", "sglang", "2026-11-30T20:00:00+00:00", workloads=workloads)


def test_a_watched_deploys_windows_are_the_serving_releases_and_the_new_ones_beside_their_benchmarks() -> None:
    before, after = report().served
    assert (before.release, before.source) == (A, f"watch before the switch to {D}")
    assert (before.requests, before.request_rate, before.ttft_p99_ms, before.inter_token_p99_ms) == (900, 3.0, 396.0,
                                                                                                   41.0)
    # A's newest benchmark at its highest level, beside its live figures
    assert (before.bench_concurrency, before.bench_output_tok_s) == (1024, 3284.4)
    assert before.bench_measured_on == "default", "the benchmark beside live figures says what it ran"
    assert (after.release, after.source, after.ttft_p99_ms) == (D, "watch after the switch", 402.0)
    assert after.inter_token_p99_ms is None, "a figure the window did not observe stays unknown"
    assert after.bench_output_tok_s is None and after.bench_measured_on is None, "D was never benchmarked"


def test_a_workload_read_on_this_host_is_served_traffic_of_its_release_and_one_read_elsewhere_is_not() -> None:
    rows = report((workload("chat", "th1"), workload("batch", "th2", D))).served
    assert [(r.release, r.source) for r in rows] == [(A, f"watch before the switch to {D}"),
                                                     (D, "watch after the switch"), (A, "workload chat")]
    read = rows[-1]
    assert (read.requests, read.output_tok_s, read.ttft_p99_ms) == (120, 40.0, None)  # 200 tokens x 0.2/s
    assert read.bench_output_tok_s == 3284.4


def test_a_history_without_a_watch_has_no_served_rows_and_a_rollback_line_is_no_window() -> None:
    entries = [replace(e, figures={}) if e.event == "deploy" else e for e in watched_history()]
    assert collect(entries, "th1", "sglang", "2026-11-30T20:00:00+00:00").served == ()


def test_the_page_draws_served_traffic_beside_the_benchmarks_and_its_files_hold_the_table(tmp_path: Path) -> None:
    data = report((workload("chat", "th1"),))
    [page, *_] = write_report(data, tmp_path / "out")
    document = json.loads((tmp_path / "out" / "report-th1-sglang.json").read_text())
    assert [row["source"] for row in document["served"]] == [r.source for r in data.served]
    assert (tmp_path / "out" / "report-th1-sglang-served.csv").read_text().startswith("when,release,source,")
    # a panel per release switched to in the downtime chart, two more for served traffic
    downtime_panels = len({row.release for row in data.downtimes})
    assert_page_drawn(page, tmp_path, (*REPORT_CHARTS, "chart-served"), REPORT_AREAS + downtime_panels + 2)


@pytest.mark.parametrize("side", list(Side))
def test_a_window_round_trips_through_a_history_line(side: Side) -> None:
    assert RecordedWindow.from_figures(AFTER.as_figures(side), side) == AFTER
    assert RecordedWindow.from_figures(AFTER.as_figures(side), Side.AFTER if side is Side.BEFORE else Side.BEFORE) \
        is None


def test_the_report_task_shows_the_projects_workloads_read_on_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The task end to end from a project holding a recorded workload, the history on a scripted host; then the same
    project with a workload file broken by hand: refused, naming the file and the key."""
    from invoke import Context, Exit

    from deploy_cli.report import report as report_task

    history = tmp_path / "history.jsonl"
    history.write_text("".join(entry.to_json().decode() for entry in watched_history()))
    scripted_host(monkeypatch, history)
    (tmp_path / "project" / "inventory" / "workloads").mkdir(parents=True)
    (tmp_path / "project" / "inventory" / "hosts.yaml").write_text((REPO / "inventory" / "hosts.yaml").read_text())
    host = target().host.name
    written = tmp_path / "project" / "inventory" / "workloads" / "chat.yaml"
    written.write_text(workload_text(workload("chat", host)))
    monkeypatch.chdir(tmp_path / "project")
    report_task(Context(), out=str(tmp_path / "out"), json=True)
    document = json.loads((tmp_path / "out" / f"report-{host}-sglang.json").read_text())
    assert [row["source"] for row in document["served"]] == [f"watch before the switch to {D}",
                                                             "watch after the switch", "workload chat"]
    written.write_text(written.read_text().replace("requests: 120\n", "requests: many\n", 1))
    with pytest.raises(Exit) as refused:
        report_task(Context(), out=str(tmp_path / "out"), json=True)
    assert refused.value.code == 2 and f"workload file {written}: requests: " in capsys.readouterr().err


def test_each_benchmark_says_what_it_was_measured_on_and_a_workloads_figures_are_a_line_of_their_own() -> None:
    """Input tried: A benchmarked again on the recorded workload `chat` after its default benchmarks (the report
    drew both on one line per concurrency, as if comparable, and named no workload)."""
    history = watched_history()
    line = json.loads(history[12].to_json())
    assert (line["event"], line["release"]) == ("bench", A)
    line["when"] = "2026-11-30T19:50:00+00:00"
    line["figures"][WORKLOAD_KEY] = workload_key("chat")
    history.append(HistoryEntry.from_json(json.dumps(line)))
    data = collect(history, "th1", "sglang", "2026-11-30T20:00:00+00:00", workloads=(workload("chat", "th1"),))
    assert {p.benchmark for p in data.benchmarks if p.when == line["when"]} == {"workload chat"}
    assert {p.benchmark for p in data.benchmarks if p.when != line["when"]} == {"default"}
    assert all(row["benchmark"] for row in data.tables()["benchmarks"])
    drawn = charts.throughput_over_time(data.benchmarks, data.marks) or ""
    assert 'id="series-tok_s-c64"' in drawn and 'id="series-tok_s-c64-w1"' in drawn, "one line per workload"
    assert "concurrency 64, workload chat" in drawn
    newest = charts.throughput_vs_concurrency(data.concurrency) or ""
    assert f"{A} (" in newest and "workload chat)" in newest
    unknown = collect(history, "th1", "sglang", "2026-11-30T20:00:00+00:00")  # its file gone from the project
    assert {p.benchmark for p in unknown.benchmarks if p.when == line["when"]} == {"a workload not recorded here"}
