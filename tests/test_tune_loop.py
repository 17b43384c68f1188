"""The sweep on one host, against a scripted host whose store follows what the deploy engine writes (releases,
current, history) and whose benchmark answers from the serving release's profile (no SSH, no subprocess)."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import PurePosixPath

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.store_output import release_entries
from test_deploy_plan import PROJECT, options_accepting, target
from test_rollback import DEAD, READY, ScriptedHost, a_host

from deploy_cli.present import jsonable
from deploy_lib import store
from deploy_lib.errors import Interrupted
from deploy_lib.facts import host as host_facts
from deploy_lib.interrupts import Interrupt
from deploy_lib.profile import LoadedProfile
from deploy_lib.release.model import build_release
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import StoreLayout
from deploy_lib.throughput import STEP_BENCH_MODULE
from deploy_lib.throughput.history import throughput_by_release
from deploy_lib.tune import Planned, Request, TuneReport, show, sweep_spec, tune
from deploy_lib.tune.loop import BASE_RUNS
from deploy_lib.versions import BENCH_MODULES

LAYOUT = StoreLayout("sglang")
BASE = PROJECT.profile("glm5-nvfp4").model_copy()
BENCH = {"prompts": 1024, "input_len": 32, "output_len": 32}


def decode_rate(profile: dict, concurrency: int) -> float:
    """The host's figures: ~3.65 tok/s per running request up to max_running_requests, fusion 0.27x."""
    running = min(concurrency, profile["memory"].get("max_running_requests") or 1024)
    return running * 3.65 * (0.27 if profile["features"].get("allreduce_fusion") else 1.0)


class SweepHost(ScriptedHost):
    """a_host's releases A and B (B current), plus every release the engine stages; history as appended."""

    def __init__(self) -> None:
        host = a_host()
        self.__dict__.update(host.__dict__)
        self.probes = _Probes(self)
        self.releases: dict[str, dict] = {}
        for line in self._rules[::-1]:  # a_host's canned release.json files, read back
            if line.matches(Step(store.FACT_RELEASE_FILES, ("true",))):
                for record in line.stdout.splitlines():
                    path, _, text = record.partition("\0")
                    self.releases[path.split("/")[-2]] = json.loads(text)
                break
        self.lines = [line for line in self._history_text().splitlines(keepends=True)]
        self.interrupt_at: tuple[int, int] | None = None   # (max_running_requests, concurrency): Ctrl-C there, once
        self.interrupt_output_len: int | None = None       # ... in a benchmark of this many output tokens only
        self.interrupt_start: int | None = None            # max_running_requests: SIGTERM while it starts, once

    def _history_text(self) -> str:
        rule = next(r for r in reversed(self._rules) if r.matches(Step(store.FACT_HISTORY, ("true",))))
        return rule.stdout

    def current_metadata(self) -> dict:
        return self.releases[self.current]

    def _refresh(self) -> None:
        files = "".join(f"{LAYOUT.releases}/{rid}/release.json\0{json.dumps(meta)}\n"
                        for rid, meta in self.releases.items())
        sums = "".join(f"{d}  /x/{n}\n" for n, d in self.current_metadata()["files"].items())
        for name, out in ((store.FACT_CURRENT, f"releases/{self.current}\n"),
                          (store.FACT_RELEASE_DIRS, release_entries(*self.releases)),
                          (store.FACT_RELEASE_FILES, files), (store.FACT_HISTORY, "".join(self.lines)),
                          (host_facts.FACT_FILE_SUMS, sums),
                          ("router: serving release", json.dumps(self.current_metadata()))):
            self.reply(name, stdout=out)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        self._refresh()
        for step in batch:
            if isinstance(step, Step) and step.name == host_facts.FACT_RELEASE_SUMS:
                rid = PurePosixPath(step.argv[-1]).parent.name
                sums = self.releases.get(rid, {}).get("files", {})
                self.reply(step.name, stdout="".join(f"{d}  /x/{n}\n" for n, d in sums.items()), times=1)
            if isinstance(step, Step) and step.name.startswith("bench: concurrency "):
                level = int(step.name.rsplit(" ", 1)[1])
                running = self.current_metadata()["profile"]["memory"].get("max_running_requests")
                argv = list(step.argv)
                output_len = int(argv[argv.index("--random-output-len") + 1]) if "--random-output-len" in argv else 0
                if self.interrupt_at == (running, level) and self.interrupt_output_len in (None, output_len):
                    self.interrupt_at = None
                    raise Interrupt(signal.SIGINT)
                self.reply(f"bench: read c{level}.jsonl", stdout=self._jsonl(level), times=1)
                watts = 100 + decode_rate(self.current_metadata()["profile"], level) / 25
                self.reply("bench: read gpus.csv", times=1, stdout="".join(
                    f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 90000, {watts:.2f}, "
                    "600.00, 90, 580.95.05\n" for i in range(8)))
        results = super().run(batch, on_output)
        for step in batch:
            if isinstance(step, Put) and step.dest.name == store.RELEASE_FILE:
                meta = json.loads(step.data)
                self.releases[meta["id"]] = meta
            if isinstance(step, Step) and step.name == "history: append":
                self.lines.append(step.stdin.decode())  # type: ignore[union-attr]
        return results

    def _jsonl(self, concurrency: int) -> str:
        profile = self.current_metadata()["profile"]
        rate = decode_rate(profile, concurrency)
        queued = max(1.0, concurrency / (profile["memory"].get("max_running_requests") or 1024))
        duration = 1024 * 32 / rate
        return json.dumps({"completed": 1024, "duration": duration, "output_throughput": rate,
                           "mean_ttft_ms": 90 * queued, "median_ttft_ms": 80 * queued, "p99_ttft_ms": 100 * queued,
                           "mean_itl_ms": 9.0, "median_itl_ms": 9.0, "p99_itl_ms": 12.0, "mean_tpot_ms": 9.0,
                           "median_tpot_ms": 9.0, "p99_tpot_ms": 11.0, "max_concurrency": concurrency}) + "\n"

    def tune_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.lines if json.loads(line)["event"] == "tune"]


