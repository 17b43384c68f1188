"""The simulated server on 127.0.0.1, from a local venv of the real wheels + the sim wheel (no VM)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.http_client import http
from helpers.upstream_edits import patch_sglang_0_5_23_gates
from helpers.waits import STATE_WAIT_S
from sglang_sim.throughput import Knobs, ThroughputModel
from sglang_sim.upstream import InstalledUpstream

from deploy_lib.facts.diagnose import diagnose
from deploy_lib.host_scripts import page_cache as page_cache_script
from sandbox import wheelhouse

pytestmark = pytest.mark.wheels

SHORT_PHASES = {"init": 0.1, "weights": 0.8, "kv_cache": 0.1, "cuda_graph": 0.2, "warmup": 0.6}
# a request the tests watch in flight: 60 tokens last 3 s at the sim's one-request rate (20 tok/s with decode graphs,
# 16.8 without; fused 4.5), long
# enough for a poller on a loaded machine to see it; a poller that misses it fails the test, it never waits for ever
IN_FLIGHT_TOKENS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]



@dataclass
class RunningSim:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def wait_states(self, path: str = "/health", deadline_s: float = STATE_WAIT_S) -> list[int | str]:
        """Distinct successive states of `path` until it answers 200."""
        seen: list[int | str] = []
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            status, _ = http(self.base + path)
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"not ready: {seen}\n{self.log.read_text()}")


@pytest.fixture(scope="module")
def patched_sim_venv(wheelhouse_default: wheelhouse.Wheelhouse, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sglang 0.5.23 + msgspec + the sim (no flashinfer: 0.7.2 has no gate), SGLang gates edited in place."""
    venv = tmp_path_factory.mktemp("patched") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    house = wheelhouse_default
    subprocess.run(wheelhouse.install_argv(str(venv / "bin/python"), (house.sglang, *house.dependencies, house.sim)),
                   check=True)
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    patch_sglang_0_5_23_gates(InstalledUpstream(site_packages / "sglang", None, "0.5.23"))
    return venv


@pytest.fixture
def start_sim(sim_venv: Path, tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, fault: str = "", config: dict | None = None, venv: Path = sim_venv,
              path: str | None = None, environ: dict[str, str] | None = None) -> RunningSim:
        """The sim as the rendered unit starts it: the venv's bin/ first on PATH (unless `path` is given), its compile
        caches in this test's directory (`environ` adds to or replaces its variables)."""
        port = free_port()
        (tmp_path / "config.json").write_text(json.dumps(
            {"phases_s": SHORT_PHASES, "state_dir": str(tmp_path / "state"), **(config or {})}))
        (tmp_path / "fault").write_text(fault)
        log = tmp_path / f"sim-{port}.log"
        env = {**os.environ, "SGLANG_SIM_CONFIG": str(tmp_path / "config.json"),
               "SGLANG_SIM_FAULT": str(tmp_path / "fault"),
               "SGLANG_SIM_NVIDIA_SMI": str(Path(__file__).parents[2] / "sandbox/nvidia-smi"),
               "PATH": path or f"{venv}/bin:{os.environ['PATH']}", "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
               "SGLANG_CACHE_DIR": str(tmp_path / "sglang-cache"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
               "SGLANG_DG_CACHE_DIR": str(tmp_path / "deep_gemm"), **(environ or {})}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(venv / "bin/python"), "-m", "sglang.launch_server", "--model-path", "zai-org/GLM-5-NVFP4",
                 "--tp-size", "8", "--port", str(port), *args],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        started.append(process)
        return RunningSim(process, f"http://127.0.0.1:{port}", log)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_unknown_flag_exits_2_with_argparse_message(start_sim) -> None:
    sim = start_sim("--nsa-decode-backend", "trtllm")
    assert sim.process.wait(timeout=STATE_WAIT_S) == 2
    assert "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm" in sim.log.read_text()


