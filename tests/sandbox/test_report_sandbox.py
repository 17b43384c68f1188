"""`invoke report` from a guest's real history: two releases deployed and benchmarked on the sandbox VM (the simulator
writes SGLang's startup lines, timings scaled down), their start phases in `status` and `releases`, and the page
opened in headless Chromium.

Its own service (`sglang-report`, port 8200, its own store and history), so it neither sees nor disturbs the other
modules' services on the same guest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import MIN_DRAWN_PX, REPORT_AREAS, chart_areas, open_page, series_per_chart
from recording_progress import RecordingProgress
from rig import Rig

from deploy_lib.commands.status import list_releases
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.report import read_report, write_report
from deploy_lib.store import Tags, read_store_facts
from deploy_lib.throughput import bench_on_demand
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
CHARTS = ("chart-throughput", "chart-concurrency", "chart-power", "chart-starts", "chart-events")


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


def test_two_releases_deployed_and_benchmarked_make_a_report_that_opens_in_chromium(rig: Rig, tmp_path: Path
                                                                                     ) -> None:
    releases = []
    for profile in PROFILES:
        releases.append(rig.deploy(profile).release_id)
        benchmark(rig)
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
    [page, *_] = write_report(data, tmp_path / "out")
    opened = open_page(page, tmp_path)
    assert opened.console == [] and opened.page_requests == []
    drawn = series_per_chart(opened.dom)
    assert all(drawn.get(chart) for chart in CHARTS), drawn
    areas = chart_areas(opened.screenshot)
    assert len(areas) == REPORT_AREAS and all(drawn >= MIN_DRAWN_PX for *_, drawn in areas), areas
