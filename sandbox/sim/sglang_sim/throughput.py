"""Throughput model: aggregate output tokens/s of the running batch, time to first token, and the memory a start
needs beside the static pool, as functions of the launch knobs (parameters and their rationale: throughput.toml)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class Knobs:
    """The launch settings the model answers to, under SGLang's server_args names."""

    moe_runner_backend: str
    flashinfer_autotune: bool       # not --disable-flashinfer-autotune
    decode_cuda_graph: bool         # not --cuda-graph-backend-decode disabled / --disable-cuda-graph
    cuda_graph_max_bs: int          # batches above it decode without the graph
    chunked_prefill_size: int       # -1: prefill unchunked (a whole prompt per step)
    max_prefill_tokens: int
    mem_fraction_static: float

    @classmethod
    def from_args(cls, args: dict[str, Any], defaults: Knobs) -> Knobs:
        """Knobs from the parsed command line; unset ones take SGLang's defaults (`defaults`)."""
        # the per-phase flag, its convenience switch, the deprecated one (--cuda-graph-config JSON is not read)
        decode_graph_off = (bool(args.get("disable_cuda_graph")) or bool(args.get("disable_decode_cuda_graph"))
                            or args.get("cuda_graph_backend_decode") == "disabled")
        chunk = args.get("chunked_prefill_size")
        return cls(
            moe_runner_backend=str(args.get("moe_runner_backend") or defaults.moe_runner_backend),
            flashinfer_autotune=not args.get("disable_flashinfer_autotune"),
            decode_cuda_graph=not decode_graph_off,
            cuda_graph_max_bs=int(args.get("cuda_graph_max_bs_decode") or args.get("cuda_graph_max_bs")
                                  or defaults.cuda_graph_max_bs),
            chunked_prefill_size=int(chunk) if chunk is not None else defaults.chunked_prefill_size,
            max_prefill_tokens=int(args.get("max_prefill_tokens") or defaults.max_prefill_tokens),
            mem_fraction_static=float(args.get("mem_fraction_static") or defaults.mem_fraction_static),
        )

    def prefill_step_tokens(self, prompt_tokens: float) -> float:
        """Prompt tokens one prefill step takes: a chunk, or the whole prompt when chunking is off."""
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else max(prompt_tokens, 1.0)


@dataclass(frozen=True)
class MemoryNeed:
    """GPU memory a start needs outside the static pool, and what --mem-fraction-static leaves for it."""

    needed_mib: float
    free_mib: float
    phase: str  # where the allocation that does not fit happens: "cuda_graph" or "warmup"

    @property
    def fits(self) -> bool:
        return self.needed_mib <= self.free_mib