def test_port_closed_while_loading_then_503_then_200(start_sim) -> None:
    sim = start_sim("--enable-metrics")
    assert sim.wait_states("/health") == ["refused", 503, 200]
    assert http(sim.base + "/ready")[0] == 200  # 0.5.23 has /ready
    status, metrics = http(sim.base + "/metrics")
    assert status == 200 and b"sglang:num_running_reqs" in metrics
    log = sim.log.read_text()
    assert log.index("Load weight begin") < log.index("Capture target decode CUDA graph end") < log.index("fired up")


def test_api_key_guards_everything_but_the_probes(start_sim) -> None:
    sim = start_sim("--api-key", "s3cret")
    sim.wait_states("/health")
    assert http(sim.base + "/v1/models")[0] == 401
    assert http(sim.base + "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    status, body = http(sim.base + "/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and json.loads(body)["data"][0]["id"] == "zai-org/GLM-5-NVFP4"
    assert http(sim.base + "/ready")[0] == 200


def test_streamed_chat_completion_counts_its_tokens(start_sim) -> None:
    sim = start_sim()
    sim.wait_states("/health")
    status, body = http(sim.base + "/v1/chat/completions", body={
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True}})
    events = [line.removeprefix("data: ") for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    words = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]).split()
    assert len(words) == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_stream_interval_writes_the_first_token_then_every_n_with_the_count_in_meta_info(start_sim) -> None:
    """Input tried: --stream-interval 4 (SGLang's own flag) and a streamed /generate of 10 tokens, as the benchmark
    client sends it: 1 + 4 + 4 + 1 tokens in four writes, each carrying the count so far (what the client counts)."""
    sim = start_sim("--stream-interval", "4")
    sim.wait_states("/health")
    status, body = http(sim.base + "/generate", body={"text": "hello", "stream": True,
                                                      "sampling_params": {"max_new_tokens": 10}})
    events = [line.removeprefix("data: ") for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    counts = [json.loads(event)["meta_info"]["completion_tokens"] for event in events[:-1]]
    assert counts == [1, 5, 9, 10]


def test_fusion_on_sm120_with_unpatched_gate_exits_with_the_upstream_error(start_sim) -> None:
    sim = start_sim("--enable-flashinfer-allreduce-fusion")
    assert sim.process.wait(timeout=STATE_WAIT_S) == 1
    assert "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in sim.log.read_text()


def test_fusion_on_an_sm90_host_starts(start_sim) -> None:
    sim = start_sim("--flashinfer-allreduce-fusion-backend", "auto", config={"gpus": {"model": "h100"}})
    assert sim.wait_states("/health")[-1] == 200


def test_health_generate_answers_only_after_a_generation_as_sglangs_does(start_sim, monkeypatch) -> None:
    """SGLang's /health_generate sends a 1-token generation and answers 200 once the scheduler produced output, 503
    when it produced none within SGLANG_HEALTH_CHECK_TIMEOUT; /ready does not generate. Inputs tried: a healthy
    server, then one whose generations hang (the fault), with the timeout at 2 s."""
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2")
    healthy = start_sim("--enable-metrics")
    healthy.wait_states("/ready")

    def generated_tokens() -> str:
        metrics = http(healthy.base + "/metrics")[1].decode().splitlines()
        return next(line for line in metrics if line.startswith("sglang:generation_tokens_total"))

    before = generated_tokens()
    assert http(healthy.base + "/health_generate")[0] == 200
    assert generated_tokens() == before, "its generation is not in /metrics (log_metrics=False)"
    healthy.process.kill()
    hung = start_sim(fault="generation-hang")
    hung.wait_states("/ready")
    assert http(hung.base + "/health_generate")[0] == 503
    assert http(hung.base + "/ready")[0] == 200
    assert "Health check failed" in hung.log.read_text()


def test_sigterm_finishes_the_request_in_flight_then_exits_0(start_sim) -> None:
    sim = start_sim("--enable-metrics")
    sim.wait_states("/health")
    result: dict[str, tuple[int | str, bytes]] = {}
    generate = {"text": "hi", "sampling_params": {"max_new_tokens": IN_FLIGHT_TOKENS}}

    def request() -> None:
        result["generate"] = http(sim.base + "/generate", body=generate)

    worker = threading.Thread(target=request)
    worker.start()
    while running_requests(sim) == 0 and worker.is_alive():  # in flight: the sim counts it (not a fixed sleep)
        time.sleep(0.02)
    assert worker.is_alive(), "the request ended before it was seen in flight"
    sim.process.send_signal(signal.SIGTERM)
    worker.join(timeout=30)
    assert sim.process.wait(timeout=STATE_WAIT_S) == 0
    status, body = result["generate"]
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == IN_FLIGHT_TOKENS
    assert http(sim.base + "/health")[0] == "refused"


def test_v1_loads_counts_the_requests_in_flight_as_sglangs_does(start_sim) -> None:
    """What a router's drain waits on (sglang/srt/entrypoints/v1_loads.py): running + waiting requests per DP rank."""
    sim = start_sim()
    sim.wait_states("/health")

    def in_flight() -> int:
        status, body = http(sim.base + "/v1/loads?include=core")
        assert status == 200, body
        return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in json.loads(body)["loads"])

    assert in_flight() == 0
    worker = threading.Thread(target=http, args=(sim.base + "/generate",),
                              kwargs={"body": {"text": "hi", "sampling_params": {"max_new_tokens": IN_FLIGHT_TOKENS}}})
    worker.start()
    seen = 0
    while seen == 0 and worker.is_alive():  # until the request is seen in flight (or it is over, unseen)
        seen = in_flight()
    worker.join(timeout=60)
    assert seen == 1
    assert in_flight() == 0


