"""Benchmark parsing on real SGLang benchmark output, the gate table, baselines from history, the host steps."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from pydantic import ValidationError

from deploy_lib.errors import ConfigError, GateFailed, StepFailed
from deploy_lib.host.benchmark import (
    STEP_BENCH_MODULE,
    STEP_SAMPLER_START,
    STEP_SAMPLER_STOP,
    gate_after_ready,
    run_benchmark,
)
from deploy_lib.profile.settings import BenchSettings, GateSettings
from deploy_lib.remote import round_trips
from deploy_lib.store import FAILED, HEALTHY, HistoryEntry, StoreLayout, Tags, history_entry
from deploy_lib.throughput import (
    BenchResult,
    Latency,
    LevelResult,
    bench_history_entry,
    compare,
    compare_releases,
    comparison_records,
    evaluate_gate,
    find_baseline,
    parse_level,
    parse_telemetry,
    power_by_release,
    throughput_by_release,
)
from deploy_lib.throughput.results import WALL_KEY
from deploy_lib.versions import BENCH_MODULES

pytest_plugins = ("helpers.wheelcache",)

DATA = Path(__file__).parent / "data" / "bench"
MODULE_OLD, MODULE_NEW = (m.module for m in BENCH_MODULES)
LAYOUT = StoreLayout(service="sglang")
WHEN = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTINGS = BenchSettings(prompts=256, input_len=128, output_len=64, concurrency=[64])
GATE = GateSettings()


def real_line(name: str) -> str:
    return (DATA / name).read_text()


def tags(release: str, profile: str = "glm5-nvfp4") -> Tags:
    return Tags(who="op@box", host="th1", release=release, profile=profile, profile_hash="h" + release,
                versions={"sglang": "0.5.23"})


def level(concurrency: int, tok_s: float, ttft_p99: float | None = 100.0) -> LevelResult:
    return LevelResult(concurrency, 256, 10.0, tok_s, Latency(50.0, 40.0, ttft_p99), Latency(70.0, 70.0, 140.0),
                       Latency(20.0, 19.0, 30.0))


def result(release: str, *levels: LevelResult, settings: BenchSettings = SETTINGS, error: str | None = None
           ) -> BenchResult:
    return BenchResult(release, settings, tuple(levels), error=error)


def metadata(release: str = "r2", venv: str = "/opt/ml-env", host: str = "0.0.0.0", port: int = 8000,
             environment: dict[str, str] | None = None) -> dict:
    return {"id": release, "venv": venv, "environment": environment or {"PYTHONUNBUFFERED": "1"},
            "profile": {"model": {"path": "lukealonso/GLM-5-NVFP4", "tokenizer": None},
                        "server": {"host": host, "port": port}}}


# --- parsing real JSONL -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "concurrency", "prompts"), [
    ("sglang-0.5.23-c64.jsonl", 64, 256), ("sglang-0.5.23-c1024.jsonl", 1024, 1024),
    ("sglang-0.5.9-c64.jsonl", 64, 128)])
def test_parse_level_reads_the_figures_of_real_benchmark_lines(name: str, concurrency: int, prompts: int) -> None:
    raw = json.loads(real_line(name))
    parsed = parse_level(real_line(name), concurrency, prompts)
    assert parsed.output_tok_s == raw["output_throughput"] and parsed.completed == raw["completed"] == prompts
    assert parsed.duration_s == raw["duration"]
    assert (parsed.ttft.mean_ms, parsed.ttft.median_ms, parsed.ttft.p99_ms) == (
        raw["mean_ttft_ms"], raw["median_ttft_ms"], raw["p99_ttft_ms"])
    assert (parsed.itl.mean_ms, parsed.itl.median_ms, parsed.itl.p99_ms) == (
        raw["mean_itl_ms"], raw["median_itl_ms"], raw["p99_itl_ms"])
    assert (parsed.tpot.mean_ms, parsed.tpot.median_ms, parsed.tpot.p99_ms) == (
        raw["mean_tpot_ms"], raw["median_tpot_ms"], raw["p99_tpot_ms"]), "the SLA of `invoke tune` reads p99 TPOT"
    assert parsed.request_rate == pytest.approx(raw["completed"] / raw["duration"])
    assert raw["max_concurrency"] == concurrency


def test_parse_level_takes_the_last_line_of_an_appended_file() -> None:
    appended = real_line("sglang-0.5.23-c1024.jsonl") + real_line("sglang-0.5.23-c64.jsonl")
    assert parse_level(appended, 64, 256).output_tok_s == pytest.approx(871.17, abs=0.01)


def test_parse_level_refuses_missing_or_incomplete_results() -> None:
    with pytest.raises(ValueError, match="no result line"):
        parse_level("", 64, 256)
    with pytest.raises(ValueError, match="only 256 of 300 requests completed"):
        parse_level(real_line("sglang-0.5.23-c64.jsonl"), 64, 300)
    broken = json.loads(real_line("sglang-0.5.23-c64.jsonl")) | {"p99_ttft_ms": None}
    with pytest.raises(ValueError, match="p99_ttft_ms"):
        parse_level(json.dumps(broken), 64, 256)


@pytest.mark.wheels
@pytest.mark.parametrize(("version", "module"), [("0.5.9", "sglang/bench_serving.py"),
                                                 ("0.5.23", "sglang/benchmark/serving.py")])
def test_the_keys_read_are_written_by_sglangs_benchmark(sglang_source, version: str, module: str) -> None:
    source = (sglang_source(version) / module).read_text()
    keys = ("output_throughput", "completed", "duration", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
            "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
            "max_concurrency")
    assert [key for key in keys if f'"{key}":' not in source] == []
    for flag in ("--dataset-name", "--tokenizer", "--num-prompts", "--random-input-len", "--random-output-len",
                 "--random-range-ratio", "--max-concurrency", "--output-file", "--base-url", "--backend"):
        assert f'"{flag}"' in source, flag
    assert '"random-ids"' in source


# --- telemetry --------------------------------------------------------------------------------------------

TELEMETRY = """\
0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-1, 12.0, 97887, 90000, 80.00, 600.00, 30, 580.95.05
1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-2, 12.0, 97887, 90000, [N/A], 600.00, [N/A], 580.95.05
0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-1, 12.0, 97887, 91000, 250.00, 600.00, 100, 580.95.05
1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-2, 12.0, 97887, 90500, 240.00, 600.00, 90, 580.95.05
Unable to determine the device handle for GPU0000:01:00.0: Unknown Error
"""


def test_telemetry_mean_and_peak_power_per_gpu_against_the_limit() -> None:
    gpu0, gpu1 = parse_telemetry(TELEMETRY)
    assert (gpu0.samples, gpu0.power_mean_w, gpu0.power_peak_w, gpu0.power_limit_w) == (2, 165.0, 250.0, 600.0)
    assert (gpu0.util_mean_pct, gpu0.util_peak_pct, gpu0.memory_peak_mib) == (65.0, 100.0, 91000.0)
    assert (gpu1.power_mean_w, gpu1.util_mean_pct) == (240.0, 90.0)  # [N/A] samples are left out
    assert gpu0.line() == ("GPU 0: power mean 165 W, peak 250 W of 600 W; utilization 65% (peak 100%); "
                           "memory peak 91000 of 97887 MiB")
    assert parse_telemetry("") == ()


# --- the gate ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("new_tok_s", "new_ttft", "passed"), [
    (880.0, 100.0, True),    # same
    (792.0, 100.0, True),    # exactly 0.9x
    (236.0, 100.0, False),   # the fused release on SM120
    (790.0, 100.0, False),   # just below 0.9x
    (900.0, 125.0, True),    # p99 TTFT exactly 1.25x
    (900.0, 130.0, False),   # p99 TTFT worse than 1.25x
    (900.0, None, True),     # no p99 TTFT figure: throughput decides
])
def test_gate_table(new_tok_s: float, new_ttft: float | None, passed: bool) -> None:
    verdict = evaluate_gate(result("r2", level(64, new_tok_s, new_ttft)), result("r1", level(64, 880.0)), GATE)
    assert verdict.passed is passed
    assert verdict.baseline_release == "r1"
    assert f"{new_tok_s:,.1f} tok/s at concurrency 64 vs 880.0 tok/s for release r1" in verdict.message


def test_gate_fails_when_any_level_is_below_and_names_that_level() -> None:
    settings = BenchSettings(prompts=1024, input_len=128, output_len=64, concurrency=[64, 1024])
    new = result("r2", level(64, 870.0), level(1024, 1003.0), settings=settings)
    old = result("r1", level(64, 880.0), level(1024, 3740.0), settings=settings)
    verdict = evaluate_gate(new, old, GATE)
    assert not verdict.passed
    assert "1,003.0 tok/s at concurrency 1024 vs 3,740.0 tok/s for release r1 (0.27x, minimum 0.90x)" in verdict.message
    assert "concurrency 64" not in verdict.message  # only the failing level is named


def test_gate_custom_ratios() -> None:
    verdict = evaluate_gate(result("r2", level(64, 700.0)), result("r1", level(64, 880.0)),
                            GateSettings(min_throughput_ratio=0.75))
    assert verdict.passed and "within the gate" in verdict.message


def test_no_baseline_passes_and_says_so() -> None:
    verdict = evaluate_gate(result("r1", level(64, 880.0)), None, GATE)
    assert verdict.passed and verdict.baseline_release is None
    assert "no baseline at these settings" in verdict.message and "880 tok/s @64" in verdict.message


@pytest.mark.parametrize("baseline", [None, result("r1", level(64, 880.0))])
def test_a_benchmark_that_did_not_run_fails_the_gate(baseline: BenchResult | None) -> None:
    verdict = evaluate_gate(result("r2", error="sglang.benchmark.serving at concurrency 64 exited 1: refused"),
                            baseline, GATE)
    assert not verdict.passed and "the benchmark failed, so the gate fails" in verdict.message
    assert not evaluate_gate(result("r2"), baseline, GATE).passed  # no levels at all is no pass either


# --- history and baselines --------------------------------------------------------------------------------


def deployed(release: str, outcome: str = HEALTHY, event: str = "deploy") -> HistoryEntry:
    return history_entry(event, outcome, tags(release), WHEN)


def benched(release: str, tok_s: float, settings: BenchSettings = SETTINGS, passed: bool = True) -> HistoryEntry:
    bench = result(release, *(level(c, tok_s) for c in settings.concurrency), settings=settings)
    verdict = evaluate_gate(bench, None, GATE) if passed else evaluate_gate(bench, result("x", level(64, 1e6)), GATE)
    return bench_history_entry(bench, verdict, tags(release), WHEN)


def test_history_entry_round_trips_the_figures_and_settings() -> None:
    settings = BenchSettings(prompts=1024, input_len=128, output_len=32, concurrency=[64, 1024])
    bench = BenchResult("r1", settings, (level(64, 871.17), level(1024, 3382.63)),
                        parse_telemetry(TELEMETRY))
    entry = bench_history_entry(bench, evaluate_gate(bench, None, GATE), tags("r1"), WHEN)
    again = HistoryEntry.from_json(entry.to_json().decode())
    assert (again.event, again.outcome) == ("bench", HEALTHY) and "no baseline" in again.cause
    assert again.figures["c1024.output_tok_s"] == 3382.63 and again.figures["gpu0.power_mean_w"] == 165.0
    assert again.figures["settings.output_len"] == 32.0
    rebuilt = BenchResult.from_figures("r1", again.figures)
    assert rebuilt.levels == bench.levels
    assert rebuilt.settings.identity() == settings.identity() and rebuilt.settings.concurrency == [64, 1024]


def test_baseline_is_the_last_good_release_at_the_same_settings() -> None:
    history = [deployed("r1"), benched("r1", 880.0), deployed("r2"), benched("r2", 860.0)]
    baseline = find_baseline(history, SETTINGS, "r3")
    assert baseline is not None and baseline.release_id == "r2" and baseline.levels[0].output_tok_s == 860.0


def test_baseline_skips_the_new_release_and_failed_benchmarks() -> None:
    history = [deployed("r1"), benched("r1", 880.0), deployed("r2"), benched("r2", 236.0, passed=False),
               deployed("r1", event="rollback")]
    assert find_baseline(history, SETTINGS, "r2").release_id == "r1"  # type: ignore[union-attr]
    # redeploying r1 itself: r1 is excluded, r2 was never benchmarked healthy -> no baseline
    assert find_baseline(history[:4], SETTINGS, "r1") is None


@pytest.mark.parametrize("other", [
    BenchSettings(prompts=256, input_len=128, output_len=32, concurrency=[64]),
    BenchSettings(prompts=512, input_len=128, output_len=64, concurrency=[64]),
    BenchSettings(prompts=256, input_len=128, output_len=64, concurrency=[64, 128]),
    BenchSettings(prompts=256, input_len=128, output_len=64, concurrency=[64], backend="sglang-oai"),
])
def test_no_baseline_at_other_settings(other: BenchSettings) -> None:
    history = [deployed("r1"), benched("r1", 880.0)]
    assert find_baseline(history, other, "r2") is None
    assert find_baseline(history, SETTINGS, "r2") is not None


def test_no_baseline_without_a_healthy_release() -> None:
    assert find_baseline([deployed("r1", FAILED), benched("r1", 880.0)], SETTINGS, "r2") is None


def test_releases_show_their_newest_throughput() -> None:
    """A release the gate failed shows what it measured (its outcome column says failed)."""
    history = [benched("r1", 800.0), benched("r1", 880.0), benched("r2", 236.0, passed=False)]
    assert throughput_by_release(history) == {"r1": "880 tok/s @64", "r2": "236 tok/s @64"}


def test_releases_say_which_workload_their_newest_throughput_was_measured_on() -> None:
    """Input tried: r1 benchmarked on the recorded workload `chat`, r2 on one whose file is gone, r3 on the default
    benchmark (`releases` showed three bare tok/s figures, as if alike)."""
    chat, gone = (SETTINGS.model_copy(update={"workload": name}) for name in ("chat", "old-chat"))
    history = [benched("r1", 700.0, chat), benched("r2", 650.0, gone), benched("r3", 880.0)]
    assert throughput_by_release(history, ["chat"]) == {
        "r1": "700 tok/s @64 on workload chat", "r2": "650 tok/s @64 on a workload not recorded here",
        "r3": "880 tok/s @64"}


def test_compare_side_by_side_with_ratio() -> None:
    rows = {row.label: row for row in compare([result("r1", level(64, 880.0)), result("r2", level(64, 236.0))])}
    assert rows["c=64 output tok/s"].values == (880.0, 236.0)
    assert rows["c=64 output tok/s"].ratios == (1.0, pytest.approx(236.0 / 880.0))
    assert rows["c=64 p99 TTFT ms"].ratios == (1.0, 1.0)


def test_compare_takes_any_number_of_releases_and_their_levels_need_not_match() -> None:
    """Input tried: three releases, the third benchmarked at another concurrency."""
    results = [result("r1", level(64, 880.0)), result("r2", level(64, 236.0)), result("r3", level(128, 990.0))]
    rows = {row.label: row for row in compare(results)}
    assert rows["c=64 output tok/s"].values == (880.0, 236.0, None)
    assert rows["c=128 output tok/s"].ratios == (None, None, None), "no first value: no ratio"
    records = comparison_records(results, list(rows.values()))
    assert {"release": "r3", "figure": "c=128 output tok/s", "value": 990.0, "ratio_to_first": None} in records
    assert len(records) == 3 * len(rows)


# --- settings ---------------------------------------------------------------------------------------------


def test_settings_defaults_and_validation() -> None:
    assert BenchSettings().concurrency == [64, 1024] and GateSettings().min_throughput_ratio == 0.9
    with pytest.raises(ValidationError, match="below the highest concurrency"):
        BenchSettings(prompts=100, concurrency=[64, 1024])
    with pytest.raises(ValidationError, match="Extra inputs"):
        BenchSettings.model_validate({"promts": 10})
    with pytest.raises(ValidationError):
        BenchSettings(tokenizer="/tmp/tok; rm -rf /")
    with pytest.raises(ValidationError, match="repeat"):
        BenchSettings(concurrency=[64, 64])


# --- steps on the host ------------------------------------------------------------------------------------


def host(module: str = MODULE_NEW) -> FakeRemote:
    remote = FakeRemote()
    remote.reply(STEP_BENCH_MODULE, stdout=module + "\n")
    remote.reply("bench: read c64.jsonl", stdout=real_line("sglang-0.5.23-c64.jsonl"))
    remote.reply("bench: read gpus.csv", stdout=TELEMETRY)
    return remote


def bench_steps(remote: FakeRemote) -> list:
    return [step for step in remote.ran if step.name.startswith("bench: concurrency")]


def test_each_level_sends_prompts_sized_to_its_concurrency_and_is_judged_complete_on_them() -> None:
    """The profile's 1,024 prompts are a ceiling: concurrency 1 sends 32 (the floor), not all 1,024 one at a time."""
    remote = host()
    one = {**json.loads(real_line("sglang-0.5.23-c64.jsonl").splitlines()[-1]), "completed": 32, "max_concurrency": 1}
    remote.reply("bench: read c1.jsonl", stdout=json.dumps(one) + "\n")
    settings = BenchSettings(prompts=1024, input_len=128, output_len=64, concurrency=[1, 64])
    bench = run_benchmark(remote, LAYOUT, metadata(), settings, RecordingProgress())
    sent = {step.name: step.argv[step.argv.index("--num-prompts") + 1] for step in bench_steps(remote)}
    assert sent == {"bench: concurrency 1": "32", "bench: concurrency 64": "320"}
    assert bench.levels[0].completed == 32 and bench.error == "only 256 of 320 requests completed at concurrency 64"


