"""`make bench`'s downtime and sweep figures (issue 41), without a guest: a tool's share of the downtime over its
target prints MISS, a sweep's switches are counted in the grid's order and in the order tune runs, and a sweep's
`--dry-run` estimate far from the time it took prints MISS."""

from __future__ import annotations

from bench.downtime import TOOL_SHARE_S, downtime_figures
from bench.figures import Figure, table
from bench.measure import ChangedRun
from bench.readme_sweep import SweepTime, sweep_time_figures
from bench.sweep_switches import GRIDS, SwitchCount, count_switches
from deploy_lib.health.downtime import Downtime
from deploy_lib.tune.estimate import Between, Estimate, LevelEstimate


def verdict(figure: Figure) -> str:
    row = table([figure]).splitlines()[-1]
    return row.split()[-1] if row.rstrip().endswith(("PASS", "MISS")) else ""


def changed(total_s: float, server_s: float) -> ChangedRun:
    """A changed deploy whose own downtime was `total_s`, `server_s` of it the server's start."""
    return ChangedRun(total_s=total_s + 2.0, before_restart_s=0.5, restart_to_job_s=0.2, server_start_s=server_s,
                      ready_noticed_s=0.1, generation_s=0.1, grace_s=1.0, ladder_to_return_s=0.1, round_trips=5,
                      phases={}, daemon_reloads=0, downtime=Downtime(total_s, server_s), old_stop_s=0.25)


def tool_share(runs: list[ChangedRun]) -> Figure:
    [figure] = [f for f in downtime_figures(runs) if "tool's share" in f.name]
    return figure


def test_a_tool_share_of_the_downtime_over_half_a_second_prints_miss() -> None:
    """Input tried: downtimes of 6.0-6.2 s around a 5.5 s start: a share of 0.5-0.7 s (median 0.6), then 0.1-0.4 s."""
    missed = tool_share([changed(6.0, 5.5), changed(6.1, 5.5), changed(6.2, 5.5)])
    assert verdict(missed) == "MISS" and missed.value.startswith("0.60 s") and missed.target == f"<= {TOOL_SHARE_S:g} s"
    assert verdict(tool_share([changed(5.6, 5.5), changed(5.9, 5.5), changed(5.7, 5.5)])) == "PASS"


def test_the_downtime_rows_show_the_total_and_the_servers_start_beside_the_share() -> None:
    rows = table(downtime_figures([changed(5.9, 5.5), changed(5.8, 5.4), changed(5.6, 5.5)]))
    assert "changed deploy's downtime" in rows and "5.80 s (5.60-5.90)" in rows
    assert "the server's own start in it" in rows and "5.50 s (5.40-5.50)" in rows


def test_the_tool_share_is_split_into_the_old_servers_stop_and_the_rest() -> None:
    """Input tried: shares of 0.4, 0.4 and 0.5 s, each with the old server's stop 0.25 s: the rest 0.15-0.25 s."""
    figures = downtime_figures([changed(5.9, 5.5), changed(5.8, 5.4), changed(5.9, 5.4)])
    [stop] = [f for f in figures if "the old server's stop (journal" in f.name]
    [rest] = [f for f in figures if "the rest (the restart's steps" in f.name]
    assert stop.value == "0.25 s (0.25-0.25)" and rest.value == "0.15 s (0.15-0.25)"


def test_the_readmes_first_sweep_switches_three_times_in_grid_order_and_once_as_tune_runs_it() -> None:
    """none, fusion, none, fusion: 3 switches of venv; tune runs the two on each patch set together: 1."""
    readme = count_switches("the README's first sweep", GRIDS["the README's first sweep"])
    assert (readme.candidates, readme.grid_order, readme.grouped, readme.environments) == (4, 3, 1, 2)
    assert readme.figure().value == "3 -> 1" and verdict(readme.figure()) == "PASS"


def test_a_grid_grouped_already_counts_the_same_switches_in_both_orders() -> None:
    grouped = count_switches("patches first", ("patches=none,fusion-sm120", "memory.max_running_requests=64,1024"))
    assert (grouped.grid_order, grouped.grouped) == (1, 1)