def gauges(sim: RunningSim) -> dict[str, float]:
    metrics = http(sim.base + "/metrics")[1].decode()
    return {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("sglang:") and "{" in line}


def running_requests(sim: RunningSim) -> float:
    return gauges(sim)["sglang:num_running_reqs"]


def generation_rate_during_one_request(sim: RunningSim) -> float:
    """sglang:gen_throughput while a single long request is generating (the model's rate, not a timing)."""
    worker = threading.Thread(target=http, args=(sim.base + "/generate",),
                              kwargs={"body": {"text": "x", "sampling_params": {"max_new_tokens": IN_FLIGHT_TOKENS}}})
    worker.start()
    try:
        while worker.is_alive():
            values = gauges(sim)
            if values["sglang:num_running_reqs"] == 1:
                return values["sglang:gen_throughput"]
            time.sleep(0.02)
        raise AssertionError("the request ended before it was seen generating")
    finally:
        worker.join(timeout=60)


def test_fusion_forced_on_sm120_through_the_gate_only_patch_runs_at_degraded_throughput(
        start_sim, patched_sim_venv: Path) -> None:
    model = ThroughputModel.default()
    knobs = Knobs.from_args({}, model.defaults)  # neither start sets a knob the model answers
    fused = start_sim("--enable-flashinfer-allreduce-fusion", "--enable-metrics", venv=patched_sim_venv)
    fused.wait_states("/health")
    assert generation_rate_during_one_request(fused) == pytest.approx(model.aggregate_tok_s(1, True, knobs), abs=0.01)
    plain = start_sim("--enable-metrics", venv=patched_sim_venv)
    plain.wait_states("/health")
    assert generation_rate_during_one_request(plain) == pytest.approx(model.aggregate_tok_s(1, False, knobs), abs=0.01)


def test_a_cold_flashinfer_jit_cache_needs_ninja_on_path(start_sim, patched_sim_venv: Path, tmp_path: Path) -> None:
    """As FlashInfer's JIT: the fused start builds trtllm_comm by running `ninja` by name (jit/cpp_ext.py run_ninja)."""
    no_ninja_here = tmp_path / "bin-without-ninja"
    no_ninja_here.mkdir()
    cold = start_sim("--enable-flashinfer-allreduce-fusion", venv=patched_sim_venv, path=str(no_ninja_here))
    assert cold.process.wait(timeout=300) == 1  # a bound for a loaded machine, not a timing assertion
    log = cold.log.read_text()
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'" in log
    assert "in run_ninja" in log

    built = start_sim("--enable-flashinfer-allreduce-fusion", venv=patched_sim_venv)  # the venv's bin/ has ninja
    built.wait_states("/health", deadline_s=300)
    assert "Building JIT module trtllm_comm; this can take several minutes on first use." in built.log.read_text()
    built.process.terminate()
    built.process.wait(timeout=300)

    warm = start_sim("--enable-flashinfer-allreduce-fusion", venv=patched_sim_venv, path=str(no_ninja_here))
    warm.wait_states("/health", deadline_s=300)  # the module is in the JIT cache now: no build, no ninja
    assert "Building JIT module" not in warm.log.read_text()


