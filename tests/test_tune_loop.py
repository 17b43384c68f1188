"""The sweep on one host, against a scripted host whose store follows what the deploy engine writes (releases,
current, history) and whose benchmark answers from the serving release's profile (no SSH, no subprocess)."""

from __future__ import annotations

import json

import pytest
from helpers.deploy_plan import target
from helpers.tune_loop import (
    BENCH,
    LAYOUT,
    MRR,
    a_sweep_host,
    request,
    sweep,
)

from deploy_cli.present import jsonable
from deploy_cli.tune import table_lines
from deploy_lib.commands.tune import BASE_RUNS, show
from deploy_lib.commands.tune_request import Planned, Request
from deploy_lib.errors import Interrupted
from deploy_lib.host import store
from deploy_lib.models.page_cache import MEASURE, READ
from deploy_lib.store import ACTIVATIONS
from deploy_lib.throughput.history import throughput_by_release
from deploy_lib.tune import TuneReport, sweep_spec
from deploy_lib.tune.estimate import Between


def test_the_dry_run_lists_candidates_flag_by_flag_and_changes_nothing() -> None:
    host = a_sweep_host(*MRR)
    planned = sweep(host, Request(*sweep_spec(None, MRR, {"bench": BENCH}), dry_run=True))
    assert isinstance(planned, Planned) and planned.original == "B"
    assert {label: [str(c) for c in changes if c.kind == "flag"] for label, changes in planned.changes.items()} == {
        "memory.max_running_requests=64": ["~ flag --max-running-requests: 1024 -> 64"],
        "memory.max_running_requests=256": ["~ flag --max-running-requests: 1024 -> 256"],
        "memory.max_running_requests=1024": []}
    assert planned.estimate.starts == Between(3, 6) and planned.estimate.runs == BASE_RUNS + 3
    assert planned.estimate.reruns == Between(0, 2)
    assert all(name.startswith(("store facts:", "host facts:")) for name in host.ran_names()), "reads only"
    as_json = json.loads(json.dumps(jsonable(planned)))
    assert [c["label"] for c in as_json["sweep"]["candidates"]] == list(planned.changes)


def test_a_sweep_deploys_each_candidate_keeps_the_winner_and_records_every_run() -> None:
    host = a_sweep_host(*MRR)
    report = sweep(host, request(*MRR))
    assert isinstance(report, TuneReport) and report.finished
    assert [(r.label, r.outcome) for r in report.rows] == [
        ("memory.max_running_requests=64", "measured"), ("memory.max_running_requests=256", "measured"),
        ("memory.max_running_requests=1024", "measured")]
    by_label = {r.label: r for r in report.rows}
    fast, slow = by_label["memory.max_running_requests=1024"], by_label["memory.max_running_requests=64"]
    assert fast.values[0] / slow.values[0] == pytest.approx(16.0)
    assert report.winner == "memory.max_running_requests=1024" and "kept" in report.reason
    assert report.serving == fast.release_id == host.current, "the winner serves"
    roles = [line["tune"]["role"] for line in host.tune_lines()]
    assert roles == ["start", "base", "base", "candidate", "candidate", "candidate", "end"]
    assert {line["tune"]["id"] for line in host.tune_lines()} == {report.tune_id}
    assert show(host, target(), "sglang", report.tune_id) == report, "tune.show reads the same table back"
    assert fast.power == "250 W mean, 250 W peak of 600 W, 90% util", "GPU power and utilisation per candidate"
    assert "3,738 tok/s @1024" in throughput_by_release(store.read_store_facts(host, LAYOUT).history)[fast.release_id]
    as_json = json.loads(json.dumps(jsonable(report)))
    assert as_json["winner"] == report.winner and as_json["rows"][2]["levels"][1]["concurrency"] == 1024
    deploys = [json.loads(line) for line in host.lines if json.loads(line)["event"] == "deploy"]
    assert [d["outcome"] for d in deploys][-3:] == ["healthy"] * 3, "each candidate a release like any other"
    assert all(row.downtime is not None for row in report.rows), "each candidate stopped a running server"
    assert sum("downtime" in line for line in table_lines(report)) == 3, "the table shows each candidate's"