def test_run_benchmark_runs_sglangs_benchmark_on_the_host_and_reads_its_jsonl() -> None:
    remote, progress = host(), RecordingProgress()
    environment = {"HF_HOME": "/data/hf", "PYTHONUNBUFFERED": "1"}
    bench = run_benchmark(remote, LAYOUT, metadata(environment=environment), SETTINGS, progress)
    assert bench.ok and bench.levels[0].output_tok_s == pytest.approx(871.17, abs=0.01)
    assert [gpu.index for gpu in bench.gpus] == [0, 1]
    (step,) = bench_steps(remote)
    argv = step.argv
    assert argv[:4] == ("sh", "-c", 'ulimit -n "$(ulimit -Hn)"; exec "$@"', "bench")  # 1,024 sockets need it
    assert argv[4:8] == ("env", "HF_HOME=/data/hf", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
    assert "PYTHONUNBUFFERED=1" not in argv
    assert argv[8:11] == ("/opt/ml-env/bin/python3", "-m", MODULE_NEW)
    flags = dict(zip(argv[11::2], argv[12::2], strict=True))
    output = flags.pop("--output-file")
    assert flags == {"--backend": "sglang", "--base-url": "http://127.0.0.1:8000", "--dataset-name": "random-ids",
                     "--tokenizer": "lukealonso/GLM-5-NVFP4", "--num-prompts": "256", "--random-input-len": "128",
                     "--random-output-len": "64", "--random-range-ratio": "1", "--max-concurrency": "64"}
    assert re.fullmatch(r"/opt/sglang-deploy/sglang/bench/r2-[0-9a-f]{8}/c64\.jsonl", output)
    names = remote.ran_names()
    assert names.index(STEP_SAMPLER_START) < names.index("bench: concurrency 64") < names.index(STEP_SAMPLER_STOP)
    assert names[-1] == "bench: remove run directory"
    assert ("note", "benchmark: 871.2 tok/s at concurrency 64, p99 TTFT 114 ms") in progress.events


def test_a_benchmark_records_its_wall_time_beside_the_timed_levels() -> None:
    """What a level costs around its timed requests (the client, the sampler, reading back) is kept in history,
    where a sweep's estimate reads it. Input tried: a clock that reads 100 s at the start and 107.5 s at the end."""
    readings = iter((100.0, 107.5))
    bench = run_benchmark(host(), LAYOUT, metadata(), SETTINGS, RecordingProgress(), clock=lambda: next(readings))
    assert bench.wall_s == 7.5 and bench.figures()[WALL_KEY] == 7.5
    assert [level.concurrency for level in BenchResult.from_figures("r2", bench.figures()).levels] == [64], \
        "the wall time is no level of its own"


def test_a_benchmark_is_three_round_trips_and_a_venv_is_inspected_once_for_a_sweeps_runs() -> None:
    """The module check, the sampler's start with the first level, the results; a second run of the same venv
    (`modules` kept between runs, as a sweep keeps it) skips the check."""
    remote, modules = host(), dict[str, str]()
    first = run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress(), modules=modules)
    assert first.ok and [len(round_trips(batch)) for batch in remote.batches] == [1, 1, 1]
    assert [batch[-1].name for batch in remote.batches] == [STEP_BENCH_MODULE, "bench: concurrency 64",
                                                            "bench: remove run directory"]
    assert [step.name for step in remote.batches[1]][:2] == ["bench: run directory", STEP_SAMPLER_START]
    remote.batches.clear()
    second = run_benchmark(remote, LAYOUT, metadata("r3"), SETTINGS, RecordingProgress(), modules=modules)
    assert second.ok and [batch[-1].name for batch in remote.batches] == ["bench: concurrency 64",
                                                                           "bench: remove run directory"]
    assert modules == {"/opt/ml-env/bin/python3": MODULE_NEW}