def test_node_0_of_two_waits_for_rank_1_at_dist_init_addr_and_a_dead_rank_fails_it_like_nccl(start_sim) -> None:
    """A real TCP rendezvous: node 0 listens on --dist-init-addr and loads nothing until node rank 1 has joined;
    node 1 serves no HTTP; when node 1 dies, node 0 fails as NCCL's watchdog makes it fail (exit 1)."""
    address = f"127.0.0.1:{free_port()}"
    patient = {"rendezvous_timeout_s": STATE_WAIT_S}  # node 1's start, however slow, is never raced
    head = start_sim("--nnodes", "2", "--node-rank", "0", "--dist-init-addr", address, config=patient)
    host, port = address.split(":")
    while True:  # node 0 listens once it has begun distributed init
        assert head.process.poll() is None, head.log.read_text()
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    assert "Load weight begin" not in head.log.read_text()
    assert http(head.base + "/health")[0] == "refused"
    follower = start_sim("--nnodes", "2", "--node-rank", "1", "--dist-init-addr", address, config=patient)
    assert head.wait_states("/health")[-1] == 200
    while "node rank 0 serves HTTP" not in follower.log.read_text():
        assert follower.process.poll() is None, follower.log.read_text()
        time.sleep(0.05)
    assert "2 of 2 nodes joined (node rank 1)" in follower.log.read_text()
    assert http(follower.base + "/health")[0] == "refused"
    follower.process.kill()
    assert head.process.wait(timeout=STATE_WAIT_S) == 1
    assert "Watchdog caught collective operation timeout" in head.log.read_text()


def test_node_0_alone_times_out_at_the_rendezvous_with_torchs_message(start_sim) -> None:
    head = start_sim("--nnodes", "2", "--node-rank", "0", "--dist-init-addr", f"127.0.0.1:{free_port()}",
                     config={"rendezvous_timeout_s": 0.5})
    assert head.process.wait(timeout=STATE_WAIT_S) == 1
    assert "torch.distributed.DistStoreError: Timed out after 0 seconds waiting for clients. 1/2 clients joined." \
        in head.log.read_text()


def test_both_nodes_stopped_together_exit_0(start_sim) -> None:
    """A coordinated stop is not a dead rank: neither node reports an NCCL timeout."""
    address = f"127.0.0.1:{free_port()}"
    nodes = [start_sim("--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", address) for rank in (0, 1)]
    nodes[0].wait_states("/health")
    for node in nodes:
        node.process.send_signal(signal.SIGTERM)
    assert [node.process.wait(timeout=STATE_WAIT_S) for node in nodes] == [0, 0]
    assert not any("Watchdog" in node.log.read_text() for node in nodes)


# --- the launch knobs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("graph_args", "failing_line"), [
    ((), "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "),
    (("--cuda-graph-backend-decode", "disabled"), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "),
])
def test_mem_fraction_static_too_high_fails_the_start_with_torchs_oom_which_the_tool_diagnoses(
        start_sim, graph_args: tuple[str, ...], failing_line: str) -> None:
    """--mem-fraction-static 0.99 leaves ~1 GB of the 96 GB GPU beside the static pool: the decode graphs' capture
    (SGLang re-raises torch's OOM with its advice) or, without graphs, the warmup forward runs out of memory."""
    sim = start_sim("--mem-fraction-static", "0.99", *graph_args)
    assert sim.process.wait(timeout=STATE_WAIT_S) == 1
    log = sim.log.read_text()
    assert failing_line in log
    assert "The server is fired up" not in log and http(sim.base + "/health")[0] == "refused"
    assert diagnose(log.splitlines()).signature == "cuda_out_of_memory"


