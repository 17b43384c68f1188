"""`workload` (issue 42): the serving release's /metrics read over a window and written as a workload file
(deploy_lib/metrics/workload.py decides, deploy_lib/commands/workload.py reads and writes). The traffic is sent to
the simulated server in this process on 127.0.0.1 and its /metrics answers are handed to the host reads through a
FakeRemote; counts per bucket are asserted, never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.fake_remote import FakeRemote
from helpers.sim_http import FlatModel, running_sim

from deploy_lib.commands.workload import read_host_scrapes, record_workload, scrape_times
from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.metrics import parse_scrape
from deploy_lib.metrics.workload import (
    Workload,
    check_name,
    parse_duration,
    read_workload,
    workload_of,
    workload_path,
    workload_text,
)
from deploy_lib.progress import NullProgress
from deploy_lib.store import FACT_CURRENT, FACT_LOCK, FACT_RELEASE_DIRS, FACT_RELEASE_FILES, StoreLayout, Tags

REPO = Path(__file__).resolve().parent.parent
TARGET = resolve_target(Project(REPO).inventory(None), None)
LAYOUT = StoreLayout("sglang")
SHARED = list(range(1000, 1512))  # a 512-token shared prefix


def send_shaped(client: object, requests: int, first: int = 0) -> None:
    """`requests` /generate calls: 1,024-token prompts (the shared prefix, then 512 of their own), 8 output tokens."""
    for number in range(first, first + requests):
        own = [100_000 + number * 1000 + i for i in range(512)]
        client.post("/generate", {"input_ids": SHARED + own,  # type: ignore[attr-defined]
                                  "sampling_params": {"max_new_tokens": 8}})


def served(requests: int) -> tuple[str, str]:
    """The simulator's /metrics before and after `requests` shaped requests."""
    with running_sim({"enable_metrics": True}, FlatModel()) as sim:
        send_shaped(sim, 3, first=100)  # traffic before the window is not counted
        before = sim.metrics_text()
        send_shaped(sim, requests)
        return before, sim.metrics_text()


@pytest.fixture(scope="module")
def texts() -> tuple[str, str]:
    return served(24)


def test_the_workload_has_the_shape_of_the_traffic_sent_in_the_window(texts: tuple[str, str]) -> None:
    before, after = texts
    workload = workload_of([[parse_scrape(before, 0.0), parse_scrape(after, 60.0)]], "chat", "r1", ["gpu1"],
                           "0.5.23", "2026-12-07T17:00:00+00:00")
    assert (workload.requests, workload.window_s, workload.request_rate) == (24, 60.0, 0.4)
    prompt = {b.upto: b.requests for b in workload.prompt_length.buckets if b.requests}
    output = {b.upto: b.requests for b in workload.output_length.buckets if b.requests}
    assert workload.prompt_length.requests == 24 and len(prompt) == 1
    [(upto, count)] = prompt.items()
    assert count == 24 and upto is not None and upto >= 1024  # every prompt of 1,024 tokens in one bucket
    assert workload.prompt_length.mean == 1024 and workload.output_length.mean == 8
    assert sum(output.values()) == 24
    # each prompt after the window's first finds the shared 512 tokens cached (the 3 before the window did too)
    assert workload.cached_share == pytest.approx(512 / 1024)
    assert workload.prompt_length.buckets[-1].upto is None
    assert "prompt: mean 1024 tokens" in "\n".join(workload.lines())


def test_the_peak_concurrency_is_the_highest_running_count_of_any_scrape(texts: tuple[str, str]) -> None:
    before, after = texts
    busy = after.replace("sglang:num_running_reqs{", "sglang:num_running_reqs_x{")  # drop the real gauge
    busy += '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 17\n'
    scrapes = [parse_scrape(before, 0.0), parse_scrape(busy, 30.0), parse_scrape(after, 60.0)]
    workload = workload_of([scrapes], "chat", "r1", ["gpu1"], "0.5.23", "now")
    assert (workload.peak_concurrency, workload.scrapes) == (17, 3)
    two_hosts = workload_of([scrapes, scrapes], "chat", "r1", ["gpu1", "gpu2"], "0.5.23", "now")
    assert (two_hosts.requests, two_hosts.peak_concurrency, two_hosts.prompt_length.requests) == (48, 34, 48)


def test_too_little_traffic_is_an_error_and_nothing_is_written(texts: tuple[str, str], tmp_path: Path) -> None:
    before, _ = texts
    quiet = [parse_scrape(before, 0.0), parse_scrape(before, 600.0)]
    with pytest.raises(PreflightError, match=r"too little traffic.*0 requests finished in 600 s"):
        workload_of([quiet], "chat", "r1", ["gpu1"], "0.5.23", "now")
    from deploy_lib.commands.workload import HostScrapes
    with pytest.raises(PreflightError, match="too little traffic"):
        record_workload("chat", [HostScrapes("gpu1", "r1", "0.5.23", tuple(quiet))], tmp_path / "workloads")
    assert not (tmp_path / "workloads").exists()


