"""Judged by the traffic served (issue 42), on one sandbox guest: traffic of a known shape sent to the server and
read back by `workload` as a file whose distributions count what was sent; the watch around a deploy rolling back a
release that serves ten times slower, with both windows' live figures in its diagnosis; and keeping one it had too
little traffic to judge, saying why. The test sends the traffic itself, over the guest's own veth, at a fixed rate
(open loop, as users do). Short windows (the profile's smallest watch window), so the module takes about two
minutes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from helpers.json_doc import envelope, result
from helpers.recording_progress import RecordingProgress
from helpers.rig import REFERENCE, Rig

from deploy_lib.errors import WatchFailed
from deploy_lib.metrics.workload import Lengths, Workload
from sandbox import manage
from sandbox.traffic import Paced, Shape

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
WATCHED, SLOW, QUIET = "traffic-watched", "traffic-slow", "traffic-quiet"
GUEST_CONFIG, SLOW_CONFIG = "/etc/sglang-sim/config.json", "/etc/sglang-sim/slow.json"
WINDOW_S, MIN_REQUESTS = 10, 25
PROFILES = {
    # metrics on for the watch and `workload`; the radix cache on, so a shared prefix is cached and counted
    WATCHED: (f"extends: {REFERENCE}\nfeatures:\n  metrics: true\n  radix_cache: true\n"
              f"watch:\n  window_s: {WINDOW_S}\n  min_requests: {MIN_REQUESTS}\n"),
    # the simulator's throughput scale 0.1 for this release alone: every rate ten times lower (prefill and decode)
    SLOW: f"extends: {WATCHED}\nenv:\n  SGLANG_SIM_CONFIG: {SLOW_CONFIG}\n",
    QUIET: f"extends: {WATCHED}\nenv:\n  OMP_NUM_THREADS: '4'\n",
}
@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return Rig.on(sandbox_venv, tmp_path_factory, PROFILES, profile=WATCHED)


@pytest.fixture(scope="module")
def watched(rig: Rig) -> str:
    """The watched profile serving: the release the traffic goes to."""
    return rig.deploy(WATCHED).release_id


def paced(rig: Rig, rate_per_s: float, body: Callable[[int], bytes]) -> Paced:
    return Paced(f"http://{rig.guest.guest_ip}:8000", rate_per_s, body)


# --- the workload -------------------------------------------------------------------------------------------------
# three requests in four: a long prompt (2,400 tokens) and a short answer (8); the fourth: 1,200 tokens and 120; every
# prompt starts with the same 1,024 tokens
LONG, SHORT = Shape(2400, 8, shared_tokens=1024), Shape(1200, 120, shared_tokens=1024)


def workload_request(number: int) -> Shape:
    return SHORT if number % 4 == 3 else LONG


def per_bucket(lengths: Lengths, sent: list[int]) -> tuple[dict[int | None, int], dict[int | None, int]]:
    """The file's requests per bucket, and the sent lengths counted in the same buckets."""
    def bucket(length: int) -> int | None:
        return next((b.upto for b in lengths.buckets if b.upto is None or length <= b.upto), None)

    recorded = {b.upto: b.requests for b in lengths.buckets if b.requests}
    return recorded, dict(Counter(bucket(length) for length in sent))


FIRST_SCRAPE = re.compile(r"\$ .* < stdin \(\d+ bytes\) \(exit 0, ")  # a step done, as -v prints it


