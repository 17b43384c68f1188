"""`invoke report` from a guest's real history: two releases deployed and benchmarked on the sandbox VM (the simulator
writes SGLang's startup lines, timings scaled down), their start phases in `status` and `releases`, and the page
opened in headless Chromium; then a short tuning sweep of two candidates through `invoke tune`, and its page
(`invoke report --tune ID`, the id `tune --json` printed) opened in the same Chromium checks.

Its own service (`sglang-report`, port 8200, its own store and history), so it neither sees nor disturbs the other
modules' services on the same guest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.browser import REPORT_AREAS, REPORT_CHARTS, SWEEP_AREAS, SWEEP_CHARTS, assert_page_drawn
from helpers.recording_progress import RecordingProgress
from helpers.rig import Rig
from helpers.tune_sandbox import tune_lines

from deploy_lib.commands.releases import list_releases
from deploy_lib.host.benchmark import bench_on_demand
from deploy_lib.host.report import read_report, write_report
from deploy_lib.host.store import read_store_facts
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.store import Tags
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]
SERVICE = "sglang-report"
TOKENIZER = "/opt/sim-tokenizer"
# decode CUDA graphs on (the reference profile runs without): their capture is a start phase the report shows
OVERRIDES = f"service:\n  name: {SERVICE}\nserver:\n  port: 8200\nfeatures:\n  cuda_graph: true\n"
PROFILES = {"report-ref": f"extends: glm5-nvfp4\n{OVERRIDES}",
            "report-omp4": f"extends: glm5-nvfp4\n{OVERRIDES}env:\n  OMP_NUM_THREADS: '4'\n"}
# small, for a 2-core machine: two levels so the concurrency chart has lines
RUN = BenchSettings(prompts=64, input_len=32, output_len=16, concurrency=[16, 64], tokenizer=TOKENIZER, timeout_s=300)
# the sweep: two cheap candidates (caps below the pre-sweep release's 1,024) on the same small benchmark, two levels
SWEEP_SPEC = (f"vary:\n  memory.max_running_requests: [64, 256]\nbench: {{prompts: 64, input_len: 32, output_len: 16, "
              f"tokenizer: {TOKENIZER}, timeout_s: 300}}\nladder: [16, 64]\n")


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    report_rig = Rig.on(sandbox_venv, tmp_path_factory, PROFILES, service=SERVICE, profile="report-ref")
    report_rig.root(f"/opt/ml-env/bin/python -m sglang_sim.tokenizer {TOKENIZER}")
    report_rig.root(f"rm -f {report_rig.store}/history.jsonl /etc/sglang-sim/fault")
    yield report_rig
    report_rig.root(f"systemctl stop {SERVICE}.service || true")


def benchmark(rig: Rig) -> None:
    with rig.connect() as (target, remote):
        store = read_store_facts(remote, target.layout(SERVICE))
        record = store.release(store.current or "")
        assert record is not None
        bench_on_demand(remote, target.layout(SERVICE), record.metadata, Tags.from_dict(record.metadata["tags"]),
                        RUN, RecordingProgress())


@pytest.fixture(scope="module")
def releases(rig: Rig) -> list[str]:
    """Each profile deployed and benchmarked in turn: the last one (report-omp4) serves."""
    deployed = []
    for profile in PROFILES:
        deployed.append(rig.deploy(profile).release_id)
        benchmark(rig)
    return deployed


def test_two_releases_deployed_and_benchmarked_make_a_report_that_opens_in_chromium(rig: Rig, releases: list[str],
                                                                                     tmp_path: Path) -> None:
    status = rig.status()
    # the simulator's startup lines, at SGLang's texts: every phase of a real start is known
    assert status.last_start.startswith("weights ") and "unknown" not in status.last_start, status.last_start
    with rig.connect() as (target, remote):
        rows = {row.id: row for row in list_releases(target, SERVICE, remote)}
        data = read_report(target, SERVICE, remote)
    assert all(rows[release].last_start for release in releases)
    assert {p.release for p in data.concurrency} == set(releases) and len(data.concurrency) == 4
    assert all(row.weights is not None and row.cuda_graphs is not None for row in data.starts)
    assert {r.power_limit_w for r in data.gpus} == {600.0}, "the nvidia-smi stand-in's limit, per GPU"
    [switch] = data.downtimes
    assert switch.release == releases[1] and 0 < switch.server_s <= switch.downtime_s, "the second replaced the first"
    [page, *_] = write_report(data, tmp_path / "out")
    assert_page_drawn(page, tmp_path, REPORT_CHARTS, REPORT_AREAS + 1)


def test_a_short_sweep_by_invoke_tune_has_a_page_by_invoke_report_tune_that_opens_in_chromium(
        rig: Rig, releases: list[str], tmp_path: Path) -> None:
    (rig.project.root / "tune").mkdir(exist_ok=True)
    (rig.project.root / "tune" / "report-sweep.yaml").write_text(SWEEP_SPEC)
    swept = rig.invoke("tune", "--profile", "report-omp4", "--spec", "tune/report-sweep.yaml", "--yes")
    tune_id = swept["tune_id"]
    assert swept["finished"] and [row["label"] for row in swept["rows"]] == [
        "memory.max_running_requests=64", "memory.max_running_requests=256"], swept
    assert tune_lines(rig, tune_id), f"history holds no tune lines of {tune_id}"
    shown = rig.invoke("tune.show", "--tune-id", tune_id, "--service", SERVICE)
    assert shown["tune_id"] == tune_id and shown["winner"] == swept["winner"]
    written = rig.invoke("report", "--tune", tune_id, "--service", SERVICE, "--out", str(tmp_path / "out"))
    page = Path(written[0])
    assert page.name == f"report-{rig.guest.name}-{SERVICE}-{tune_id}.html", written
    document = json.loads(page.with_suffix(".json").read_text())
    assert document["tune_id"] == tune_id and document["original"] == releases[-1]
    candidates = document["candidates"]
    assert [c["candidate"] for c in candidates] == ["base", *[row["label"] for row in swept["rows"]]], candidates
    # every run measured on the guest: an objective, each GPU's power against the nvidia-smi stand-in's 600 W limit
    assert all(c["outcome"] == "measured" and c["objective"] and c["power_limit_w"] == 600.0 for c in candidates), \
        candidates
    # each candidate's cap as a flag change: its own run's, where a rerun within the noise recorded none
    assert all(f"~ flag --max-running-requests: 1024 -> {cap}" in c["changes"].split("; ")
               for c, cap in zip(candidates[1:], (64, 256), strict=True)), candidates
    assert sorted((lv["number"], lv["concurrency"]) for lv in document["levels"]) == [
        (n, level) for n in range(3) for level in (16, 64)], document["levels"]
    assert_page_drawn(page, tmp_path, SWEEP_CHARTS, SWEEP_AREAS)