def test_a_restart_within_the_window_reads_no_workload(texts: tuple[str, str]) -> None:
    before, after = texts
    with pytest.raises(PreflightError, match="went down"):
        workload_of([[parse_scrape(after, 0.0), parse_scrape(before, 60.0)]], "chat", "r1", ["gpu1"], "0.5.23", "x")


def host(metrics: bool, answers: list[str]) -> FakeRemote:
    """r1 current; its recorded profile has features.metrics as given; /metrics answers `answers` in order."""
    tags = Tags("ops@laptop", "gpu1", "r1", "chat", "ph", {"sglang": "0.5.23"})
    metadata = {"id": "r1", "staged_at": "2026-12-07T10:00:00+00:00", "tags": tags.as_dict(),
                "sglang_version": "0.5.23",
                "profile": {"server": {"host": "0.0.0.0", "port": 8000}, "features": {"metrics": metrics}}}
    remote = (FakeRemote()
              .reply(FACT_LOCK, exit_code=1)
              .reply(FACT_CURRENT, stdout="releases/r1\n")
              .reply(FACT_RELEASE_DIRS, stdout="r1\0r1/release.json\0r1/sglang.service\0r1/sglang.env\0")
              .reply(FACT_RELEASE_FILES, stdout=f"{LAYOUT.releases}/r1/release.json\0{json.dumps(metadata)}\n"))
    for answer in reversed(answers):  # the newest rule answers first: the first answer is added last
        remote.reply("read /metrics", stdout=answer, times=1)
    return remote


class Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []  # type: ignore[var-annotated]

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_command_reads_the_current_release_every_interval_and_writes_the_file(texts: tuple[str, str],
                                                                                  tmp_path: Path) -> None:
    before, after = texts
    remote, clock = host(True, [before, before, after]), Clock()
    read = read_host_scrapes(TARGET, "sglang", remote, 60, 30, NullProgress(), clock=clock, sleep=clock.sleep)
    assert clock.slept == [30, 30] and remote.ran_names().count("read /metrics") == 3
    assert (read.release, read.sglang_version, [s.at_s for s in read.scrapes]) == ("r1", "0.5.23", [0, 30, 60])
    workload, path = record_workload("chat", [read], tmp_path / "inventory" / "workloads")
    assert path == tmp_path / "inventory" / "workloads" / "chat.yaml"
    assert read_workload(path) == workload
    assert workload.release == "r1" and workload.hosts == (TARGET.host.name,) and workload.sglang_version == "0.5.23"
    assert "input_ids" not in path.read_text() and workload.requests == 24


def test_a_release_without_metrics_is_refused_before_any_read() -> None:
    remote = host(False, [])
    with pytest.raises(PreflightError, match=r"features\.metrics off"):
        read_host_scrapes(TARGET, "sglang", remote, 60, 30, NullProgress(), clock=Clock(), sleep=Clock().sleep)
    assert "read /metrics" not in remote.ran_names()


def test_a_failed_read_within_the_window_is_an_error() -> None:
    remote = host(True, ["# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n"])
    remote.reply("read /metrics", exit_code=4, stderr="refused\n")
    remote.reply("read /metrics", stdout="# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n",
                 times=1)
    clock = Clock()
    with pytest.raises(PreflightError, match=r"r1 on .*: /metrics not read \(refused\); nothing written"):
        read_host_scrapes(TARGET, "sglang", remote, 60, 30, NullProgress(), clock=clock, sleep=clock.sleep)


def test_the_scrapes_leave_no_gap_longer_than_the_interval() -> None:
    assert scrape_times(600, 10)[:3] == (0, 10, 20) and scrape_times(600, 10)[-1] == 600
    assert len(scrape_times(600, 10)) == 61
    assert scrape_times(25, 10) == pytest.approx((0, 25 / 3, 50 / 3, 25))
    assert scrape_times(5, 10) == (0, 5)


def test_a_bad_workload_file_is_refused_naming_the_file_and_the_key(texts: tuple[str, str], tmp_path: Path) -> None:
    before, after = texts
    good = workload_of([[parse_scrape(before, 0.0), parse_scrape(after, 60.0)]], "chat", "r1", ["gpu1"], "0.5.23",
                       "now")
    data = good.model_dump(mode="json")
    path = tmp_path / "chat.yaml"
    for change, key in ((lambda d: d.update(extra=1), "extra"),
                        (lambda d: d["prompt_length"].update(mean=-1), "prompt_length.mean"),
                        (lambda d: d.pop("release"), "release"),
                        (lambda d: d["output_length"]["buckets"].reverse(), "output_length")):
        bad = json.loads(json.dumps(data))
        change(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=f"workload file {path}: {key}") as refused:
            read_workload(path)
        assert refused.value.exit_code == 2
    with pytest.raises(ConfigError, match="does not exist"):
        read_workload(tmp_path / "none.yaml")
    assert Workload.model_validate(data) == good