def test_a_venv_without_the_benchmark_is_not_remembered_as_having_one() -> None:
    remote, modules = host(module=""), dict[str, str]()
    assert not run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress(), modules=modules).ok
    assert modules == {}


def test_old_sglang_runs_the_old_module_and_a_tokenizer_setting_wins() -> None:
    remote = host(MODULE_OLD)
    settings = SETTINGS.model_copy(update={"tokenizer": "/opt/tokenizers/glm5"})
    run_benchmark(remote, LAYOUT, metadata(host="10.0.0.5"), settings, RecordingProgress())
    argv = bench_steps(remote)[0].argv
    assert argv[argv.index("-m") + 1] == MODULE_OLD
    assert argv[argv.index("--tokenizer") + 1] == "/opt/tokenizers/glm5"
    assert argv[argv.index("--base-url") + 1] == "http://10.0.0.5:8000"


def test_the_api_key_goes_on_stdin_not_argv() -> None:
    remote = host()
    run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress(), api_key="s3cret")
    step = bench_steps(remote)[0]
    assert step.stdin == b"s3cret\n" and step.secret
    assert not any("s3cret" in arg for s in remote.ran_argvs() for arg in s)


def test_a_venv_without_the_benchmark_is_a_failed_benchmark() -> None:
    remote = host(module="")
    bench = run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress())
    assert not bench.ok and "no SGLang serving benchmark" in bench.error  # type: ignore[operator]
    assert bench_steps(remote) == []