def test_without_decode_cuda_graphs_no_capture_phase_and_decode_is_slower_than_a_peer_with_them(start_sim) -> None:
    """--disable-cuda-graph (deprecated in 0.5.23, still parsed) and its replacement both skip the capture; the
    decode rate (sglang:gen_throughput, the model's figure) is the graphs' peer's over the configured factor."""
    graphs = start_sim("--enable-metrics")
    eager = start_sim("--enable-metrics", "--disable-cuda-graph")
    replacement = start_sim("--enable-metrics", "--cuda-graph-backend-decode", "disabled")
    for sim in (graphs, eager, replacement):
        sim.wait_states("/health")
    log = graphs.log.read_text()
    assert log.index("Load weight end") < log.index("KV Cache is allocated") \
        < log.index("Capture target decode CUDA graph begin") < log.index("Capture target decode CUDA graph end") \
        < log.index("The server is fired up and ready to roll!")
    for sim in (eager, replacement):
        assert "CUDA graph begin" not in sim.log.read_text() and "CUDA graph end" not in sim.log.read_text()
    factor = ThroughputModel.default().cuda_graph_decode_factor
    assert generation_rate_during_one_request(graphs) == pytest.approx(
        factor * generation_rate_during_one_request(eager), rel=1e-3)


def test_requests_beyond_max_running_requests_wait_and_get_their_first_token_after_a_slot_frees(start_sim) -> None:
    """Four streamed requests against a batch of two: two run, two wait (as /v1/loads and /metrics count them), and
    no waiting request gets its first token before a running one has finished. A peer without the cap runs all four."""
    capped = start_sim("--enable-metrics", "--max-running-requests", "2")
    peer = start_sim("--enable-metrics")
    for sim in (capped, peer):
        sim.wait_states("/health")
    for sim, most_running, most_waiting in ((capped, 2, 2), (peer, 4, 0)):
        first_token: list[float] = []
        finished: list[float] = []

        def stream(sim: RunningSim = sim, first_token: list[float] = first_token,
                   finished: list[float] = finished) -> None:
            request = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": IN_FLIGHT_TOKENS}}
            events = stream_events(sim.base + "/generate", request)
            first_token.append(next(events))
            finished.append(list(events)[-1])

        workers = [threading.Thread(target=stream) for _ in range(4)]
        for worker in workers:
            worker.start()
        seen: set[tuple[int, int]] = set()
        while any(worker.is_alive() for worker in workers):
            load = json.loads(http(sim.base + "/v1/loads")[1])["loads"][0]
            seen.add((load["num_running_reqs"], load["num_waiting_reqs"]))
            time.sleep(0.02)
        for worker in workers:
            worker.join()
        assert max(running for running, _ in seen) == most_running, seen
        assert max(waiting for _, waiting in seen) == most_waiting, seen
        assert len(finished) == 4
        if sim is capped:
            assert sorted(first_token)[2] >= min(finished)  # the third first token came after the first finish
            assert gauges(sim)["sglang:num_queue_reqs"] == 0