def test_a_candidate_that_fails_to_start_is_recorded_and_the_sweep_goes_on() -> None:
    vary = ("memory.mem_fraction_static=0.99,0.92",)
    host = a_sweep_host(*vary)
    report = sweep(host, request(*vary))
    assert isinstance(report, TuneReport)
    failed, good = report.rows
    assert (failed.label, failed.outcome, failed.values) == ("memory.mem_fraction_static=0.99", "failed", ())
    assert "rolled back" in failed.cause and failed.release_id not in (None, "B")
    assert good.outcome == "measured" and host.current == report.serving


def test_a_candidate_missing_the_sla_is_recorded_failed_and_the_best_so_far_serves_next() -> None:
    """Input tried: an SLA of p99 TTFT <= 500 ms, missed at 1024 by max_running_requests=64 (its queue)."""
    vary = ("memory.max_running_requests=1024,64",)
    host = a_sweep_host(*vary)
    report = sweep(host, request(*vary, sla={"ttft_p99": 500}))
    assert isinstance(report, TuneReport)
    winner, missed = report.rows
    assert (missed.outcome, missed.sla_met) == ("missed SLA", False) and "p99 TTFT 1,600 ms > 500 ms" in missed.cause
    switches = host.switches()
    assert switches[-1] == f"releases/{winner.release_id}", "after the miss the best so far serves again"
    assert report.serving == winner.release_id == host.current


def test_keep_none_reports_the_winner_and_restores_the_original() -> None:
    host = a_sweep_host(*MRR)
    report = sweep(host, request(*MRR, keep="none"))
    assert isinstance(report, TuneReport)
    assert report.winner == "memory.max_running_requests=1024" and report.serving == "B" == host.current
    assert "keep: none" in report.reason


def test_ctrl_c_in_a_benchmark_leaves_the_best_so_far_serving_and_resume_finishes() -> None:
    host = a_sweep_host(*MRR)
    host.interrupt_at = (256, 1024)
    with pytest.raises(Interrupted, match=r"interrupted: release \S+ is serving") as caught:
        sweep(host, request(*MRR))
    assert caught.value.exit_code == 130
    tune_id = caught.value.hint.split("--resume ")[1].split("`")[0]  # type: ignore[union-attr]
    lines = host.tune_lines()
    best = next(line["release"] for line in lines if line["tune"].get("candidate") == "memory.max_running_requests=64")
    assert host.current == best, "the best verified release serves, not the half-measured one"
    left = sweep(host, Request(None, {}, resume=tune_id, dry_run=True))
    assert isinstance(left, Planned) and (left.estimate.starts, left.estimate.runs) == (Between(2, 5), 2), \
        "the dry run of a resume counts the two candidates left, no base run"
    report = sweep(host, Request(None, {}, resume=tune_id, grace_s=0))
    assert isinstance(report, TuneReport) and report.finished and report.tune_id == tune_id
    ran = [line["tune"].get("candidate") for line in host.tune_lines() if line["tune"]["role"] == "candidate"]
    assert ran == ["memory.max_running_requests=64", "memory.max_running_requests=256",
                   "memory.max_running_requests=1024"], "the finished candidate did not run again"
    assert [line["tune"]["role"] for line in host.tune_lines()].count("base") == BASE_RUNS
    assert report.winner == "memory.max_running_requests=1024" and host.current == report.serving


def test_the_top_two_within_the_noise_are_benchmarked_once_more_before_the_winner_is_named() -> None:
    """Input tried: chunked_prefill_size null or 4096, which the host serves at the same rate."""
    vary = ("memory.max_running_requests=1024", "memory.chunked_prefill_size=null,4096")
    host = a_sweep_host(*vary)
    report = sweep(host, request(*vary))
    assert isinstance(report, TuneReport)
    roles = [line["tune"]["role"] for line in host.tune_lines()]
    assert roles == ["start", "base", "base", "candidate", "candidate", "rerun", "rerun", "end"]
    assert [len(row.values) for row in report.rows] == [2, 2]
    assert report.winner is not None and host.current == report.serving
    measured = {line["tune"]["candidate"]: line["tune"]["changes"] for line in host.tune_lines()
                if line["tune"]["role"] == "candidate"}
    assert any(measured.values()) and {row.label: row.changes for row in report.rows} == measured, \
        "a candidate run again keeps what differs from the base in the table"
    notes = [text for kind, text in host.progress.events if kind == "note"]
    assert any("are within the noise" in str(text) for text in notes)