def test_names_durations_and_paths() -> None:
    assert [parse_duration(t, "--window") for t in ("90", "90s", "10m", "1h", "1.5m")] == [90, 90, 600, 3600, 90]
    for bad in ("", "0", "-1m", "ten", "10d", "nan"):
        with pytest.raises(ConfigError, match="--window"):
            parse_duration(bad, "--window")
    assert check_name("chat-peak") == "chat-peak"
    for bad in ("", "a/b", ".x", "chat.yaml"):
        with pytest.raises(ConfigError):
            check_name(bad)
    assert workload_path(Path("/p/inventory/workloads"), "chat") == Path("/p/inventory/workloads/chat.yaml")
    assert workload_path(Path("/p/inventory/workloads"), "x/chat.yaml") == Path("x/chat.yaml")


def test_a_benchmark_replays_the_workloads_mean_lengths(texts: tuple[str, str], tmp_path: Path) -> None:
    from deploy_lib.metrics.workload import bench_with_workload, replay_shape
    from deploy_lib.profile.settings import BenchSettings
    before, after = texts
    workload = workload_of([[parse_scrape(before, 0.0), parse_scrape(after, 60.0)]], "chat", "r1", ["gpu1"],
                           "0.5.23", "now")
    input_len, output_len, ratio = replay_shape(workload)
    assert 0 <= ratio < 1 and input_len >= 1024
    # bench_serving draws uniformly from [ratio x len, len]: the means are the recorded ones
    assert input_len * (1 + ratio) / 2 == pytest.approx(1024, rel=0.01)
    assert output_len * (1 + ratio) / 2 == pytest.approx(8, rel=0.1)
    (tmp_path / "chat.yaml").write_text(workload_text(workload))
    settings = bench_with_workload(BenchSettings(workload="chat"), tmp_path)
    assert (settings.input_len, settings.output_len, settings.range_ratio) == (input_len, output_len, ratio)
    # half of each prompt was cached: half of the benchmark's prompt is a prefix its group shares
    assert settings.shared_prefix_len == round(workload.cached_share * input_len)  # type: ignore[operator]
    uncached = workload.model_copy(update={"cached_share": 0.01})
    (tmp_path / "uncached.yaml").write_text(workload_text(uncached))
    assert bench_with_workload(BenchSettings(workload="uncached"), tmp_path).shared_prefix_len is None
    assert bench_with_workload(BenchSettings(), tmp_path) == BenchSettings()
    with pytest.raises(ConfigError, match=r"workload file .*batch\.yaml does not exist"):
        bench_with_workload(BenchSettings(workload="batch"), tmp_path)


def test_a_profile_naming_a_workload_is_loaded_with_its_lengths(texts: tuple[str, str], tmp_path: Path) -> None:
    import shutil
    before, after = texts
    project = Project(tmp_path)
    shutil.copytree(REPO / "inventory" / "profiles", project.profiles_dir)
    name = sorted(p.stem for p in project.profiles_dir.glob("*.yaml"))[0]
    plain = project.profile(name)
    with pytest.raises(ConfigError, match=r"workload file .*chat\.yaml does not exist"):
        project.profile(name, ["bench.workload=chat"])
    project.workloads_dir.mkdir(parents=True)
    workload = workload_of([[parse_scrape(before, 0.0), parse_scrape(after, 60.0)]], "chat", "r1", ["gpu1"],
                           "0.5.23", "now")
    (project.workloads_dir / "chat.yaml").write_text(workload_text(workload))
    bench = project.profile(name, ["bench.workload=chat"]).profile.bench
    from deploy_lib.metrics.workload import replay_shape
    assert (bench.input_len, bench.output_len, bench.range_ratio) == replay_shape(workload)
    assert plain.profile.bench.range_ratio == 1.0 and plain.profile.bench.workload is None


def test_the_command_refuses_a_bad_window_or_name_before_reaching_a_host() -> None:
    from helpers.cli import invoke
    window = invoke("workload", "--name", "chat", "--window", "ten", "-H", "no-such-host")
    assert window.returncode == 2 and "--window 'ten': give a positive duration" in window.stderr
    name = invoke("workload", "--name", "a/b", "-H", "no-such-host")
    assert name.returncode == 2 and "--name 'a/b': give a plain name" in name.stderr


def test_hosts_serving_different_releases_give_no_workload(texts: tuple[str, str], tmp_path: Path) -> None:
    from deploy_lib.commands.workload import HostScrapes
    before, after = texts
    scrapes = (parse_scrape(before, 0.0), parse_scrape(after, 60.0))
    with pytest.raises(PreflightError, match=r"the hosts serve different releases \(r1, r2\)"):
        record_workload("chat", [HostScrapes("gpu1", "r1", "0.5.23", scrapes),
                                 HostScrapes("gpu2", "r2", "0.5.23", scrapes)], tmp_path)
    assert list(tmp_path.iterdir()) == []
    workload, _ = record_workload("chat", [HostScrapes("gpu1", "r1", "0.5.23", scrapes),
                                           HostScrapes("gpu2", "r1", "0.5.23", scrapes)], tmp_path)
    assert (workload.hosts, workload.requests, workload.prompt_length.requests) == (("gpu1", "gpu2"), 48, 48)