def test_a_benchmark_that_exits_nonzero_fails_with_its_last_lines_and_the_sampler_is_stopped() -> None:
    remote = host()
    remote.reply("bench: concurrency 64", exit_code=1, stderr=real_line("sglang-0.5.23-server-died.stderr"))
    remote.reply("bench: read c64.jsonl", exit_code=1, stderr="cat: c64.jsonl: No such file or directory")
    bench = run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress())
    assert not bench.ok and bench.levels == ()
    assert bench.error.startswith(f"{MODULE_NEW} at concurrency 64 exited 1: ")  # type: ignore[union-attr]
    assert "Connection refused" in bench.error  # type: ignore[operator]
    assert STEP_SAMPLER_STOP in remote.ran_names() and remote.ran_names()[-1] == "bench: remove run directory"
    assert not evaluate_gate(bench, result("r1", level(64, 880.0)), GATE).passed


def test_a_timed_out_benchmark_says_so_and_later_levels_do_not_run() -> None:
    remote = host()
    settings = BenchSettings(prompts=1024, input_len=128, output_len=64, concurrency=[64, 1024], timeout_s=60)
    remote.reply("bench: concurrency 64", exit_code=124)
    bench = run_benchmark(remote, LAYOUT, metadata(), settings, RecordingProgress())
    assert "at concurrency 64 timed out" in bench.error  # type: ignore[operator]
    assert [s.name for s in bench_steps(remote)] == ["bench: concurrency 64"]