def test_a_signal_while_a_candidate_starts_finishes_the_switch_back_then_the_best_serves() -> None:
    """Input tried: SIGTERM during the readiness ladder of the third candidate (max_running_requests=1024)."""
    host = a_sweep_host(*MRR)
    host.interrupt_start = 1024
    with pytest.raises(Interrupted, match=r"interrupted: release \S+ is serving") as caught:
        sweep(host, request(*MRR))
    assert caught.value.exit_code == 143, "SIGTERM's exit code, through the engine's own transition"
    best = next(line["release"] for line in host.tune_lines()
                if line["tune"].get("candidate") == "memory.max_running_requests=256")
    assert host.current == best
    assert [line["tune"]["role"] for line in host.tune_lines()][-1] == "candidate", "the cut candidate is not recorded"


FOUR_CAPS = ("memory.max_running_requests=64,128,256,1024",)


def test_halving_benchmarks_every_candidate_short_then_the_best_half_in_full_and_keeps_the_winner() -> None:
    """Input tried: search halving (eta 2) over four caps: all four short (8 of 32 output tokens), 256 and 1024 full."""
    host = a_sweep_host(*FOUR_CAPS)
    report = sweep(host, request(*FOUR_CAPS, search="halving"))
    assert isinstance(report, TuneReport) and report.finished
    labels = [f"memory.max_running_requests={n}" for n in (64, 128, 256, 1024)]
    roles = [(line["tune"]["role"], line["tune"].get("candidate")) for line in host.tune_lines()]
    assert roles[3:7] == [("short", label) for label in labels]
    assert roles[7:] == [("eliminated", labels[0]), ("eliminated", labels[1]), ("candidate", labels[3]),
                         ("candidate", labels[2]), ("end", labels[3])], "survivors run full, best first"
    assert [line["figures"]["settings.output_len"] for line in host.tune_lines() if line["tune"]["role"] == "short"
            ] == [8.0] * 4, "the short round's benchmark has a quarter of the output tokens"
    full = [line for line in host.tune_lines() if line["tune"]["role"] in ("base", "candidate")]
    assert {line["figures"]["settings.output_len"] for line in full} == {32.0}
    by_label = {row.label: row for row in report.rows}
    assert [by_label[label].outcome for label in labels] == ["eliminated", "eliminated", "measured", "measured"]
    assert "eliminated by the short benchmark" in by_label[labels[0]].cause
    assert report.winner == labels[3] and "kept" in report.reason and host.current == report.serving
    deploys = [json.loads(line) for line in host.lines if json.loads(line)["event"] == "deploy"]
    assert [d["outcome"] for d in deploys][-4:] == ["healthy"] * 4, "every candidate it tried is a release"
    assert by_label[labels[3]].release_id == report.serving


def test_halving_resumed_after_the_short_round_does_not_run_it_again() -> None:
    """Input tried: Ctrl-C in the full benchmark of the first survivor (cap 1024 at concurrency 1024)."""
    host = a_sweep_host(*FOUR_CAPS)
    host.interrupt_at, host.interrupt_output_len = (1024, 1024), 32
    with pytest.raises(Interrupted) as caught:
        sweep(host, request(*FOUR_CAPS, search="halving"))
    tune_id = caught.value.hint.split("--resume ")[1].split("`")[0]  # type: ignore[union-attr]
    shorts = [line for line in host.tune_lines() if line["tune"]["role"] == "short"]
    assert len(shorts) == 4
    report = sweep(host, Request(None, {}, resume=tune_id, grace_s=0))
    assert isinstance(report, TuneReport) and report.finished
    roles = [line["tune"]["role"] for line in host.tune_lines()]
    assert roles.count("short") == 4 and roles.count("eliminated") == 2 and roles.count("candidate") == 2
    assert report.winner == "memory.max_running_requests=1024" and host.current == report.serving