class _Probes(dict):  # type: ignore[type-arg]
    """Readiness: a release whose mem_fraction_static is 0.99 dies at start (SGLang's out of memory), one whose
    max_running_requests is `interrupt_start` gets Ctrl-C while it starts (once), the others serve."""

    def __init__(self, host: SweepHost) -> None:
        super().__init__()
        self.host = host

    def __missing__(self, release_id: str) -> list[object]:
        memory = self.host.releases[release_id]["profile"]["memory"]
        if memory.get("max_running_requests") == self.host.interrupt_start:
            self.host.interrupt_start = None
            return [Interrupt(signal.SIGTERM), READY]
        return [DEAD] if memory.get("mem_fraction_static") == 0.99 else [READY]


def sglang_knowing_every_flag(host: SweepHost, *profiles: LoadedProfile) -> None:
    args = [a for p in profiles for a in build_release(p, LAYOUT, "0.5.23", {}).args]
    sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
              "options": options_accepting((*args, "--revision", "c" * 40))}
    host.reply(host_facts.FACT_SGLANG, stdout=json.dumps(sglang))
    host.reply(STEP_BENCH_MODULE, stdout=BENCH_MODULES[-1].module + "\n")


def request(*vary: str, **spec: object) -> Request:
    tune_spec, sources = sweep_spec(None, vary, {"bench": BENCH, "ladder": [64, 1024], **spec})
    return Request(tune_spec, sources, grace_s=0)


def sweep(host: SweepHost, req: Request, loaded: LoadedProfile = BASE) -> TuneReport | Planned:
    host.progress = RecordingProgress()
    return tune(loaded, target(), host, host.progress, req)


def a_sweep_host(*vary: str) -> SweepHost:
    host = SweepHost()
    host.releases = {rid: {**meta, "profile": {**meta["profile"], "memory": {
        **meta["profile"]["memory"], "max_running_requests": 64}}} for rid, meta in host.releases.items()}
    sglang_knowing_every_flag(host, BASE, *(c.loaded for c in _candidates(vary)))
    return host


def _candidates(vary: Sequence[str]) -> list:
    from deploy_lib.tune.sweep import build_sweep

    spec, sources = sweep_spec(None, vary, {"bench": BENCH})
    return list(build_sweep(BASE, spec, sources, (), None).candidates)


MRR = ("memory.max_running_requests=64,256,1024",)


def test_the_dry_run_lists_candidates_flag_by_flag_and_changes_nothing() -> None:
    host = a_sweep_host(*MRR)
    planned = sweep(host, Request(*sweep_spec(None, MRR, {"bench": BENCH}), dry_run=True))
    assert isinstance(planned, Planned) and planned.original == "B"
    assert {label: [str(c) for c in changes if c.kind == "flag"] for label, changes in planned.changes.items()} == {
        "memory.max_running_requests=64": ["~ flag --max-running-requests: 1024 -> 64"],
        "memory.max_running_requests=256": ["~ flag --max-running-requests: 1024 -> 256"],
        "memory.max_running_requests=1024": []}
    assert planned.estimate.starts == 4 and planned.estimate.runs == BASE_RUNS + 3 + 2
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
    assert isinstance(left, Planned) and (left.estimate.starts, left.estimate.runs) == (3, 2 + 2), \
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
    assert (planned.estimate.starts, planned.estimate.runs, planned.estimate.short_runs) == (4 + 1 + 2,
                                                                                             BASE_RUNS + 2 + 2, 4)
    assert planned.estimate.short_fraction == 0.25