def test_a_lost_connection_during_the_benchmark_is_a_failed_benchmark() -> None:
    remote = host()
    remote.reply("bench: concurrency 64", raises=StepFailed("connection lost"))
    bench = run_benchmark(remote, LAYOUT, metadata(), SETTINGS, RecordingProgress())
    assert not bench.ok and "could not run: connection lost" in bench.error  # type: ignore[operator]


def test_gate_after_ready_records_history_and_raises_gate_failed_with_both_figures() -> None:
    remote = host()
    remote.reply("bench: read c64.jsonl", stdout=real_line("sglang-0.5.23-c64.jsonl").replace(
        '"output_throughput": 871.', '"output_throughput": 236.'))
    history = [deployed("r1"), benched("r1", 880.0)]
    with pytest.raises(GateFailed) as failure:
        gate_after_ready(remote, LAYOUT, metadata("r2"), tags("r2", "glm5-nvfp4-fusion"), SETTINGS, GATE, history,
                         RecordingProgress())
    assert "236.2 tok/s at concurrency 64 vs 880.0 tok/s for release r1 (0.27x" in failure.value.message
    assert failure.value.rung == "benchmark" and failure.value.evidence[0].startswith("GPU 0: power mean")
    recorded = HistoryEntry.from_json(remote.ran[-1].stdin.decode())  # type: ignore[union-attr]
    assert (recorded.event, recorded.outcome, recorded.tags.release) == ("bench", FAILED, "r2")
    assert recorded.figures["c64.output_tok_s"] == pytest.approx(236.17, abs=0.01)


