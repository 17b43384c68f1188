"""`invoke report` from a recorded history (tests/data/report/history.jsonl: the demo's week on th1, as the tool's
own serializers write it) and `invoke report --tune ID` from a recorded sweep (tests/data/report/sweep.jsonl, as the
tune loop wrote it): what each table collects, the files written, and the pages opened in headless Chromium."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.browser import (
    REPORT_AREAS,
    REPORT_CHARTS,
    SWEEP_AREAS,
    SWEEP_CHARTS,
    assert_page_drawn,
    chart_areas,
    open_page,
    series_per_chart,
)
from helpers.deploy_plan import target
from helpers.report_host import scripted_host
from helpers.rollback import a_host

from deploy_lib import store
from deploy_lib.errors import ConfigError
from deploy_lib.host.report import read_report, read_sweep, write_report
from deploy_lib.profile.settings import WORKLOAD_KEY, workload_key
from deploy_lib.report import charts
from deploy_lib.report.data import COLUMNS, TABLES, ReportData, collect
from deploy_lib.report.page import sweep_sections
from deploy_lib.report.sweep import SweepData, collect_sweep
from deploy_lib.store import HistoryEntry

HISTORY = Path(__file__).parent / "data" / "report" / "history.jsonl"
A, B, C, D = "ac2a8743bd47", "21a6cd18cbea", "9da6e34445c9", "faf22e9b79da"
SWEEP = Path(__file__).parent / "data" / "report" / "sweep.jsonl"
TUNE = "t20261202-062647-0b6e"


def recorded() -> list[HistoryEntry]:
    return [HistoryEntry.from_json(line) for line in HISTORY.read_text().splitlines()]


def report(releases: tuple[str, ...] = ()) -> ReportData:
    return collect(recorded(), "th1", "sglang", "2026-11-30T20:00:00+00:00", releases)


def swept() -> list[HistoryEntry]:
    return [HistoryEntry.from_json(line) for line in SWEEP.read_text().splitlines()]


def sweep(history: list[HistoryEntry] | None = None) -> SweepData:
    return collect_sweep(swept() if history is None else history, "th1", "sglang", "2026-12-02T07:00:00+00:00", TUNE)


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


def test_each_switch_that_stopped_a_running_server_has_its_downtime_split_into_server_and_tool() -> None:
    """The first deploy (nothing ran before), the failed deploy (its downtime goes on into the rollback after it) and
    a rollback written before downtimes were have none."""
    rows = report().downtimes
    assert [(r.release, r.event, r.downtime_s, r.server_s, r.tool_s) for r in rows] == [
        (A, "rollback", 10.4, 9.11, 1.29), (C, "deploy", 14.0, 13.11, 0.89), (A, "rollback", 31.2, 8.31, 22.89),
        (D, "deploy", 14.3, 13.41, 0.89)]
    svg = charts.switch_downtime(rows) or ""
    for release, switches in ((A, 2), (C, 1), (D, 1)):
        for part in ("server", "tool"):
            assert [n for n in range(3) if f'id="series-downtime-{part}-{release}-{n}"' in svg] == \
                list(range(switches)), (release, part)
    assert charts.switch_downtime(()) is None


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


@pytest.mark.parametrize("kind", ["host", "sweep"])
def test_the_page_opens_in_chromium_with_no_console_message_no_request_and_every_chart_drawn(kind: str, tmp_path: Path
                                                                                           ) -> None:
    data, charts, chart_count = (report(), REPORT_CHARTS, REPORT_AREAS + 3) if kind == "host" else \
        (sweep(), SWEEP_CHARTS, SWEEP_AREAS)
    [page, *_] = write_report(data, tmp_path / "out")
    assert_page_drawn(page, tmp_path, charts, chart_count)


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

    scripted_host(monkeypatch, HISTORY)
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


# --- a tuning sweep: `report --tune ID` -------------------------------------------------------------------------


def test_a_sweeps_table_has_the_base_then_each_candidate_with_its_outcome_objective_and_power() -> None:
    data = sweep()
    assert [(c.number, c.candidate, c.outcome, c.sla_met) for c in data.candidates] == [
        (0, "base", "measured", True),
        (1, "memory.max_running_requests=64 memory.mem_fraction_static=0.9", "missed SLA", False),
        (2, "memory.max_running_requests=64 memory.mem_fraction_static=0.99", "failed", False),
        (3, "memory.max_running_requests=1024 memory.mem_fraction_static=0.9", "measured", True),
        (4, "memory.max_running_requests=1024 memory.mem_fraction_static=0.99", "failed", False)]
    base, missed, failed, winner, _ = data.candidates
    assert (base.release, base.objective, base.vs_base_pct) == ("B", 934.4, None)
    assert (winner.winner, winner.objective, winner.vs_base_pct) == (True, 3737.6, 300.0)
    assert [c.candidate for c in data.candidates if c.winner] == [data.winner]
    assert missed.objective is None and missed.cause == "at 1024: p99 TTFT 1,600 ms > 500 ms"
    assert "failed: the unit failed" in failed.cause and failed.power_mean_w is None, "it never ran a benchmark"
    assert winner.changes == "~ flag --mem-fraction-static: 0.92 -> 0.9" and winner.cause == ""
    assert (winner.power_mean_w, winner.power_limit_w, winner.util_mean_pct) == (249.5, 600.0, 90.0)
    assert (data.finished, data.serving, data.sla) == (True, winner.release, "p99 TTFT <= 500 ms")
    assert data.objective == "throughput at concurrency 1024 (output tok/s)" and "+300.0%" in data.reason


def test_a_sweeps_page_says_which_workload_its_runs_were_measured_on() -> None:
    """Input tried: the recorded sweep as run (the default benchmark), and its runs' figures marked as replaying the
    recorded workload `chat` (the page named no workload)."""
    assert sweep().benchmark == "default"
    on_chat = []
    for entry in swept():
        line = json.loads(entry.to_json())
        if line["figures"]:
            line["figures"][WORKLOAD_KEY] = workload_key("chat")
        on_chat.append(HistoryEntry.from_json(json.dumps(line)))
    data = collect_sweep(on_chat, "th1", "sglang", "2026-12-02T07:00:00+00:00", TUNE, ["batch", "chat"])
    assert data.benchmark == "workload chat" and data.summary()["benchmark"] == "workload chat"
    [candidates] = [section for section in sweep_sections(data) if section.id == "candidates"]
    assert "measured on workload chat" in candidates.text


def test_a_sweeps_figures_are_per_candidate_and_level_and_its_gpus_per_candidate() -> None:
    data = sweep()
    assert {lv.number for lv in data.levels} == {0, 1, 3}, "the failed candidates ran no benchmark"
    assert [(lv.concurrency, lv.output_tok_s) for lv in data.levels if lv.number == 3] == [
        (64, 233.6), (256, 934.4), (1024, 3737.6)]
    assert [lv.ttft_p99_ms for lv in data.levels if lv.number == 1] == [100.0, 400.0, 1600.0]
    assert len(data.gpus) == 3 * 8 and {g.gpu for g in data.gpus if g.number == 3} == set(range(8))


def test_a_candidate_run_again_within_the_noise_keeps_what_differs_from_the_base() -> None:
    """Input tried: the recorded sweep with the winner run again before its end (the tune loop's rerun of the top
    candidates within the noise records no changes, as a real sweep on a sandbox guest wrote it)."""
    history = swept()
    winner = [e for e in history if e.tune.get("role") == "candidate" and e.outcome == "healthy"][-1]
    rerun = replace(winner, tune={**winner.tune, "role": "rerun", "changes": ""})
    data = sweep([*history[:-1], rerun, history[-1]])
    assert [c.changes for c in data.candidates if c.winner] == ["~ flag --mem-fraction-static: 0.92 -> 0.9"]


def test_a_sweep_cut_short_says_how_to_finish_it(tmp_path: Path) -> None:
    """Input tried: the recorded sweep without its end line (as history holds it after Ctrl-C)."""
    cut = [entry for entry in swept() if entry.tune.get("role") != "end"]
    data = sweep(cut)
    assert not data.finished and data.winner is None and not any(c.winner for c in data.candidates)
    [page, *_] = write_report(data, tmp_path)
    assert f"`invoke tune --profile glm5-nvfp4 --resume {TUNE}` runs the rest" in page.read_text()


def test_a_tune_id_not_in_history_is_named_with_the_ids_that_are() -> None:
    """Input tried: --tune t20261202-000000-beef, a sweep the host never ran."""
    with pytest.raises(ConfigError, match="th1: no tuning sweep 't20261202-000000-beef'") as refused:
        collect_sweep(swept(), "th1", "sglang", "now", "t20261202-000000-beef")
    assert f"sweeps on th1: {TUNE}" in (refused.value.hint or "")
    with pytest.raises(ConfigError) as none:
        collect_sweep(recorded(), "th1", "sglang", "now", TUNE)
    assert "sweeps on th1: none" in (none.value.hint or "")


def test_a_sweeps_files_hold_its_tables_as_csv_and_json_beside_the_page(tmp_path: Path) -> None:
    data = sweep()
    paths = write_report(data, tmp_path)
    stem = f"report-th1-sglang-{TUNE}"
    assert [path.name for path in paths] == [f"{stem}.html", f"{stem}.json", f"{stem}-candidates.csv",
                                             f"{stem}-levels.csv", f"{stem}-gpus.csv"]
    document = json.loads((tmp_path / f"{stem}.json").read_text())
    assert (document["tune_id"], document["winner"], document["reason"]) == (TUNE, data.winner, data.reason)
    for name in ("candidates", "levels", "gpus"):
        with (tmp_path / f"{stem}-{name}.csv").open() as table:
            rows = list(csv.DictReader(table))
        assert len(rows) == len(document[name]) == len(getattr(data, name)), name
    assert rows[0]["candidate"] == "base" and document["candidates"][3]["winner"] is True
    html = paths[0].read_text()
    assert "Why: winner memory.max_running_requests=1024" in html and "changes: ~ flag --mem-fraction-static" in html


def test_the_sweep_is_read_through_one_read_of_the_store_and_writes_nothing() -> None:
    host = a_host()
    host.reply(store.FACT_HISTORY, stdout=SWEEP.read_text())
    data = read_sweep(target(), "sglang", host, TUNE)
    assert len(data.candidates) == 5 and data.host == target().host.name
    assert all(name.startswith("store facts:") for name in host.ran_names())


def test_the_report_task_with_tune_writes_the_sweeps_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from invoke import Context

    from deploy_cli.report import report as report_task

    scripted_host(monkeypatch, SWEEP)
    report_task(Context(), out=str(tmp_path), tune=TUNE)
    page = tmp_path / f"report-{target().host.name}-sglang-{TUNE}.html"
    assert f"report written to {page}" in capsys.readouterr().out and page.is_file()


def test_the_report_task_names_a_tune_id_the_host_lacks_and_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `report --tune t1` on a host whose one sweep is another; then `--tune` with `--release`."""
    from invoke import Context, Exit

    from deploy_cli.report import report as report_task

    scripted_host(monkeypatch, SWEEP)
    with pytest.raises(Exit) as refused:
        report_task(Context(), out=str(tmp_path), tune="t1")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "no tuning sweep 't1'" in err and TUNE in err
    with pytest.raises(Exit) as both:
        report_task(Context(), out=str(tmp_path), tune=TUNE, release=[A])
    assert both.value.code == 2 and "--tune" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "nothing written"
