"""The simulator's pacing model (sandbox/sim/sglang_sim/engine.py, throughput.py): what a user tuning the launch
flags would see. Pacing runs on a virtual clock here, the batch cap with real threads waiting in line."""

from __future__ import annotations

import sys
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sandbox" / "sim"))
from sglang_sim import engine as sim_engine
from sglang_sim import startup_texts
from sglang_sim.engine import Engine, Launch
from sglang_sim.server import BATCH_TICK_S, STREAM_TICK_S
from sglang_sim.throughput import ThroughputModel

from deploy_lib.facts.diagnose import diagnose

TTFT_S = 0.1
TOK_S = 40.0  # one request alone
GPU_MIB = 97887  # one RTX PRO 6000 Blackwell, as the sandbox's nvidia-smi reports it
# the reference profile's launch (inventory/profiles/glm5-nvfp4.yaml, as rendered for SGLang 0.5.23)
REFERENCE_ARGS = {"model_path": "lukealonso/GLM-5-NVFP4", "mem_fraction_static": 0.92, "max_running_requests": 1024,
                  "moe_runner_backend": "flashinfer_cutlass", "cuda_graph_backend_decode": "disabled",
                  "cuda_graph_backend_prefill": "disabled"}
MODEL = ThroughputModel.default()
REFERENCE = Launch.from_args(REFERENCE_ARGS).knobs


class FlatModel:
    """Every request gets TOK_S whatever the concurrency; the first token after TTFT_S."""

    def aggregate_tok_s(self, concurrency: int, *_: Any) -> float:
        return TOK_S * concurrency

    def per_request_tok_s(self, concurrency: int, *_: Any) -> float:
        return TOK_S

    def time_to_first_token_s(self, prompt_tokens: int, *_: Any) -> float:
        return TTFT_S


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def make_engine(model: Any = MODEL, **args: Any) -> Engine:
    launch = Launch.from_args({**REFERENCE_ARGS, **args})
    return Engine(model=model, launch=launch, fused_on_sm120=False, scale=1.0, hang_generation=False,
                  die_after=None, on_fatal=lambda message: None)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    virtual = VirtualClock()
    monkeypatch.setattr(sim_engine, "time", SimpleNamespace(sleep=virtual.sleep, monotonic=virtual.monotonic))
    return virtual


def wait_until(condition: Any) -> None:
    """Until the threads under test reach a state (bounded by a count of checks, never by a clock)."""
    event = threading.Event()
    for _ in range(100_000):
        if condition():
            return
        event.wait(0.001)
    raise AssertionError("the state was never reached")


@pytest.mark.parametrize(("max_tokens", "tick_s"), [(4, BATCH_TICK_S), (4, STREAM_TICK_S), (30, BATCH_TICK_S),
                                                    (1, BATCH_TICK_S)])
def test_an_answer_takes_its_first_token_then_one_token_time_per_token_not_a_whole_tick(
        clock: VirtualClock, max_tokens: int, tick_s: float) -> None:
    engine = make_engine(FlatModel())
    assert sum(engine.generate(prompt_tokens=5, max_tokens=max_tokens, tick_s=tick_s)) == max_tokens
    assert clock.now == pytest.approx(TTFT_S + (max_tokens - 1) / TOK_S)


def test_stream_interval_writes_the_first_token_at_once_then_every_n_tokens_in_the_same_time(
        clock: VirtualClock) -> None:
    """Input tried: --stream-interval 8 on a 32-token answer (the sandbox profile's setting): five writes, not 32."""
    engine = make_engine(FlatModel(), stream_interval=8)
    writes = list(engine.generate(prompt_tokens=5, max_tokens=32, tick_s=STREAM_TICK_S,
                                  interval=engine.launch.stream_interval))
    assert writes == [1, 8, 8, 8, 7]
    assert clock.now == pytest.approx(TTFT_S + 31 / TOK_S)


def fill(engine: Engine, concurrency: int) -> list[threading.Thread]:
    """`concurrency` requests arrive at once; those beyond the cap wait in line (in threads, released at the end)."""
    waiters = []
    for _ in range(concurrency):
        if engine.running < engine.launch.max_running_requests:
            engine._admit(32)
        else:
            waiter = threading.Thread(target=engine._admit, args=(32,), daemon=True)
            waiter.start()
            waiters.append(waiter)
    wait_until(lambda: engine.waiting == len(waiters))
    return waiters


