"""`make bench`'s table can miss, without a guest: a figure beyond its target prints MISS, and a target is never
printed without its verdict (issue 38, point 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.figures import Figure, VenvRuns, seconds_figure, table, venv_figures
from bench.measure import VenvRun
from bench.peer import POLLED, ratio_figure, readiness_figure
from bench.staging import model_no_op_figure
from bench.tune import grid_line


def verdict(figure: Figure) -> str:
    """The verdict column of the figure's row as the table prints it."""
    row = table([figure]).splitlines()[-1]
    return row.split()[-1] if row.rstrip().endswith(("PASS", "MISS")) else ""


def test_a_time_over_its_limit_prints_miss() -> None:
    assert verdict(seconds_figure("no-op", [0.9, 1.2, 1.1], 1.0)) == "MISS"
    assert verdict(seconds_figure("no-op", [0.9, 0.8, 1.1], 1.0)) == "PASS"


def test_ours_slower_than_the_peer_by_the_ratio_prints_miss() -> None:
    assert verdict(ratio_figure("no-op", [1.0, 1.0], [1.5, 1.5], 2.0)) == "MISS"
    assert verdict(ratio_figure("no-op", [0.5, 0.5], [1.5, 1.5], 2.0)) == "PASS"


@pytest.mark.parametrize("endpoint", POLLED)
def test_readiness_noticed_after_the_peer_prints_miss(endpoint: str) -> None:
    assert verdict(readiness_figure(endpoint, 0.3, [0.1, 0.2, 0.15])) == "MISS"
    assert verdict(readiness_figure(endpoint, 0.1, [0.1, 0.2, 0.15])) == "PASS"


def test_a_no_op_that_writes_into_the_model_cache_prints_miss_with_the_bytes() -> None:
    missed = model_no_op_figure([3, 3], [0, 4096])
    assert verdict(missed) == "MISS" and "4096 B" in missed.value
    assert verdict(model_no_op_figure([3, 3], [0, 0])) == "PASS"


def venv_runs(wheel: Path, fresh: list[float], large_fresh: list[float]) -> VenvRuns:
    wheel.write_bytes(b"a changed wheel")
    return VenvRuns(unchanged=[VenvRun(0.2, 0, (), 1)], changed=[VenvRun(1.5, wheel.stat().st_size, (wheel.name,), 3)],
                    changed_wheels=[wheel], fresh=[VenvRun(s, 0, (), 3) for s in fresh],
                    large_first=VenvRun(9.0, 351_000_000, ("nccl.whl",), 3),
                    large_fresh=[VenvRun(s, 0, (), 3) for s in large_fresh], large_bytes=351_000_000)


def test_a_large_wheel_whose_share_grows_beyond_the_runs_spread_prints_miss(tmp_path: Path) -> None:
    """Input tried: fresh venvs of 2.0-2.2 s; with the 351 MB wheel cached, 2.1-2.3 s (within) or 4.0-4.2 s."""
    def share(large_fresh: list[float]) -> Figure:
        figures = venv_figures(venv_runs(tmp_path / "changed.whl", [2.0, 2.1, 2.2], large_fresh))
        [figure] = [f for f in figures if "share" in f.name]
        return figure

    assert verdict(share([4.0, 4.1, 4.2])) == "MISS"
    assert verdict(share([2.1, 2.2, 2.3])) == "PASS"


def test_a_grid_whose_larger_cap_gains_less_than_its_target_prints_miss() -> None:
    assert "2.00x (MISS, target >= 3x" in grid_line(1024, {64: 900.0, 1024: 1800.0})
    assert "4.00x (PASS, target >= 3x" in grid_line(1024, {64: 900.0, 1024: 3600.0})


def test_a_target_without_its_verdict_cannot_be_printed() -> None:
    with pytest.raises(ValueError, match="only with its verdict"):
        Figure("no-op", "0.50 s", 3, "<= 0.8 s", None)
    with pytest.raises(ValueError, match="only with its verdict"):
        Figure("no-op", "0.50 s", 3, "", True)
