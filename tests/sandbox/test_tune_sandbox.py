"""`invoke tune` on a sandbox guest, through the tune library as the task calls it (issue 26): the grid of
max_running_requests x patch sets on glm5-nvfp4-sandbox with the simulator's figures, a candidate that cannot start
(mem_fraction_static 0.99: CUDA out of memory), and Ctrl-C during a candidate's benchmark followed by --resume.

The benchmark is the profile's own (1,024 prompts of 32 -> 32 tokens) at one level of the ladder, 1,024, the level
the issue names. Shorter answers measure the benchmark client instead of the server on a loaded machine: with 8
output tokens its ramp of 1,024 requests outlasted the server's decode, and a cap of 1,024 measured little more
than a cap of 64."""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
from collections.abc import Iterator

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import Rig
from helpers.tune_sandbox import (
    BEFORE_64,
    BEFORE_256,
    MRR_512,
    MRR_1024,
    request,
    serve,
    sweep,
    tune_lines,
    tune_rig,
)
from helpers.waits import wait_for

from deploy_lib.errors import Interrupted
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return tune_rig(sandbox_venv, tmp_path_factory)


def objective(row: object) -> float:
    values = row.values  # type: ignore[attr-defined]
    assert values, row
    return sum(values) / len(values)


def test_the_grid_of_caps_and_fusion_measures_every_candidate_and_serves_the_one_its_measurements_favour(
        rig: Rig) -> None:
    """Which cap measures best on a loaded machine is `make bench`'s to show (bench/tune.py); here the loop's own
    behaviour: every candidate of the grid starts and is measured (the fusion-sm120 patch set applies on the
    simulator's SM120), the winner is the one with the best recorded objective, and the release that serves at the
    end is the winner's when the loop kept it, else the one from before."""
    before = serve(rig, BEFORE_64)
    report = sweep(rig, request("memory.max_running_requests=64,256,1024", "patches=none,fusion-sm120"))
    rows = {row.label: row for row in report.rows}
    for label, row in rows.items():
        print(f"{label}: {row.outcome}, {row.values} {row.cause}")
    assert len(rows) == 6, [(r.label, r.outcome, r.cause) for r in report.rows]
    assert [row.outcome for row in rows.values()] == ["measured"] * 6, [(r.label, r.outcome, r.cause)
                                                                       for r in report.rows]
    assert report.finished and report.winner == max(rows, key=lambda label: objective(rows[label])), report.reason
    assert report.winner is not None
    kept = report.reason.endswith(": kept")
    assert report.serving == (rows[report.winner].release_id if kept else before), report.reason
    assert rig.current() == report.serving and rig.unit_state() == "active"
    rig.wait_ready()
    roles = [line["tune"]["role"] for line in tune_lines(rig, report.tune_id)]  # type: ignore[index]
    assert roles.count("base") == 2 and roles[-1] == "end"
    # each candidate on a release other than the one serving before switched: its downtime reported and kept
    switched = {row.release_id: row for row in rows.values() if row.release_id != before}
    assert len(switched) == 5 and all(row.downtime is not None and row.downtime.server_s > 0
                                      for row in switched.values()), report.rows
    kept = {line["release"]: line["timings"] for line in tune_lines(rig, report.tune_id)
            if line["tune"]["role"] == "candidate"}  # type: ignore[index]
    assert all({"downtime", "downtime.server"} <= set(kept[release])  # type: ignore[arg-type]
               for release in switched), kept


def test_a_candidate_that_runs_out_of_gpu_memory_is_diagnosed_and_the_sweep_goes_on(rig: Rig) -> None:
    """Input tried: mem_fraction_static 0.99 (the simulated GPU has no room left beside the pool), then 0.9."""
    serve(rig, BEFORE_256)
    report = sweep(rig, request("memory.mem_fraction_static=0.99,0.9"))
    failed, good = report.rows
    assert (failed.label, failed.outcome, failed.values) == ("memory.mem_fraction_static=0.99", "failed", ())
    assert "cuda_out_of_memory" in failed.cause, failed.cause
    assert good.outcome == "measured" and good.values, good
    deploys = [h for h in rig.history() if h["event"] == "deploy" and h["release"] == failed.release_id]
    assert deploys and deploys[-1]["outcome"] == "failed" and "cuda_out_of_memory" in str(deploys[-1]["cause"])
    assert rig.current() == report.serving and rig.unit_state() == "active"


class InterruptInBenchmark(RecordingProgress):
    """Sends this process SIGINT once the candidate `label` is benchmarking and the server holds its requests."""

    def __init__(self, rig: Rig, label: str) -> None:
        super().__init__()
        self.rig, self.label, self.candidate = rig, label, ""
        self.thread: threading.Thread | None = None

    def phase_started(self, name: str) -> None:
        super().phase_started(name)
        if ": candidate " in name:
            self.candidate = name.split(": ", 2)[2]
        if name == "benchmark" and self.candidate == self.label and self.thread is None:
            self.thread = threading.Thread(target=self._interrupt, daemon=True)
            self.thread.start()

    def _interrupt(self) -> None:
        running = "curl -sf http://127.0.0.1:8000/v1/loads"
        wait_for(lambda: json.loads(self.rig.root(f"{running} || echo '{{}}'") or "{}").get("loads", [{}])[0]
                 .get("num_running_reqs", 0) > 0, f"{self.label}'s benchmark running")
        os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_in_a_benchmark_leaves_the_best_so_far_serving_and_resume_finishes(rig: Rig) -> None:
    before = serve(rig, BEFORE_256)
    progress = InterruptInBenchmark(rig, MRR_1024)
    with pytest.raises(Interrupted, match=r"interrupted: release \S+ is serving") as caught:
        sweep(rig, request("memory.max_running_requests=512,1024", "patches=none"), progress)
    assert caught.value.exit_code == 130
    tune_id = str(caught.value.hint).split("--resume ")[1].split("`")[0]
    candidates = [line for line in tune_lines(rig, tune_id) if line["tune"]["role"] == "candidate"]  # type: ignore
    assert [line["tune"]["candidate"] for line in candidates] == [MRR_512], "the cut run is not recorded"  # type: ignore
    assert rig.current() == candidates[0]["release"] != before, "the best verified candidate serves"
    assert rig.unit_state() == "active"
    rig.wait_ready()
    report = sweep(rig, request(resume=tune_id))
    assert report.finished and report.tune_id == tune_id and report.winner, report.reason
    lines = tune_lines(rig, tune_id)
    ran = [line["tune"]["candidate"] for line in lines if line["tune"]["role"] == "candidate"]  # type: ignore
    assert ran == [MRR_512, MRR_1024], "the finished candidate did not run again"
    assert [line["tune"]["role"] for line in lines].count("base") == 2, "nor the base's runs"  # type: ignore
    assert rig.current() == report.serving and rig.unit_state() == "active"


@pytest.fixture(autouse=True)
def _no_lock_left(rig: Rig) -> Iterator[None]:
    """Every sweep releases the host's lock, interrupted or not."""
    yield
    assert rig.root(f"test -e {shlex.quote(rig.store)}/lock && echo held || echo free").strip() == "free"