def stream_events(url: str, body: dict) -> Iterator[float]:
    """The arrival time (monotonic) of each streamed event of a POST."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=STATE_WAIT_S) as response:
        for line in response:
            if line.startswith(b"data: "):
                yield time.monotonic()


# --- what a start costs: the weights read from disk, the compile caches, /health per version ----------------------

SHARD_BYTES = 4 << 20


def model_with_shards(directory: Path, count: int) -> list[Path]:
    """A local model directory: its config and `count` safetensors shards, flushed and dropped from the page cache."""
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    shards = []
    for number in range(1, count + 1):
        shard = directory / f"model-{number:05d}-of-{count:05d}.safetensors"
        with shard.open("wb") as out:
            out.write(os.urandom(SHARD_BYTES))
            out.flush()
            os.fsync(out.fileno())
            os.posix_fadvise(out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        shards.append(shard)
    return shards


def resident_bytes(directory: Path) -> int:
    measured = page_cache_script.measure({"root": str(directory)})
    return sum(int(file["resident"]) for file in measured["files"])  # type: ignore[index, union-attr]


def capture_elapsed_s(log: str) -> float:
    found = re.search(r"Capture target decode CUDA graph end\..*?elapsed=([\d.]+) s", log)
    assert found, log
    return float(found[1])


def test_the_weights_phase_reads_every_shard_from_disk_with_sglangs_progress_bar(start_sim, tmp_path: Path) -> None:
    """SGLang reads each safetensors shard in turn: a start with the shards out of the page cache leaves them in it,
    and the bar of safetensors_weights_iterator counts them (0.5.23: one line, updates split by carriage returns)."""
    model = tmp_path / "model"
    model_with_shards(model, 3)
    assert resident_bytes(model) == 0, "the shards start out of the page cache"
    sim = start_sim("--model-path", str(model))
    sim.wait_states("/ready")
    assert resident_bytes(model) >= 0.9 * 3 * SHARD_BYTES, "read whole (the machine's other work may evict a page)"
    log = sim.log.read_bytes().decode()  # read_text would turn tqdm's carriage returns into newlines
    bar = next(line for line in log.split("\n") if "Loading safetensors checkpoint shards" in line)
    updates = [update for update in bar.split("\r") if update]
    assert [update.split(" [")[0] for update in updates] == [
        f"Loading safetensors checkpoint shards: {100 * done // 3:3d}% Completed | {done}/3" for done in range(4)]
    assert log.index("Load weight begin") < log.index("Loading safetensors") < log.index("Load weight end")


def test_cold_compile_caches_cost_the_capture_their_time_once_and_deepgemm_logs_at_every_start(
        start_sim, tmp_path: Path) -> None:
    """On an SM90 host the capture builds DeepGEMM's and Triton's kernels: a cold start pays both phases and fills
    SGLANG_DG_CACHE_DIR and TRITON_CACHE_DIR; a start on those caches writes nothing there. SGLang logs its DeepGEMM
    pre-compile lines at every start. Inputs tried: the same caches twice; an SM120 host (no DeepGEMM)."""
    phases = {**SHORT_PHASES, "deep_gemm": 2.0, "triton": 1.0}
    h100 = {"phases_s": phases, "gpus": {"model": "h100"}}
    cold = start_sim(config=h100)
    cold.wait_states("/ready")
    cold_log = cold.log.read_text()
    assert capture_elapsed_s(cold_log) >= 3.0
    assert cold_log.index("Capture target decode CUDA graph begin") < cold_log.index("Entering DeepGEMM JIT") \
        < cold_log.index("Try DeepGEMM JIT Compiling") < cold_log.index("Capture target decode CUDA graph end")
    filled = {path: path.stat().st_mtime_ns for cache in ("deep_gemm", "triton")
              for path in (tmp_path / cache).iterdir()}
    assert len(filled) == 2, "each cache holds the kernels built"
    cold.process.kill()
    warm = start_sim(config=h100)
    warm.wait_states("/ready")
    assert "Try DeepGEMM JIT Compiling" in warm.log.read_text()
    assert {path: path.stat().st_mtime_ns for cache in ("deep_gemm", "triton")
            for path in (tmp_path / cache).iterdir()} == filled, "a warm start builds nothing"
    warm.process.kill()
    sm120 = start_sim(config={"phases_s": phases}, environ={"SGLANG_DG_CACHE_DIR": str(tmp_path / "dg-sm120")})
    sm120.wait_states("/ready")
    assert "DeepGEMM" not in sm120.log.read_text() and not (tmp_path / "dg-sm120").exists()


@pytest.mark.parametrize("setting", [None, "false"])
def test_health_runs_a_generation_by_default_and_answers_at_once_with_the_setting_off(start_sim, setting) -> None:
    """SGLang's /health is health_generate unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off (default on): on a
    server whose generations hang it answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT, or 200 at once with it off."""
    environ = {"SGLANG_HEALTH_CHECK_TIMEOUT": "2"}
    if setting is not None:
        environ["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = setting
    hung = start_sim(fault="generation-hang", environ=environ)
    hung.wait_states("/ready")
    assert http(hung.base + "/health")[0] == (503 if setting is None else 200)
    assert http(hung.base + "/health_generate")[0] == 503