@pytest.fixture(scope="module")
def workload_cli(rig: Rig) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """`sglang-deploy workload ARGS --json` started from the rig's project against the guest."""
    started: list[subprocess.Popen[str]] = []

    def start(*argv: str) -> subprocess.Popen[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEPLOY_")}
        process = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), "workload", *argv,
                                    "--inventory", rig.inventory, "--host", rig.guest.name, "--json"],
                                   cwd=rig.project.root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=environ)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_workload_reads_back_the_shape_of_the_traffic_sent(rig: Rig, watched: str,
                                                           workload_cli: Callable[..., subprocess.Popen[str]]
                                                           ) -> None:
    """40 requests sent inside a 25 s window (once its first scrape is back, answered before its last): the file
    counts each prompt and output length in the bucket it belongs to, the requests, and the shared prefix's cached
    share."""
    reading = workload_cli("--name", "long-prompts", "--window", "25s", "--every", "5s", "-v")
    assert reading.stderr is not None
    seen: list[str] = []
    for line in reading.stderr:  # -v prints each step as it comes back: the first after this note is the first scrape
        seen.append(line)
        if FIRST_SCRAPE.search(line) and any("workload: reading release" in said for said in seen):
            break
    else:
        pytest.fail(f"workload ended before its window: {''.join(seen)}")
    traffic = paced(rig, 8, lambda n: workload_request(n).body(n)).send(40)
    stdout, stderr = reading.communicate(timeout=120)
    assert reading.returncode == 0, stderr
    assert traffic.failures == [] and len(traffic.latencies) == 40
    path = rig.project.root / "inventory" / "workloads" / "long-prompts.yaml"
    written = Workload.model_validate(yaml.safe_load(path.read_text()))
    assert (written.release, written.requests) == (watched, 40)
    shapes = [workload_request(n) for n in range(40)]
    recorded, sent = per_bucket(written.prompt_length, [shape.prompt_tokens for shape in shapes])
    assert recorded == sent and len(sent) == 2, f"prompt lengths per bucket: file {recorded}, sent {sent}"
    recorded, sent = per_bucket(written.output_length, [shape.output_tokens for shape in shapes])
    assert recorded == sent and len(sent) == 2, f"output lengths per bucket: file {recorded}, sent {sent}"
    prompt_tokens = sum(shape.prompt_tokens for shape in shapes)
    assert written.prompt_length.mean == pytest.approx(prompt_tokens / 40)
    # every prompt after the first finds the shared prefix cached (whole pages of it: 1,024 is 64 pages of 16)
    assert written.cached_share == pytest.approx(39 * LONG.shared_tokens / prompt_tokens)
    shown = result(envelope(stdout, reading.returncode))
    assert Workload.model_validate(shown["workload"]) == written, "--json shows what the file holds"


# --- the watch ----------------------------------------------------------------------------------------------------
def watch_traffic(first_id: int) -> Callable[[int], bytes]:
    """1,000 prompt tokens of each request's own (no prefix to cache: the new server starts with an empty cache), 2
    output tokens, every other request streamed; ids from `first_id` (each test its own)."""
    plain, streamed = Shape(1000, 2, first_id=first_id), Shape(1000, 2, stream=True, first_id=first_id)
    return lambda n: (streamed if n % 2 == 0 else plain).body(n)


def test_a_release_serving_ten_times_slower_is_rolled_back_with_the_live_figures(rig: Rig, watched: str) -> None:
    config = json.loads(rig.root(f"cat {GUEST_CONFIG}"))
    rig.write(SLOW_CONFIG, json.dumps({**config, "throughput_scale": config.get("throughput_scale", 1.0) / 10}))
    progress = RecordingProgress()
    with pytest.raises(WatchFailed) as caught:
        paced(rig, 5, watch_traffic(10**9)).during(lambda: rig.deploy(SLOW, progress))
    message = caught.value.message
    assert "live latency regressed (p99 TTFT " in message and f"rolled back, release {watched} is serving" in message
    ratio = re.search(r"p99 TTFT \S+ \S+ -> \S+ \S+ \((\d+\.\d+)x, beyond 1.5x\)", message)
    assert ratio and float(ratio.group(1)) >= 5, message
    before, after = caught.value.evidence
    assert before.startswith("before the switch: ") and after.startswith("after the switch: ")
    assert all(re.search(r"\d+ requests in \d+ s, p50/p99 TTFT \d+ ms/\d+ ms", line) for line in (before, after))
    assert rig.current() == watched, "rolled back to the release that served before"
    failed = [e for e in rig.history() if e["event"] == "deploy" and e["outcome"] == "failed"]
    assert failed and str(failed[-1]["cause"]).startswith("live latency regressed (p99 TTFT "), failed[-1:]
    assert str(failed[-1]["cause"]) in message, "history keeps the verdict with its figures"
    figures: dict[str, float] = failed[-1]["figures"]  # type: ignore[assignment]
    assert figures["watch.after.ttft_p99_s"] >= 5 * figures["watch.before.ttft_p99_s"], figures


def test_a_release_with_too_little_traffic_to_judge_is_kept_and_the_watch_says_why(rig: Rig, watched: str) -> None:
    assert rig.current() == watched
    progress, outcomes = RecordingProgress(), []
    traffic = paced(rig, 0.5, watch_traffic(2 * 10**9)).during(lambda: outcomes.append(rig.deploy(QUIET, progress)))
    [outcome] = outcomes
    assert outcome.action == "deployed" and rig.current() == outcome.release_id != watched
    verdicts = [n for n in progress.of_kind("note") if str(n).startswith("watch: too little traffic")]
    assert verdicts and f"at least {MIN_REQUESTS} each): kept" in str(verdicts[0]), progress.of_kind("note")
    assert traffic.latencies, "some traffic was served: too little, not none"
    [kept] = [e for e in rig.history() if e["event"] == "deploy" and e["release"] == outcome.release_id]
    assert 0 < kept["figures"]["watch.after.requests"] < MIN_REQUESTS, "the windows read are kept for the report"  # type: ignore[index]