def drain(engine: Engine, waiters: list[threading.Thread]) -> None:
    while engine.running:
        engine._leave(32)
    for waiter in waiters:
        waiter.join()


def test_at_concurrency_1024_the_batch_runs_at_the_models_rate_for_its_cap_not_for_the_offered_load() -> None:
    """The reference user's step, 64 -> 1,024 running requests: the gain is the model's curve between the two caps
    (its anchors: tests/sandbox/test_sim_model.py), because the requests beyond the cap wait instead of running."""
    capped, uncapped = make_engine(max_running_requests=64), make_engine(max_running_requests=1024)
    capped_line, uncapped_line = fill(capped, 1024), fill(uncapped, 1024)
    try:
        assert (capped.running, capped.waiting) == (64, 960)
        assert (uncapped.running, uncapped.waiting) == (1024, 0)
        assert capped.aggregate_tok_s() == pytest.approx(MODEL.aggregate_tok_s(64, False, REFERENCE, 32))
        assert uncapped.aggregate_tok_s() == pytest.approx(MODEL.aggregate_tok_s(1024, False, REFERENCE, 32))
        assert uncapped.aggregate_tok_s() > capped.aggregate_tok_s()
    finally:
        drain(capped, capped_line)
        drain(uncapped, uncapped_line)


def test_requests_beyond_the_cap_wait_in_arrival_order() -> None:
    engine = make_engine(max_running_requests=2)
    engine._admit(32)
    engine._admit(32)
    admitted: list[int] = []
    waiters = []
    for number in range(3):
        waiter = threading.Thread(target=lambda n=number: (engine._admit(32), admitted.append(n)))
        waiter.start()
        waiters.append(waiter)
        wait_until(lambda n=number: engine.waiting == n + 1)  # arrived, in this order
    assert (engine.running, engine.waiting, admitted) == (2, 3, [])
    for expected in ([0], [0, 1], [0, 1, 2]):
        engine._leave(32)
        wait_until(lambda e=expected: admitted == e)
        assert engine.running == 2
    drain(engine, waiters)
    assert (engine.running, engine.waiting) == (0, 0)


def test_a_request_queued_behind_the_cap_has_its_wait_in_its_ttft(clock: VirtualClock) -> None:
    engine = make_engine(FlatModel(), max_running_requests=1)
    first = engine.generate(prompt_tokens=5, max_tokens=40, tick_s=BATCH_TICK_S)
    next(first)  # in the batch: its first token is out
    first_ttft = engine.ttft_sum_s
    second = threading.Thread(target=lambda: sum(engine.generate(5, 4, BATCH_TICK_S)))
    second.start()
    wait_until(lambda: engine.waiting == 1)
    started_waiting = clock.now
    rest_of_first = sum(first)
    finished_first = clock.now
    second.join()
    assert rest_of_first == 39 and first_ttft == pytest.approx(TTFT_S)
    assert engine.ttft_sum_s - first_ttft == pytest.approx(finished_first - started_waiting + TTFT_S)
    assert engine.ttft_sum_s - first_ttft > 10 * first_ttft  # 39 tokens at 40 tok/s in line, then its own prefill


# --- the knobs, relative to the reference setup ---------------------------------------------------------------

def test_the_reference_setup_reproduces_the_anchors_and_fusion_on_sm120_its_0_27x() -> None:
    assert MODEL.aggregate_tok_s(64, knobs=REFERENCE, prompt_tokens=32) == pytest.approx(880)
    assert MODEL.aggregate_tok_s(1024, knobs=REFERENCE, prompt_tokens=32) == pytest.approx(3740)
    fused = MODEL.aggregate_tok_s(64, True, REFERENCE, 32) / MODEL.aggregate_tok_s(64, False, REFERENCE, 32)
    assert fused == pytest.approx(236 / 880)


@pytest.mark.parametrize(("args", "factor"), [
    ({"disable_flashinfer_autotune": True}, 0.8),        # flashinfer_cutlass falls back to untuned tactics
    ({"moe_runner_backend": "triton"}, 0.6),
    ({"moe_runner_backend": "triton", "disable_flashinfer_autotune": True}, 0.6),  # triton is not autotuned
    ({"moe_runner_backend": "cutlass"}, 0.85),
    ({"cuda_graph_backend_decode": None}, 1.2),          # decode graphs on: batches up to 512 replay them
])
def test_moe_backend_autotune_and_cuda_graph_change_the_decode_rate(args: dict[str, Any], factor: float) -> None:
    knobs = Launch.from_args({**REFERENCE_ARGS, **args}).knobs
    assert MODEL.aggregate_tok_s(256, knobs=knobs, prompt_tokens=32) == pytest.approx(
        factor * MODEL.aggregate_tok_s(256, knobs=REFERENCE, prompt_tokens=32))