@dataclass(frozen=True)
class ThroughputModel:
    peak_tok_s: float
    half_concurrency: float
    fusion_sm120_factor: float
    reference: Knobs      # the setup the anchors were measured on
    defaults: Knobs       # SGLang's defaults for what a command line leaves unset
    moe_runner_factors: dict[str, float]
    autotuned_backends: frozenset[str]
    untuned_factor: float
    cuda_graph_decode_factor: float
    decode_interference_tokens: float
    prefill_base_s: float
    prefill_tok_s: float
    prefill_step_s: float
    context_mib: float
    activation_mib_per_token: float
    cuda_graph_mib: float
    loaded_idle_w: float
    full_load_w: float
    full_load_concurrency: int

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ThroughputModel:
        (c1, t1), (c2, t2) = ((a["concurrency"], a["output_tok_s"]) for a in params["reference"]["anchors"])
        # T(c) = peak*c/(c+half) through both anchors: t1*(c1+half)/c1 == t2*(c2+half)/c2
        half = (t2 - t1) / (t1 / c1 - t2 / c2)
        peak = t1 * (c1 + half) / c1
        fusion = params["fusion_sm120"]
        reference_there = peak * fusion["concurrency"] / (fusion["concurrency"] + half)
        defaults = Knobs(**params["defaults"])
        moe, graph, memory = params["moe_runner"], params["cuda_graph"], params["memory"]
        return cls(
            peak_tok_s=peak,
            half_concurrency=half,
            fusion_sm120_factor=fusion["output_tok_s"] / reference_there,
            reference=replace(defaults, **params["reference"]["setup"]),
            defaults=defaults,
            moe_runner_factors=dict(moe["decode_factor"]),
            autotuned_backends=frozenset(moe["autotuned"]),
            untuned_factor=moe["untuned_factor"],
            cuda_graph_decode_factor=graph["decode_factor"],
            decode_interference_tokens=params["chunked_prefill"]["decode_interference_tokens"],
            prefill_base_s=params["prefill"]["base_latency_s"],
            prefill_tok_s=params["prefill"]["tok_s"],
            prefill_step_s=params["chunked_prefill"]["step_s"],
            context_mib=memory["context_gib"] * MIB_PER_GIB,
            activation_mib_per_token=memory["activation_mib_per_token"],
            cuda_graph_mib=graph["memory_gib"] * MIB_PER_GIB,
            loaded_idle_w=params["power"]["loaded_idle_w"],
            full_load_w=params["power"]["full_load_w"],
            full_load_concurrency=params["power"]["full_load_concurrency"],
        )

    @classmethod
    def default(cls) -> ThroughputModel:
        text = resources.files("sglang_sim").joinpath("throughput.toml").read_text()
        return cls.from_params(tomllib.loads(text))

    # --- decode ---------------------------------------------------------------
    def _kernel_factor(self, knobs: Knobs, batch: int, prompt_tokens: float) -> float:
        """Decode speed of these knobs, in units the reference setup's factor divides out."""
        moe = self.moe_runner_factors.get(knobs.moe_runner_backend, self.moe_runner_factors["other"])
        tuned = knobs.flashinfer_autotune or knobs.moe_runner_backend not in self.autotuned_backends
        graph = knobs.decode_cuda_graph and batch <= knobs.cuda_graph_max_bs
        # each decode step carries the prefill chunk scheduled beside it: up to a chunk of the prompts in flight
        interference = min(knobs.prefill_step_tokens(prompt_tokens), prompt_tokens) / self.decode_interference_tokens
        return (moe * (1.0 if tuned else self.untuned_factor) * (self.cuda_graph_decode_factor if graph else 1.0)
                / (1.0 + interference))

    def decode_factor(self, knobs: Knobs | None, batch: int, prompt_tokens: float = 0.0) -> float:
        """These knobs' decode rate over the reference setup's, for the same batch and prompts."""
        if knobs is None:
            return 1.0
        return self._kernel_factor(knobs, batch, prompt_tokens) / self._kernel_factor(self.reference, batch,
                                                                                        prompt_tokens)

    def aggregate_tok_s(self, concurrency: int, fused_on_sm120: bool = False, knobs: Knobs | None = None,
                        prompt_tokens: float = 0.0) -> float:
        """Output tokens/s of a running batch of `concurrency` requests whose prompts average `prompt_tokens`."""
        if concurrency <= 0:
            return 0.0
        total = self.peak_tok_s * concurrency / (concurrency + self.half_concurrency)
        total *= self.decode_factor(knobs, concurrency, prompt_tokens)
        return total * self.fusion_sm120_factor if fused_on_sm120 else total

    def per_request_tok_s(self, concurrency: int, fused_on_sm120: bool = False, knobs: Knobs | None = None,
                          prompt_tokens: float = 0.0) -> float:
        batch = max(concurrency, 1)
        return self.aggregate_tok_s(batch, fused_on_sm120, knobs, prompt_tokens) / batch

    # --- prefill and memory ---------------------------------------------------
    def time_to_first_token_s(self, prompt_tokens: int, knobs: Knobs | None = None) -> float:
        """Prefill of one admitted request: scheduling, one step per chunk, the prompt at the prefill rate (the wait
        for a batch slot comes on top, in the engine)."""
        steps = math.ceil(max(prompt_tokens, 1) / (knobs or self.reference).prefill_step_tokens(prompt_tokens))
        return self.prefill_base_s + steps * self.prefill_step_s + prompt_tokens / self.prefill_tok_s

    def memory_need(self, knobs: Knobs, total_mib: float) -> MemoryNeed:
        """What a start needs beside the static pool: CUDA context and NCCL buffers, the activations of one
        prefill step (chunked prefill size, or max prefill tokens unchunked), the decode CUDA graphs."""
        step_tokens = knobs.chunked_prefill_size if knobs.chunked_prefill_size > 0 else knobs.max_prefill_tokens
        needed = self.context_mib + step_tokens * self.activation_mib_per_token
        phase = "warmup"
        if knobs.decode_cuda_graph:
            needed += self.cuda_graph_mib
            phase = "cuda_graph"
        return MemoryNeed(needed, total_mib * (1.0 - knobs.mem_fraction_static), phase)

    # --- power ----------------------------------------------------------------
    def load(self, concurrency: int, fused_on_sm120: bool = False, knobs: Knobs | None = None) -> float:
        """GPU load in [0, 1]: the throughput produced relative to full load on the reference profile (a fused
        release on SM120 waits on its allreduce: fewer tokens, less power)."""
        return min(1.0, self.aggregate_tok_s(concurrency, fused_on_sm120, knobs)
                   / self.aggregate_tok_s(self.full_load_concurrency))

    def power_w(self, concurrency: int, fused_on_sm120: bool = False, knobs: Knobs | None = None) -> float:
        load = self.load(concurrency, fused_on_sm120, knobs)
        return self.loaded_idle_w + (self.full_load_w - self.loaded_idle_w) * load
