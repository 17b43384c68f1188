"""The README's first sweep on a sandbox guest (issue 41), in a module of its own: it is the suite's longest test, and
the suite runs each module whole on one worker, so beside the other tune tests it set the length of the whole run."""

from __future__ import annotations

import pytest
from helpers.rig import Rig
from helpers.tune_sandbox import BEFORE_64, serve, sweep, tune_rig

from deploy_lib import tune as tuning
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import tune_request
from deploy_lib.patches import list_patch_sets
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return tune_rig(sandbox_venv, tmp_path_factory)


def test_the_readmes_first_sweep_with_the_default_ladder_measures_every_level_of_every_candidate(rig: Rig) -> None:
    """Issue 41: with no spec (the default ladder 1, 64, 256, 1024) this sweep sent all 1,024 of the profile's prompts
    at concurrency 1, 1.87 s each, and timed out (`... at concurrency 1 timed out: 31% 315/1024`) before any
    candidate ran; each level now sends a few rounds of its concurrency (32, 320, 1,024, 1,024)."""
    serve(rig, BEFORE_64)
    spec, sources = tuning.sweep_spec(None, ("memory.max_running_requests=64,1024", "patches=none,fusion-sm120"), {})
    report = sweep(rig, tune_request.Request(spec, sources, tuple(list_patch_sets(ROLES_DIR))))
    ladder = [1, 64, 256, 1024]
    assert report.finished and len(report.rows) == 4, [(r.label, r.outcome, r.cause) for r in report.rows]
    for row in (report.base, *report.rows):
        assert row is not None and row.outcome == "measured", row
        assert [level.concurrency for level in row.levels] == ladder, row.label
    assert [row.label.split()[-1] for row in report.rows] == ["patches=none"] * 2 + ["patches=fusion-sm120"] * 2, \
        "the candidates on one patch set run together"