@pytest.mark.parametrize("args", [{"disable_cuda_graph": True}, {"cuda_graph_backend_decode": "disabled"},
                                  {"disable_decode_cuda_graph": True}])
def test_every_spelling_of_no_decode_graph_decodes_eagerly(args: dict[str, Any]) -> None:
    base = {k: v for k, v in REFERENCE_ARGS.items() if not k.startswith("cuda_graph")}
    assert Launch.from_args(base).knobs.decode_cuda_graph
    assert not Launch.from_args({**base, **args}).knobs.decode_cuda_graph


def test_decode_graphs_do_not_help_batches_above_their_max_batch_size() -> None:
    graphs = replace(REFERENCE, decode_cuda_graph=True)
    assert MODEL.decode_factor(graphs, 512, 32) == pytest.approx(1.2)
    assert MODEL.decode_factor(graphs, 1024, 32) == pytest.approx(1.0)
    assert MODEL.decode_factor(replace(graphs, cuda_graph_max_bs=1024), 1024, 32) == pytest.approx(1.2)


def test_a_bigger_prefill_chunk_shortens_ttft_of_long_prompts_and_slows_decode() -> None:
    small, big = replace(REFERENCE, chunked_prefill_size=2048), replace(REFERENCE, chunked_prefill_size=16384)
    long_prompt = 32768
    assert MODEL.time_to_first_token_s(long_prompt, big) < MODEL.time_to_first_token_s(long_prompt, REFERENCE) \
        < MODEL.time_to_first_token_s(long_prompt, small)
    assert MODEL.aggregate_tok_s(256, knobs=big, prompt_tokens=long_prompt) \
        < MODEL.aggregate_tok_s(256, knobs=REFERENCE, prompt_tokens=long_prompt) \
        < MODEL.aggregate_tok_s(256, knobs=small, prompt_tokens=long_prompt)
    # prompts shorter than every chunk: one prefill step each, and the same decode whatever the chunk
    assert MODEL.time_to_first_token_s(32, small) == MODEL.time_to_first_token_s(32, big)
    assert MODEL.aggregate_tok_s(256, knobs=small, prompt_tokens=32) == pytest.approx(
        MODEL.aggregate_tok_s(256, knobs=big, prompt_tokens=32))


# --- memory at startup --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fraction", "graphs", "fits"), [
    (0.92, False, True), (0.92, True, True),   # the reference profile, with or without decode graphs
    (0.96, False, True), (0.96, True, False),  # the graphs' 1.17 GB no longer fit
    (0.97, False, False), (0.99, False, False), (0.99, True, False),
])
def test_mem_fraction_static_too_high_leaves_too_little_for_the_start(fraction: float, graphs: bool,
                                                                       fits: bool) -> None:
    need = MODEL.memory_need(replace(REFERENCE, mem_fraction_static=fraction, decode_cuda_graph=graphs), GPU_MIB)
    assert need.fits is fits
    assert need.phase == ("cuda_graph" if graphs else "warmup")


@pytest.mark.parametrize("graphs", [True, False])
def test_the_startup_out_of_memory_text_is_torchs_and_the_tool_diagnoses_it(graphs: bool) -> None:
    need = MODEL.memory_need(replace(REFERENCE, mem_fraction_static=0.99, decode_cuda_graph=graphs), GPU_MIB)
    oom = startup_texts.cuda_out_of_memory(need.needed_mib - MODEL.context_mib, GPU_MIB, need.free_mib)
    text = startup_texts.capture_failed(oom) if graphs else "torch.OutOfMemoryError: " + oom
    assert "CUDA out of memory. Tried to allocate " in text
    assert "GPU 0 has a total capacity of 95.59 GiB of which 0.96 GiB is free" in text
    assert ("set --mem-fraction-static to a smaller value" in text) is graphs  # SGLang's advice after a capture
    diagnosis = diagnose(["Scheduler hit an exception: Traceback (most recent call last):", *text.splitlines()])
    assert diagnosis.signature == "cuda_out_of_memory"
    assert "mem_fraction_static" in diagnosis.hint