def test_the_bigger_grid_alternates_its_patch_set_every_second_candidate() -> None:
    bigger = count_switches("bigger", GRIDS["3 caps x 2 patch sets x 2 chunk sizes"])
    assert (bigger.candidates, bigger.grid_order, bigger.grouped) == (12, 5, 1)


def test_an_order_that_switches_more_than_once_per_environment_prints_miss() -> None:
    assert verdict(SwitchCount("a grid", 4, 3, 3, 2).figure()) == "MISS"


def estimate(start_s: float, level_s: tuple[float, ...], recorded: bool = True) -> Estimate:
    """A sweep of 4 candidates over the default ladder: 4-7 starts, 6 benchmarks and up to 2 re-runs; each level
    5 s around its timed requests."""
    levels = zip((1, 64, 256, 1024), level_s, strict=True)
    return Estimate(starts=Between(4, 7), start_s=start_s, start_samples=3, runs=6, reruns=Between(0, 2),
                    levels=tuple(LevelEstimate(level, 32, seconds - 5.0, 5.0, recorded) for level, seconds in levels),
                    overhead_samples=3)


def sweep_time(after: Estimate, measured_s: float, measured_rows: int = 5) -> SweepTime:
    return SweepTime("--vary memory.max_running_requests=64,1024 --vary patches=none,fusion-sm120",
                     estimate(6.0, (60.0, 20.0, 20.0, 20.0), recorded=False), after, measured_s, measured_s - 60.0,
                     8, 30.0, 4, measured_rows, 5)


def figure_named(figures: list[Figure], part: str) -> Figure:
    [figure] = [f for f in figures if part in f.name]
    return figure


def test_an_estimate_far_from_the_sweeps_time_prints_miss_with_how_far() -> None:
    """Input tried: 4-7 starts of 6 s and 6 benchmarks and up to 2 re-runs of 120 s (744-1,002 s) against a sweep of
    1,650 s (-39%), 1,100 s (-9%) and 900 s (inside: +0%)."""
    after = estimate(6.0, (60.0, 20.0, 20.0, 20.0))
    far = figure_named(sweep_time_figures(sweep_time(after, 1650.0)), "estimate after")
    assert verdict(far) == "MISS" and "(-39%)" in far.value
    assert far.value.startswith("12m24s-16m42s: 4-7 starts of 6.0 s, 6 benchmarks and up to 2 re-runs of 2m00s")
    near = figure_named(sweep_time_figures(sweep_time(after, 1100.0)), "estimate after")
    assert verdict(near) == "PASS" and "(-9%)" in near.value
    inside = figure_named(sweep_time_figures(sweep_time(after, 900.0)), "estimate after")
    assert verdict(inside) == "PASS" and "(+0%)" in inside.value


def test_a_dry_run_on_a_host_that_never_ran_the_levels_gives_the_defaults_and_says_so() -> None:
    figures = sweep_time_figures(sweep_time(estimate(6.0, (60.0, 20.0, 20.0, 20.0)), 1100.0))
    before = figure_named(figures, "estimate before")
    assert "c64 20.0 s (default)" in before.value and verdict(before) == ""


def test_a_sweep_that_left_a_level_unmeasured_prints_miss() -> None:
    after = estimate(6.0, (60.0, 20.0, 20.0, 20.0))
    assert verdict(figure_named(sweep_time_figures(sweep_time(after, 1100.0, 4)), "every level measured")) == "MISS"
    assert verdict(figure_named(sweep_time_figures(sweep_time(after, 1100.0)), "every level measured")) == "PASS"


def test_the_sweeps_time_is_split_into_benchmarks_starts_and_the_rest() -> None:
    """Input tried: a sweep of 1,100 s, 1,040 s of it 8 benchmarks and 30 s 4 starts: 30 s the rest."""
    figures = sweep_time_figures(sweep_time(estimate(6.0, (60.0, 20.0, 20.0, 20.0)), 1100.0))
    assert figure_named(figures, "of it 8 benchmarks").value == "1040.00 s"
    assert figure_named(figures, "of it 4 starts (their downtime").value == "30.00 s"
    assert figure_named(figures, "the rest (venvs, stages").value == "30.00 s"