def test_the_dry_run_of_halving_counts_short_runs_and_the_survivors_starts() -> None:
    host = a_sweep_host(*FOUR_CAPS)
    tune_spec, sources = sweep_spec(None, FOUR_CAPS, {"bench": BENCH, "search": "halving"})
    planned = sweep(host, Request(tune_spec, sources, dry_run=True))
    assert isinstance(planned, Planned)
    assert (planned.estimate.starts, planned.estimate.runs, planned.estimate.short_runs) == (Between(4 + 1, 4 + 2 + 3),
                                                                                             BASE_RUNS + 2, 4)
    assert planned.estimate.reruns == Between(0, 2)
    assert planned.estimate.short_fraction == 0.25


def test_the_switch_back_to_the_original_reads_its_weights_into_the_page_cache_before_the_stop() -> None:
    """keep: none: the sweep switches back to B through the rollback's path, and so its pre-read."""
    snapshot = "/root/.cache/huggingface/hub/models--lukealonso--GLM-5-NVFP4/snapshots/" + "c" * 40
    host = a_sweep_host(*MRR)
    host.releases["B"]["model"] = {"path": "lukealonso/GLM-5-NVFP4", "commit": "c" * 40,
                                   "hf_home": "/root/.cache/huggingface"}
    host.reply(f"{MEASURE}: {snapshot}", stdout="RESULT " + json.dumps(
        {"root": snapshot, "files": [{"path": snapshot + "/model.safetensors", "size": 10**9, "resident": 0}],
         "mem_available": 10**11}) + "\n")
    host.reply(READ, stdout='RESULT {"read_bytes": 1000000000}\n')
    assert isinstance(sweep(host, request(*MRR, keep="none")), TuneReport) and host.current == "B"
    names = host.ran_names()
    *_, last_candidate, back = [i for i, name in enumerate(names) if name == "switch: temp link"]
    assert READ in names[last_candidate:back], "read after the last candidate ran, before the switch back to B"


def _performed(*vary: str, **spec: object) -> tuple[Between, Between, int, int, int]:
    """The dry run's counts beside what the sweep of the same request then performed on the same host: releases
    started (deploys and switches in history) and benchmarks (re-runs apart)."""
    host = a_sweep_host(*vary)
    planned = sweep(host, Request(*sweep_spec(None, vary, {"bench": BENCH, "ladder": [64, 1024], **spec}),
                                  dry_run=True))
    assert isinstance(planned, Planned)
    known = len(host.lines)
    assert isinstance(sweep(host, request(*vary, **spec)), TuneReport)
    events = [json.loads(line) for line in host.lines[known:]]
    starts = sum(e["event"] in ACTIVATIONS and e["outcome"] == "healthy" for e in events)
    roles = [e["tune"]["role"] for e in events if e["event"] == "tune"]
    assert roles.count("base") + roles.count("candidate") == planned.estimate.runs
    assert roles.count("short") == planned.estimate.short_runs
    return planned.estimate.starts, planned.estimate.reruns, starts, roles.count("rerun"), len(roles)


@pytest.mark.parametrize(("vary", "spec", "started", "reran"), [
    (MRR, {}, 3, 0),                                   # the last candidate wins and serves on
    (MRR, {"keep": "none"}, 4, 0),                     # ... then the pre-sweep release serves again
    (("memory.max_running_requests=1024", "memory.chunked_prefill_size=2048,4096"), {}, 5, 2),  # the top two re-run
    (FOUR_CAPS, {"search": "halving"}, 6, 0),          # survivors 1024 (serving) and 256, then 1024 kept
])
def test_the_dry_runs_starts_and_benchmarks_are_the_ones_the_sweep_performs(
        vary: tuple[str, ...], spec: dict[str, str], started: int, reran: int) -> None:
    starts, reruns, performed, reran_runs, _ = _performed(*vary, **spec)
    assert (performed, reran_runs) == (started, reran)
    assert starts.fewest <= performed <= starts.most and reruns.fewest <= reran_runs <= reruns.most
