"""The simulated scheduler: what the server takes from its command line, the batch cap with its queue, and token
pacing by the throughput model."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sglang_sim.throughput import Knobs, ThroughputModel

DEFAULT_MAX_RUNNING_REQUESTS = 1024  # SGLang derives it from the KV pool; this is what the reference pool allows


@dataclass(frozen=True)
class Launch:
    """What the simulated server takes from its parsed command line."""

    model_path: str
    served_model_name: str
    host: str
    port: int
    tp_size: int
    api_key: str | None
    enable_metrics: bool
    max_running_requests: int
    stream_interval: int            # a streamed answer goes out every this many tokens (SGLang's --stream-interval)
    fusion_requested: bool
    knobs: Knobs
    server_args: dict[str, Any]

    @classmethod
    def from_args(cls, args: dict[str, Any], model: ThroughputModel | None = None) -> Launch:
        backend = args.get("flashinfer_allreduce_fusion_backend")
        return cls(
            model_path=args["model_path"],
            served_model_name=args.get("served_model_name") or args["model_path"],
            host=args.get("host") or "127.0.0.1",
            port=int(args.get("port") or 30000),
            tp_size=int(args.get("tp_size") or 1),
            api_key=args.get("api_key"),
            enable_metrics=bool(args.get("enable_metrics")),
            max_running_requests=int(args.get("max_running_requests") or DEFAULT_MAX_RUNNING_REQUESTS),
            stream_interval=max(1, int(args.get("stream_interval") or 1)),
            fusion_requested=bool(args.get("enable_flashinfer_allreduce_fusion")) or backend not in (None, "None"),
            knobs=Knobs.from_args(args, (model or ThroughputModel.default()).defaults),
            server_args={k: v for k, v in args.items() if k not in ("api_key", "admin_api_key")},
        )

    @property
    def mem_fraction_static(self) -> float:
        return self.knobs.mem_fraction_static


@dataclass
class Engine:
    """Admits at most --max-running-requests requests into the batch (the rest wait in arrival order), paces their
    tokens by the throughput model, and keeps the counters /metrics reports."""

    model: ThroughputModel
    launch: Launch
    fused_on_sm120: bool
    scale: float
    hang_generation: bool
    die_after: int | None
    on_fatal: Callable[[str], None]
    shutdown: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0   # in the batch
    waiting: int = 0   # queued for a slot in the batch
    running_prompt_tokens: int = 0
    finished: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    ttft_sum_s: float = 0.0
    last_output_at: float = 0.0  # monotonic time of the newest token of any request (SGLang's last_receive_tstamp)
    line: deque[tuple[threading.Event, int]] = field(default_factory=deque)  # the waiting, in arrival order

    def _rate(self, per_request: bool) -> float:
        """Tokens/s of the batch (or of each request in it); called with the lock held or for a snapshot."""
        mean_prompt = self.running_prompt_tokens / self.running if self.running else 0.0
        rate = (self.model.per_request_tok_s if per_request else self.model.aggregate_tok_s)(
            self.running, self.fused_on_sm120, self.launch.knobs, mean_prompt)
        return rate * self.scale

    def per_request_tok_s(self) -> float:
        return self._rate(per_request=True)

    def aggregate_tok_s(self) -> float:
        return self._rate(per_request=False)

    def _admit(self, prompt_tokens: int) -> None:
        """Take a slot in the batch, or wait in line, first come first served, until a leaving request hands over its
        slot (one wake-up per hand-over, however long the line)."""
        with self.lock:
            if self.running < self.launch.max_running_requests and not self.line:
                self.running += 1
                self.running_prompt_tokens += prompt_tokens
                return
            handed_over = threading.Event()
            self.line.append((handed_over, prompt_tokens))
            self.waiting += 1
        handed_over.wait()

    def _leave(self, prompt_tokens: int) -> None:
        with self.lock:
            self.running -= 1
            self.running_prompt_tokens -= prompt_tokens
            if self.line and self.running < self.launch.max_running_requests:
                handed_over, next_prompt_tokens = self.line.popleft()
                self.waiting -= 1
                self.running += 1
                self.running_prompt_tokens += next_prompt_tokens
                handed_over.set()

    def generate(self, prompt_tokens: int, max_tokens: int, tick_s: float, internal: bool = False,
                 interval: int = 1, log_metrics: bool = True) -> Iterator[int]:
        """Yield the number of new tokens each time some are due: the first at once, then at least `interval` at a
        time (the last may be fewer), as SGLang's scheduler streams with --stream-interval; the sum is max_tokens.
        `log_metrics=False` (SGLang's health check request) leaves the /metrics counters as they are."""
        arrived = time.monotonic()
        self._admit(prompt_tokens)
        try:
            if self.hang_generation and not internal:
                self.shutdown.wait()
                return
            time.sleep(self.model.time_to_first_token_s(prompt_tokens, self.launch.knobs) / self.scale)
            last = time.monotonic()
            if log_metrics:
                with self.lock:
                    self.prompt_tokens_total += prompt_tokens
                    self.ttft_sum_s += last - arrived  # the wait for a slot included
            produced, due = 0, 1.0
            while produced < max_tokens:
                left = max_tokens - produced
                step = min(left, int(due + 1e-9))  # 0.075 s x 40 tok/s is 2.999... in floats
                if step and (produced == 0 or step >= min(interval, left)):
                    produced += step
                    due -= step
                    with self.lock:
                        self.generation_tokens_total += step if log_metrics else 0
                        self.last_output_at = time.monotonic()
                    yield step
                if produced >= max_tokens:
                    break
                rate = self.per_request_tok_s()
                wanted = min(interval, max_tokens - produced) - due  # tokens still to come before the next write
                # never past the moment the last token is due: a 4-token answer takes ttft + 3 tokens' time, not a tick
                time.sleep(min(max(tick_s, wanted / rate), max((max_tokens - produced - due) / rate, 0.001)))
                # tokens for the time that passed, not the time asked for: a wake-up a busy CPU delays is made
                # up in the next chunk, so the pace is the model's whatever the machine's load
                now = time.monotonic()
                due += rate * (now - last)
                last = now
        finally:
            self._leave(prompt_tokens)

    def complete(self) -> None:
        """A response went out in full; the die-after fault fires once the Nth one has."""
        with self.lock:
            self.finished += 1
            finished = self.finished
        if self.die_after is not None and finished >= self.die_after:
            self.on_fatal(f"after {finished} requests")
