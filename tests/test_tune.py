"""`invoke tune`'s pure parts: the spec and its errors, the candidates and the skipped ones, the decisions (score,
noise, winner, next release, resume), the estimate and the table read back from history (no SSH)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.deploy_plan import PROJECT, options_accepting
from helpers.project_patches import write_project_patch_set

from deploy_cli.tune import estimate_line, table_lines
from deploy_lib.errors import ConfigError
from deploy_lib.models.facts import ReleaseModel
from deploy_lib.patches import list_patch_sets
from deploy_lib.profile.overrides import scalar, with_overrides
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.release.model import build_release
from deploy_lib.store import FAILED, HEALTHY, HistoryEntry, StoreLayout, Tags, history_entry
from deploy_lib.throughput import BenchResult, Latency, LevelResult
from deploy_lib.tune import Objective, Sla, TuneSpec, parse_vary, sweep_spec
from deploy_lib.tune.decide import NOISE_FLOOR, Score, Standing, decide, end_release, noise, score, serve_next, to_run
from deploy_lib.tune.estimate import (
    DEFAULT_LEVEL_OVERHEAD_S,
    DEFAULT_START_S,
    Between,
    LevelEstimate,
    estimate,
    sweep_starts,
)
from deploy_lib.tune.record import BASE, CANDIDATE, read_tune, run_line, start_line
from deploy_lib.tune.sweep import HostView, build_sweep, clip_ladder, differences, environment_switches

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LAYOUT = StoreLayout("sglang")
PATCH_SETS = tuple(list_patch_sets(PROJECT.root / "roles"))
BASE_PROFILE = PROJECT.profile("glm5-nvfp4")


def host(sglang: str = "0.5.23", options: dict | None = None) -> HostView:
    every = with_overrides(BASE_PROFILE, {"features.allreduce_fusion": True, "memory.chunked_prefill_size": 1}, "all")
    known = options if options is not None else options_accepting(
        (*build_release(BASE_PROFILE, LAYOUT, sglang, {}).args, *build_release(every, LAYOUT, sglang, {}).args))
    return HostView(LAYOUT, sglang, "0.7.2", known, "sm120")


def sweep_of(*vary: str, base=BASE_PROFILE, on: HostView | None = None, **spec: object):
    tune_spec, sources = sweep_spec(None, vary, spec)
    return build_sweep(base, tune_spec, sources, PATCH_SETS, on or host())


# --- the spec -------------------------------------------------------------------------------------------------


def test_vary_reads_values_as_a_profile_file_spells_them() -> None:
    assert parse_vary(["memory.max_running_requests=64,256", "features.cuda_graph=true,false",
                       "memory.chunked_prefill_size=null,4096", "patches=none,fusion-sm120"]) == {
        "memory.max_running_requests": [64, 256], "features.cuda_graph": [True, False],
        "memory.chunked_prefill_size": [None, 4096], "patches": ["none", "fusion-sm120"]}
    assert scalar("0.9") == 0.9 and scalar("flashinfer") == "flashinfer"


@pytest.mark.parametrize(("given", "message"), [
    (["memory.max_running_requests"], "--vary 'memory.max_running_requests': write KEY=V1,V2"),
    (["=1,2"], "write KEY=V1,V2"),
    (["memory.max_running_requests="], "memory.max_running_requests has an empty value"),
    (["memory.max_running_requests=64,,256"], "has an empty value"),
    (["memory.max_running_requests=64,64"], "64 listed twice"),
    (["memory.max_running_requests=64", "memory.max_running_requests=256"], "is varied twice"),
])
def test_bad_vary_options_name_the_option(given: list[str], message: str) -> None:
    """Input tried: each malformed --vary of the table."""
    with pytest.raises(ConfigError, match=message):
        parse_vary(given)


def test_a_vary_key_or_value_the_profile_refuses_names_the_option_and_the_key() -> None:
    """Input tried: a misspelt key, a value of the wrong type, a section set as a value, an unknown patch set."""
    with pytest.raises(ConfigError, match=r"--vary memory.max_running_request=64: memory.max_running_request: "
                                          r"unknown key; did you mean `max_running_requests`"):
        sweep_of("memory.max_running_request=64")
    with pytest.raises(ConfigError, match=r"--vary memory.max_running_requests=64,many: "
                                          r"memory.max_running_requests: Input should be a valid integer"):
        sweep_of("memory.max_running_requests=64,many")
    with pytest.raises(ConfigError, match=r"model\.path is a value, not a section"):
        sweep_of("model.path.x=1")
    with pytest.raises(ConfigError, match=r"model.path: model path may contain letters, digits"):
        sweep_of("model.path=glm; rm -rf /")
    with pytest.raises(ConfigError, match=r"--vary patches=none,fusion-sm12: patches: 'fusion-sm12' is not a patch "
                                          r"set; did you mean `fusion-sm120`"):
        sweep_of("patches=none,fusion-sm12")


def test_a_project_patch_set_is_a_value_of_the_patches_axis(tmp_path: Path) -> None:
    """`--vary patches=none,our-gate` with our-gate in the project's patches/: a candidate on it, as on a bundled
    set (`tune` passes the project's sets with the bundled ones)."""
    write_project_patch_set(tmp_path)
    known = tuple(list_patch_sets(PROJECT.root / "roles", tmp_path / "patches"))
    tune_spec, sources = sweep_spec(None, ["patches=none,our-gate"], {})
    sweep = build_sweep(BASE_PROFILE, tune_spec, sources, known, host())
    assert [(c.label, c.patch_set and c.patch_set.directory) for c in sweep.candidates] == [
        ("patches=none", None), ("patches=our-gate", tmp_path / "patches" / "our-gate")]
    assert sweep.candidates[1].loaded.name == "glm5-nvfp4+our-gate"
    with pytest.raises(ConfigError, match="'our-gate' is not a patch set"):
        build_sweep(BASE_PROFILE, tune_spec, sources, PATCH_SETS, host())


def test_a_spec_file_is_checked_key_by_key_and_a_key_in_both_places_is_refused(tmp_path: Path) -> None:
    """Input tried: an unknown key, an empty value list, a level off the ladder, a key also given by --vary."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text("vary: {memory.max_running_requests: [64, 1024]}\nladder: [64, 1024]\nobjectiv: goodput\n")
    with pytest.raises(ConfigError, match=f"{spec}: objectiv: unknown key; did you mean `objective`"):
        sweep_spec(spec, [])
    spec.write_text("vary: {memory.max_running_requests: []}\n")
    with pytest.raises(ConfigError, match=f"{spec}: vary: memory.max_running_requests: no values to try"):
        sweep_spec(spec, [])
    spec.write_text("vary: {memory.max_running_requests: [64]}\nladder: [64, 1024]\nlevel: 256\n")
    with pytest.raises(ConfigError, match="level 256 is not on the ladder"):
        sweep_spec(spec, [])
    spec.write_text("vary: {memory.max_running_requests: [64, 1024]}\nsla: {ttft_p99: 2000}\n"
                    "bench: {prompts: 2048, input_len: 32, output_len: 32}\n")
    with pytest.raises(ConfigError, match=f"memory.max_running_requests is also varied in {spec}"):
        sweep_spec(spec, ["memory.max_running_requests=1"])
    loaded, sources = sweep_spec(spec, ["patches=none,fusion-sm120"])
    assert list(loaded.vary) == ["memory.max_running_requests", "patches"] and loaded.sla.ttft_p99 == 2000
    assert sources == {"memory.max_running_requests": f"{spec}: vary.memory.max_running_requests",
                       "patches": "--vary patches=none,fusion-sm120"}
    with pytest.raises(ConfigError, match="tune needs something to vary"):
        sweep_spec(None, [])


def test_a_bad_search_or_halving_setting_names_the_key() -> None:
    """Input tried: --search bogus; halving.eta 1 (nothing would be eliminated) in a spec file."""
    with pytest.raises(ConfigError, match=r"^--search 'bogus': Input should be 'grid' or 'halving'"):
        sweep_spec(None, ["memory.max_running_requests=64,128"], {"search": "bogus"})
    with pytest.raises(ConfigError, match=r"halving\.eta: Input should be greater than or equal to 2"):
        sweep_spec(None, ["memory.max_running_requests=64,128"], {"search": "halving", "halving": {"eta": 1}})
    halving = sweep_spec(None, ["memory.max_running_requests=64,128"], {"search": "halving"})[0].halving
    bench = BASE_PROFILE.profile.bench
    assert halving.short_bench(bench).output_len == bench.output_len // 4 and halving.survivors(5) == 3


# --- the candidates -------------------------------------------------------------------------------------------


def test_the_candidates_are_the_grids_product_those_on_one_patch_set_together() -> None:
    """The grid alternates the patch set (none, fusion, none, fusion: 3 switches of venv); grouped, it changes once."""
    sweep = sweep_of("memory.max_running_requests=64,1024", "patches=none,fusion-sm120")
    assert [c.label for c in sweep.candidates] == [
        "memory.max_running_requests=64 patches=none", "memory.max_running_requests=1024 patches=none",
        "memory.max_running_requests=64 patches=fusion-sm120", "memory.max_running_requests=1024 patches=fusion-sm120"]
    assert environment_switches(sweep.candidates) == 1
    assert "candidates grouped by venv and patch set: 1 switch of either instead of 3" in sweep.notes
    assert [c.label for c in sweep_of("patches=none,fusion-sm120", "memory.max_running_requests=64,1024").candidates
            ] == [
        "patches=none memory.max_running_requests=64", "patches=none memory.max_running_requests=1024",
        "patches=fusion-sm120 memory.max_running_requests=64", "patches=fusion-sm120 memory.max_running_requests=1024"
    ], "a grid grouped already keeps its order"
    fused = sweep.candidates[2]
    assert fused.patch_set is not None and fused.loaded.profile.features.allreduce_fusion
    assert fused.loaded.name == "glm5-nvfp4+fusion-sm120"
    assert sweep.candidates[0].loaded.profile.memory.max_running_requests == 64
    assert sweep.skipped == () and sweep.bench.concurrency == [1, 64, 256, 1024]
    small = sweep_of("memory.max_running_requests=64,1024", bench={"prompts": 256, "input_len": 32, "output_len": 32})
    assert small.bench.concurrency == [1, 64, 256] and small.bench.prompts == 256, \
        "a bench of fewer prompts than the ladder's top is clipped, not refused"
    assert "levels 1024 left out: the benchmark sends 256 prompts per level" in small.notes


def test_a_flag_the_hosts_sglang_lacks_skips_the_candidate_with_the_reason() -> None:
    """Input tried: chunked_prefill_size, rendered as --chunked-prefill-size, on an SGLang that has no such flag."""
    args = build_release(BASE_PROFILE, LAYOUT, "0.5.23", {}).args
    sweep = sweep_of("memory.chunked_prefill_size=null,4096", on=host(options=options_accepting(args)))
    assert [c.label for c in sweep.candidates] == ["memory.chunked_prefill_size=null"]
    [skipped] = sweep.skipped
    assert skipped.label == "memory.chunked_prefill_size=4096"
    assert "SGLang 0.5.23 on the host does not accept it" in skipped.reason and "--chunked-prefill-size" in \
        skipped.reason


def test_a_patch_set_for_other_versions_or_several_nodes_is_skipped() -> None:
    """Input tried: fusion-sm120 on SGLang 0.5.1 (no variant), and on the three-node profile."""
    old = sweep_of("patches=none,fusion-sm120", on=host(sglang="0.5.1", options={}))
    assert [s.label for s in old.skipped] == ["patches=fusion-sm120"]
    assert "does not cover these versions" in old.skipped[0].reason
    nodes = sweep_of("patches=none,fusion-sm120", base=PROJECT.profile("glm5-nvfp4-3nodes"), on=host(options={}))
    assert "single-node only" in nodes.skipped[0].reason


def test_a_combination_a_profile_rule_refuses_is_skipped_though_each_value_is_valid() -> None:
    """Input tried: allreduce fusion (valid on one node) with the three-node profile's nnodes=3 (valid unfused)."""
    base = with_overrides(PROJECT.profile("glm5-nvfp4-3nodes"), {"parallel.nnodes": 1}, "test")
    sweep = sweep_of("features.allreduce_fusion=false,true", "parallel.nnodes=1,3", base=base, on=host(options={}))
    assert [s.label for s in sweep.skipped] == ["features.allreduce_fusion=true parallel.nnodes=3"]
    assert len(sweep.candidates) == 3
    assert "allreduce_fusion is single-node" in sweep.skipped[0].reason


def test_the_ladder_is_clipped_to_the_prompts_and_to_the_largest_batch_any_candidate_runs() -> None:
    assert clip_ladder([1, 64, 256, 1024], 1024, [64, 256]) == ([1, 64, 256], [
        "levels 1024 left out: no candidate runs more than 256 requests at once (memory.max_running_requests)"])
    assert clip_ladder([1, 64, 256, 1024], 256, [None])[0] == [1, 64, 256]
    with pytest.raises(ConfigError, match="no level of the ladder"):
        clip_ladder([512], 256, [])
    with pytest.raises(ConfigError, match="the objective's level 1024 cannot run"):
        sweep_of("memory.max_running_requests=64,256", level=1024)


def test_differences_are_shown_flag_by_flag_against_the_serving_release() -> None:
    on = host()
    base = build_release(BASE_PROFILE, LAYOUT, "0.5.23", {}, flashinfer_version="0.7.2").metadata()
    sweep = sweep_of("memory.max_running_requests=64,1024", on=on)
    assert [str(c) for c in differences(base, sweep.candidates[0], on)] == [
        "~ flag --max-running-requests: 1024 -> 64"]
    assert differences(base, sweep.candidates[1], on) == []


def test_differences_against_a_release_whose_weights_were_resolved_name_only_what_the_candidate_changes() -> None:
    """Input tried: the serving release staged from the hub (its revision resolved to a commit in /root/.cache);
    a cap of 64. Failed before: the candidate, built without the resolved weights, also showed --revision, HF_HOME
    and the model's commit as removed (`make demo`'s table)."""
    on = host()
    weights = ReleaseModel(BASE_PROFILE.profile.model.path, "main", "a" * 40, "/root/.cache/huggingface")
    base = build_release(BASE_PROFILE, LAYOUT, "0.5.23", {}, flashinfer_version="0.7.2", model=weights).metadata()
    sweep = sweep_of("memory.max_running_requests=64,1024", on=on)
    assert [str(c) for c in differences(base, sweep.candidates[0], on)] == [
        "~ flag --max-running-requests: 1024 -> 64"]
    assert differences(base, sweep.candidates[1], on) == []


# --- the decisions --------------------------------------------------------------------------------------------


def level(concurrency: int, tok_s: float, ttft_p99: float = 500.0, completed: int = 1024,
          duration: float = 10.0) -> LevelResult:
    return LevelResult(concurrency, completed, duration, tok_s, Latency(1.0, 1.0, ttft_p99), Latency(1, 1, 30.0),
                       Latency(1.0, 1.0, 20.0))


SETTINGS = BenchSettings(prompts=1024, input_len=32, output_len=32, concurrency=[64, 1024])


def bench(release: str, *levels: LevelResult) -> BenchResult:
    return BenchResult(release, SETTINGS, levels)


def test_throughput_is_read_at_the_named_level_and_the_sla_judged_there() -> None:
    run = bench("r", level(64, 880.0, ttft_p99=300), level(1024, 3740.0, ttft_p99=4000))
    assert score(run, Objective.throughput, 1024, Sla()) == Score(3740.0, True)
    missed = score(run, Objective.throughput, 1024, Sla(ttft_p99=2000))
    assert (missed.value, missed.sla_met, missed.qualifies) == (3740.0, False, False)
    assert missed.misses == ("at 1024: p99 TTFT 4,000 ms > 2,000 ms",)
    assert score(run, Objective.throughput, 64, Sla(ttft_p99=2000)).qualifies
    failed = BenchResult("r", SETTINGS, error="exited 1")
    assert score(failed, Objective.throughput, 64, Sla()) == Score(None, False, ("exited 1",))


def test_goodput_is_the_best_request_rate_among_the_levels_meeting_the_sla() -> None:
    run = bench("r", level(64, 880.0, ttft_p99=300, duration=20.0), level(1024, 3740.0, ttft_p99=4000, duration=8.0))
    assert score(run, Objective.goodput, 1024, Sla()).value == pytest.approx(128.0)
    within = score(run, Objective.goodput, 1024, Sla(ttft_p99=2000))
    assert within.value == pytest.approx(51.2) and within.sla_met
    assert not score(run, Objective.goodput, 1024, Sla(ttft_p99=100)).qualifies


def test_noise_is_the_spread_of_the_base_runs_with_a_floor() -> None:
    assert noise([1000.0, 1100.0]) == pytest.approx(100 / 1050)
    assert noise([1000.0, 1000.0]) == NOISE_FLOOR == noise([1000.0])


def test_the_winner_beyond_the_noise_is_kept_within_it_the_original_serves() -> None:
    a, b = Standing("a", "ra", (3700.0,)), Standing("b", "rb", (900.0,))
    kept = decide(880.0, [b, a], 0.05, True, "tok/s")
    assert (kept.winner, kept.keep, kept.rerun) == (a, True, ())
    assert "a: 3,700.0 tok/s, +320.5% over the pre-sweep release's 880.0 tok/s (noise 5.0%): kept" in kept.reason
    within = decide(3600.0, [a, b], 0.05, True, "tok/s")
    assert within.winner == a and not within.keep and "not beyond the noise" in within.reason
    report = decide(880.0, [a, b], 0.05, False, "tok/s")
    assert report.winner == a and not report.keep and "keep: none" in report.reason
    assert end_release(kept, "orig") == "ra" and end_release(within, "orig") == end_release(report, "orig") == "orig"


def test_the_top_two_within_the_noise_run_again_once_then_the_means_decide() -> None:
    a, b = Standing("a", "ra", (1000.0,)), Standing("b", "rb", (980.0,))
    first = decide(500.0, [a, b, Standing("c", "rc", ())], 0.05, True, "tok/s")
    assert first.rerun == (a, b) and first.winner is None and "within the noise (5.0%)" in first.reason
    again = decide(500.0, [Standing("a", "ra", (1000.0, 950.0)), Standing("b", "rb", (980.0, 990.0))], 0.05, True,
                   "tok/s")
    assert again.rerun == () and again.winner is not None and again.winner.label == "b" and again.keep


def test_no_qualifying_candidate_restores_the_original() -> None:
    decision = decide(880.0, [Standing("a", "ra", ()), Standing("b", None, ())], 0.02, True, "tok/s")
    assert (decision.winner, decision.keep) == (None, False) and end_release(decision, "orig") == "orig"
    assert decide(None, [Standing("a", "ra", (10.0,))], 0.02, True, "req/s").keep, \
        "a base that missed the SLA is beaten by any candidate that meets it"


def test_after_a_failed_candidate_the_best_so_far_serves_and_a_good_one_serves_on() -> None:
    assert serve_next("rc", True, "rb", "orig") is None
    assert serve_next("rc", False, "rb", "orig") == "rb"
    assert serve_next("rc", False, None, "orig") == "orig"
    assert serve_next("orig", False, None, "orig") is None, "the engine's rollback already brought it back"


def test_a_resumed_sweep_runs_only_what_it_has_not_finished_in_grid_order() -> None:
    assert to_run(["a", "b", "c", "d"], ["c", "a"]) == ["b", "d"]
    assert to_run(["a"], ["a"]) == []


# --- estimate and history -------------------------------------------------------------------------------------


def tags(release: str) -> Tags:
    return Tags("op@box", "th1", release, "glm5-nvfp4", "h")


FOUR = ("cap=64", "cap=128", "cap=256", "cap=1024")  # a sweep's candidates, in the order they run


def test_the_estimate_uses_this_hosts_recorded_starts_benchmark_pace_and_time_around_the_levels() -> None:
    """Input tried: starts of 200, 300, 400 s; one benchmark of 30 s at 64 and 90 s at 1024 whose wall time was
    130 s (10 s around the two levels: 5 s each)."""
    starts = [history_entry("deploy", HEALTHY, tags(f"r{n}"), NOW, timings={"ready": s})
              for n, s in enumerate((200.0, 300.0, 400.0))]
    result = replace(bench("r2", level(64, 1.0, duration=30.0), level(1024, 1.0, duration=90.0)), wall_s=130.0)
    benched = history_entry("bench", HEALTHY, tags("r2"), NOW, figures=result.figures())
    found = estimate([*starts, benched], SETTINGS, candidates=FOUR, base_runs=2)
    # the recorded run sent 1024 prompts at each level; level 64 now sends 320 of them, so it takes 320/1024 as long
    assert found.levels == (LevelEstimate(64, 320, 9.4, 5.0), LevelEstimate(1024, 1024, 90.0, 5.0))
    assert (found.starts, found.start_s, found.runs, found.reruns, found.bench_s) == (
        Between(4, 7), 300.0, 6, Between(0, 2), 109.4)
    assert (found.fewest_s, found.most_s) == (4 * 300 + 6 * 109.4, 7 * 300 + 8 * 109.4)
    assert estimate_line(found) == (
        "about 31-50 min: 4-7 starts of ~300 s (median of 3 recorded), 6 benchmarks and up to 2 re-runs of ~109 s "
        "(level 64: 320 prompts ~14 s, level 1024: 1024 prompts ~95 s; each level ~5 s of it around the timed "
        "requests, from 1 recorded)")
    switched = history_entry("deploy", HEALTHY, tags("r3"), NOW, timings={"ready": 200.0, "downtime": 500.0})
    assert estimate([*starts, switched], SETTINGS, FOUR, 2).start_s == 350.0, \
        "a switch costs its downtime, from the stop"
    assert estimate([], SETTINGS, FOUR, 2, keep_winner=False).starts == Between(5, 7), "keep none: the switch back"


def test_a_levels_pace_is_the_mean_of_this_hosts_runs_of_it_not_the_newest_alone() -> None:
    """Input tried (the README's first sweep on the sandbox, whose estimate after it was +39%): the same level run by
    a fast candidate (30 s) and then by a slow one (fusion-sm120 on SM120, 90 s), 1024 prompts each. The next sweep's
    candidates are like both, so each benchmark is counted at their mean, not at the slow one that ran last."""
    runs = [history_entry("tune", HEALTHY, tags(f"r{n}"), NOW,
                          figures=bench(f"r{n}", level(1024, 1.0, duration=seconds)).figures())
            for n, seconds in enumerate((30.0, 90.0))]
    found = estimate(runs, SETTINGS.model_copy(update={"concurrency": [1024]}), FOUR, 2)
    assert [(lv.timed_s, lv.recorded) for lv in found.levels] == [(60.0, True)]


def test_a_candidate_rendered_as_the_serving_release_starts_nothing_when_it_runs_first() -> None:
    """Input tried: caps 64 and 128 over a release serving a cap of 64 (bench.readme_sweep's quick sweep). Cap 64
    is the serving release (its deploy a no-op), cap 128 starts; kept and serving at the end: 1 start. At most 4:
    the top two re-run from cap 128 (cap 64, then cap 128 again) and the pre-sweep release back at the end."""
    assert sweep_starts(("cap=64", "cap=128"), {"cap=64"}, None, keep_winner=True) == Between(1, 4)
    assert sweep_starts(("cap=64", "cap=128"), set(), None, keep_winner=True) == Between(2, 5)
    assert sweep_starts(("cap=128", "cap=64"), {"cap=64"}, None, keep_winner=False) == Between(2, 4), \
        "keep none: cap 64 last is the pre-sweep release serving again, no switch at the end"
    assert sweep_starts((), set(), None, keep_winner=True) == Between(0, 0)


def test_a_host_with_no_history_gets_an_estimate_from_stated_defaults() -> None:
    """Input tried: no history at all; the ladder 1, 64 at 32 output tokens: 32 prompts one at a time (32 waves of
    32 tokens at 20 tok/s) and 320 at 64 (5 waves)."""
    found = estimate([], SETTINGS.model_copy(update={"concurrency": [1, 64]}), FOUR[:2], 2)
    assert found.defaults and (found.start_s, found.start_samples) == (DEFAULT_START_S, 0)
    assert found.levels == (LevelEstimate(1, 32, 51.2, DEFAULT_LEVEL_OVERHEAD_S, recorded=False),
                            LevelEstimate(64, 320, 8.0, DEFAULT_LEVEL_OVERHEAD_S, recorded=False))
    line = estimate_line(found)
    assert "starts of ~300 s (default: no start recorded on this host)" in line
    assert "level 1: 32 prompts ~61 s (default pace: never run here at these lengths)" in line
    assert "~10 s of it around the timed requests, default: no benchmark's wall time recorded" in line
    assert line.endswith("a deploy, `invoke bench` or a sweep records them")


def test_each_level_sends_a_few_rounds_of_its_concurrency_within_the_profiles_prompts() -> None:
    """The README's first sweep: the default ladder 1, 64, 256, 1024 with the profile's 1,024 prompts sent all 1,024
    at concurrency 1 (1.87 s each on the sandbox: it timed out)."""
    settings = BenchSettings(prompts=1024, concurrency=[1, 64, 256, 1024])
    assert [settings.prompts_at(c) for c in settings.concurrency] == [32, 320, 1024, 1024]
    assert BenchSettings(prompts=100, concurrency=[1, 8, 100]).prompts_at(8) == 40


def test_a_sweep_reads_back_from_history_lines_as_the_same_table() -> None:
    spec = TuneSpec(vary={"memory.max_running_requests": [64, 1024]}, ladder=[64, 1024], sla=Sla(ttft_p99=3000))
    lines = [start_line("t1", spec, "glm5-nvfp4", tags("orig"), NOW, 2)]
    for role, label, release, tok_s, ttft in ((BASE, "base", "orig", 3000.0, 900), (BASE, "base", "orig", 3100.0, 900),
                                              (CANDIDATE, "memory.max_running_requests=64", "r64", 880.0, 900),
                                              (CANDIDATE, "memory.max_running_requests=1024", "r1k", 3740.0, 4000)):
        result = bench(release, level(64, tok_s / 2), level(1024, tok_s, ttft_p99=ttft))
        lines.append(run_line("t1", role, label, tags(release), NOW, result,
                              score(result, Objective.throughput, 1024, spec.sla), changes=("~ flag x",)))
    again = [HistoryEntry.from_json(line.to_json().decode()) for line in lines]
    report = read_tune(again, "t1")
    assert (report.original, report.profile, report.spec, report.finished) == ("orig", "glm5-nvfp4", spec, False)
    assert report.base is not None and report.base.values == (3000.0, 3100.0)
    assert [(r.label, r.release_id, r.outcome, r.sla_met, r.values) for r in report.rows] == [
        ("memory.max_running_requests=64", "r64", "measured", True, (880.0,)),
        ("memory.max_running_requests=1024", "r1k", "missed SLA", False, ())]
    assert report.rows[1].cause == "at 1024: p99 TTFT 4,000 ms > 3,000 ms"
    text = "\n".join(table_lines(report))
    assert "not finished: `invoke tune --resume t1`" in text and "3,740.0" in text
    with pytest.raises(ConfigError, match="no sweep 't2' in the host's history") as caught:
        read_tune(again, "t2")
    assert "sweeps on the host: t1" in (caught.value.hint or "")
    assert again[-1].outcome == FAILED and again[-1].event == "tune"


def test_the_tune_task_refuses_a_bad_vary_with_exit_2_before_any_connection(capsys: pytest.CaptureFixture[str]
                                                                           ) -> None:
    """Input tried: `invoke tune --vary memory.max_running_request=64` (a misspelt key), no host reachable."""
    from invoke import Collection, Program

    from deploy_cli import tune as tune_tasks

    program = Program(namespace=Collection(tune=tune_tasks.collection))
    with pytest.raises(SystemExit) as ended:
        program.run(["invoke", "tune", "--profile", "glm5-nvfp4", "--vary", "memory.max_running_request=64",
                     "--dry-run"])
    assert ended.value.code == 2
    assert "memory.max_running_request: unknown key; did you mean `max_running_requests`" in capsys.readouterr().err


def test_the_spec_files_of_the_repo_are_valid_sweeps() -> None:
    specs = sorted((PROJECT.root / "tune").glob("*.yaml"))
    assert specs
    for path in specs:
        spec, sources = sweep_spec(path, [])
        sweep = build_sweep(BASE_PROFILE, spec, sources, PATCH_SETS, host())
        assert sweep.candidates, path


@pytest.mark.parametrize(("given", "says"), [
    (["--host", "gpu1", "--group", "sandbox"], "--host and --group are exclusive"),
    (["--group", "nosuchgroup"], "nosuchgroup"),
])
def test_the_tune_task_refuses_a_bad_group_with_exit_2_before_any_connection(
        capsys: pytest.CaptureFixture[str], given: list[str], says: str) -> None:
    """Input tried: --group with --host; a group the inventory does not have."""
    from invoke import Collection, Program

    from deploy_cli import tune as tune_tasks

    program = Program(namespace=Collection(tune=tune_tasks.collection))
    with pytest.raises(SystemExit) as ended:
        program.run(["invoke", "tune", "--profile", "glm5-nvfp4", "--vary", "memory.max_running_requests=64",
                     *given, "--yes"])
    assert ended.value.code == 2 and says in capsys.readouterr().err