def test_gate_after_ready_keeps_a_release_within_the_ratio() -> None:
    remote = host()
    run = gate_after_ready(remote, LAYOUT, metadata("r2"), tags("r2"), SETTINGS, GATE,
                           [deployed("r1"), benched("r1", 900.0)], RecordingProgress())
    assert run.verdict.passed and run.verdict.baseline_release == "r1"
    recorded = HistoryEntry.from_json(remote.ran[-1].stdin.decode())  # type: ignore[union-attr]
    assert recorded.outcome == HEALTHY and "within the gate" in recorded.cause


def test_compare_releases_from_history_names_a_release_without_a_benchmark() -> None:
    history = [benched("r1", 880.0), benched("r2", 236.0, passed=False)]
    results, rows = compare_releases(history, ["r1", "r2"])
    assert [r.release_id for r in results] == ["r1", "r2"] and rows[0].ratios[1] == pytest.approx(236.0 / 880.0)
    with pytest.raises(ConfigError, match="release r9 has no benchmark") as caught:
        compare_releases(history, ["r1", "r9"])
    assert "r1, r2" in str(caught.value.hint)
    with pytest.raises(ConfigError, match="needs two releases or more, got 1"):
        compare_releases(history, ["r1"])


def test_compare_refuses_releases_measured_on_different_workloads_and_names_each() -> None:
    """Input tried: `bench --compare r1 --compare r2 --compare r3`, r1 on the default benchmark, r2 on the recorded
    workload `chat`, r3 on a workload whose file is gone (compared side by side before, as if alike)."""
    chat, gone = (SETTINGS.model_copy(update={"workload": name}) for name in ("chat", "old-chat"))
    history = [benched("r1", 880.0), benched("r2", 700.0, chat), benched("r3", 650.0, gone)]
    with pytest.raises(ConfigError) as caught:
        compare_releases(history, ["r1", "r2", "r3"], workload_names=["chat", "batch"])
    assert str(caught.value).startswith(
        "the releases' newest benchmarks were measured on different workloads (r1 on default, r2 on workload chat, "
        "r3 on a workload not recorded here); figures are compared only when measured on the same one")
    assert caught.value.exit_code == 2
    history.append(benched("r1", 720.0, chat))  # r1 again, on chat: comparable now
    _, rows = compare_releases(history, ["r1", "r2"], workload_names=["chat"])
    assert rows[0].ratios[1] == pytest.approx(700.0 / 720.0)


def test_releases_show_the_gpu_power_of_their_newest_benchmark() -> None:
    gpus = parse_telemetry(TELEMETRY)
    bench = BenchResult("r1", SETTINGS, (level(64, 880.0),), gpus)
    history = [bench_history_entry(bench, evaluate_gate(bench, None, GATE), tags("r1"), WHEN), benched("r2", 236.0)]
    mean = sum(g.power_mean_w or 0 for g in gpus) / len(gpus)
    peak = max(g.power_peak_w or 0 for g in gpus)
    limit = max(g.power_limit_w or 0 for g in gpus)
    assert power_by_release(history) == {"r1": f"{mean:.0f} W mean, {peak:.0f} W peak of {limit:.0f} W",
                                         "r2": ""}, "a benchmark without telemetry shows no power"


# --- a recorded workload (issue 42) --------------------------------------------------------------------------


def test_a_workloads_shape_reaches_bench_servings_flags() -> None:
    shaped = SETTINGS.model_copy(update={"workload": "chat", "input_len": 1990, "output_len": 16,
                                         "range_ratio": 0.029})
    remote = host()
    run_benchmark(remote, LAYOUT, metadata(), shaped, RecordingProgress())
    (step,) = bench_steps(remote)
    start = step.argv.index("--backend")
    flags = dict(zip(step.argv[start::2], step.argv[start + 1::2], strict=True))
    assert (flags["--random-input-len"], flags["--random-output-len"], flags["--random-range-ratio"]) == (
        "1990", "16", "0.029")
    assert shaped.describe().startswith("workload chat: 256 prompts at most of 1990 -> 16 tokens, each drawn from 3%")


def test_a_baseline_is_only_one_measured_on_the_same_workload() -> None:
    chat = SETTINGS.model_copy(update={"workload": "chat", "range_ratio": 0.5})
    other = chat.model_copy(update={"workload": "inventory/workloads/batch.yaml"})
    on_chat = [deployed("r1"), benched("r1", 880.0, settings=chat)]
    assert find_baseline(on_chat, chat, "r2").release_id == "r1"  # type: ignore[union-attr]
    same_name = chat.model_copy(update={"workload": "/elsewhere/chat.yaml"})
    assert find_baseline(on_chat, same_name, "r2").release_id == "r1"  # type: ignore[union-attr]
    assert find_baseline(on_chat, SETTINGS, "r2") is None  # the default benchmark never compares to chat's
    assert find_baseline(on_chat, other, "r2") is None     # nor one workload to another
    on_default = [deployed("r1"), benched("r1", 880.0)]
    assert find_baseline(on_default, chat, "r2") is None
    assert find_baseline(on_default, SETTINGS, "r2").release_id == "r1"  # type: ignore[union-attr]


def test_the_gate_says_which_workload_its_figures_were_measured_on() -> None:
    chat = SETTINGS.model_copy(update={"workload": "inventory/workloads/chat.yaml"})
    new, old = result("r2", level(64, 870.0), settings=chat), result("r1", level(64, 880.0), settings=chat)
    assert evaluate_gate(new, old, GATE).message.startswith("release r2 is within the gate on workload chat: ")
    assert "(workload chat: 256 prompts" in evaluate_gate(new, None, GATE).message
    assert " on workload" not in evaluate_gate(result("r2", level(64, 870.0)), result("r1", level(64, 880.0)),
                                               GATE).message


def test_a_shared_prefix_runs_the_generated_shared_prefix_dataset_in_whole_groups() -> None:
    shared = SETTINGS.model_copy(update={"workload": "chat", "input_len": 2000, "output_len": 200,
                                         "range_ratio": 0.5, "shared_prefix_len": 1000})
    assert shared.prompts_at(64) == 256 and shared.prompts_at(1) == 32
    assert BenchSettings(prompts=1000, concurrency=[8], shared_prefix_len=10).prompts_at(8) == 48  # 40 -> 3 groups
    remote = host()
    run_benchmark(remote, LAYOUT, metadata(), shared, RecordingProgress())
    (step,) = bench_steps(remote)
    start = step.argv.index("--backend")
    flags = dict(zip(step.argv[start::2], step.argv[start + 1::2], strict=True))
    assert {k: v for k, v in flags.items() if k.startswith(("--gsp", "--dataset", "--num", "--random"))} == {
        "--dataset-name": "generated-shared-prefix", "--num-prompts": "256", "--gsp-num-groups": "16",
        "--gsp-prompts-per-group": "16", "--gsp-system-prompt-len": "1000", "--gsp-question-len": "1000",
        "--gsp-output-len": "200", "--gsp-range-ratio": "0.5"}
    assert "1000 of the prompt shared by groups of 16" in shared.describe()
    history = [deployed("r1"), benched("r1", 880.0, settings=shared)]
    unshared = shared.model_copy(update={"shared_prefix_len": None})
    assert find_baseline(history, shared, "r2") is not None and find_baseline(history, unshared, "r2") is None
    with pytest.raises(ValidationError, match="leaves no question"):
        BenchSettings(input_len=100, shared_prefix_len=100)
