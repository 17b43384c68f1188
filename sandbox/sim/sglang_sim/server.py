"""HTTP side of the simulated server: SGLang's endpoints, status codes and auth (pacing: engine.py)."""

from __future__ import annotations

import enum
import json
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang_sim.engine import Engine, Launch
from sglang_sim.environ import env_bool
from sglang_sim.served import ServedMetrics

WORDS = ("The simulated model answers with plain words so that token counts are easy to check and the "
         "stream is readable in a terminal while the sandbox runs").split()
STREAM_TICK_S = 0.05   # a streamed response writes at most this often
BATCH_TICK_S = 0.25    # a non-streamed response re-reads the concurrency this often
HEALTH_GENERATION = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"
HEALTH_CHECK_LOOK_S = 1.0  # SGLang's health_generate looks for an output once a second (`await asyncio.sleep(1)`)


class Status(enum.Enum):
    STARTING = "Starting"  # bound, warmup pending: /health 503
    UP = "Up"
    DRAINING = "Draining"  # SIGTERM: 503, in-flight requests finish


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def log(message: str, rank: str = "") -> None:
    """One SGLang-style log line on stdout (journald keeps it)."""
    print(f"[{timestamp()}{' ' + rank if rank else ''}] {message}", flush=True)


def prompt_pieces(text: str) -> list[str]:
    """A text's tokens as the simulator counts them: pieces of 4 characters (ceil(len / 4) of them), at least one."""
    return [text[i:i + 4] for i in range(0, len(text), 4)] or [""]


def token_text(start: int, count: int) -> str:
    return "".join(" " + WORDS[(start + i) % len(WORDS)] for i in range(count))


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # as uvicorn
    request_queue_size = 2048   # uvicorn's listen backlog; socketserver's 5 drops SYNs of a benchmark's burst

    def __init__(self, address: tuple[str, int], state: ServerState) -> None:
        self.state = state
        super().__init__(address, Handler)


@dataclass
class ServerState:
    launch: Launch
    engine: Engine
    version: str
    has_ready_endpoint: bool
    architecture: str
    context_length: int
    max_total_num_tokens: int
    startup_time: float = field(default_factory=time.time)
    status: Status = Status.STARTING
    # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION as read at start (sglang srt/environ.py EnvBool, default on)
    health_generates: bool = field(default_factory=lambda: env_bool(os.environ, HEALTH_GENERATION, True))
    served: ServedMetrics = field(init=False)  # what /metrics reports of the requests served

    def __post_init__(self) -> None:
        self.served = ServedMetrics(self.launch.served_model_name, self.launch.server_args, self.max_total_num_tokens)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SimHTTPServer

    # --- plumbing ---------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # uvicorn access-log format
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = HTTPStatus(int(code)) if str(code).isdigit() else None
        phrase = f"{int(code)} {status.phrase}" if status else str(code)
        log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {phrase}')

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_event(self, payload: Any) -> None:
        data = ("data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n").encode()
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.send_event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    @property
    def state(self) -> ServerState:
        return self.server.state

    def authorized(self, path: str) -> bool:
        """As sglang/srt/utils/auth.py: with --api-key every path needs the bearer key except probes."""
        key = self.state.launch.api_key
        exempt = ("/health", "/metrics") + (("/ready",) if self.state.has_ready_endpoint else ())
        if key is None or path.startswith(exempt):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token, key)

    def route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorized(path):
            self.send_json(401, {"error": "Unauthorized"})
            return
        handler = ROUTES.get((method, path))
        if handler is None or (path == "/ready" and not self.state.has_ready_endpoint):
            self.send_json(404, {"detail": "Not Found"})
            return
        handler(self)

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    # --- probes and info --------------------------------------------------
    def health(self) -> None:
        if self.state.status is Status.UP:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_json(503, {"status": self.state.status.value})

    def health_generate(self) -> None:
        """As SGLang's `health_generate` (sglang/srt/entrypoints/http_server.py, 0.5.9 at 470, 0.5.23 at 721-797):
        503 while starting or draining; otherwise a 1-token generation goes to the scheduler, and the answer is 200 at
        the first look, once a second, that finds any output produced since the request came (so never within 1 s),
        or 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s: a hung scheduler). /health is this same function; with
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off (default on: environ.py, 0.5.9 at 462, 0.5.23 at 344) /health
        answers 200 at once once the server is up."""
        path = self.path.split("?", 1)[0]
        if self.state.status is not Status.UP or (path == "/health" and not self.state.health_generates):
            self.health()
            return
        engine = self.state.engine
        asked_at = time.monotonic()  # SGLang's time.time(); the engine keeps monotonic times
        # input_ids [0], max_new_tokens 1, log_metrics False: a request of one prompt token, not in /metrics
        threading.Thread(target=lambda: [*engine.generate(1, 1, BATCH_TICK_S, log_metrics=False)],
                         daemon=True).start()
        timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT") or 20)
        while time.monotonic() < asked_at + timeout_s:
            time.sleep(HEALTH_CHECK_LOOK_S)
            if engine.last_output_at > asked_at:
                self.health()
                return
        log(f"Health check failed. Server couldn't get a response from detokenizer for last {timeout_s:g} seconds.")
        self.send_json(503, {"status": "UnHealthy"})

    def models(self) -> None:
        name = self.state.launch.served_model_name
        self.send_json(200, {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(self.state.startup_time), "owned_by": "sglang",
            "root": name, "max_model_len": self.state.context_length}]})

    def model_info(self) -> None:
        launch = self.state.launch
        self.send_json(200, {
            "model_path": launch.model_path, "tokenizer_path": launch.model_path,
            "served_model_name": launch.served_model_name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": None, "architectures": [self.state.architecture]})

    def server_info(self) -> None:
        engine = self.state.engine
        self.send_json(200, {
            **self.state.launch.server_args, "version": self.state.version,
            "startup_time": self.state.startup_time, "status": self.state.status.value,
            "max_total_num_tokens": self.state.max_total_num_tokens,
            "internal_states": [{"last_gen_throughput": engine.aggregate_tok_s(),
                                 "num_running_reqs": engine.running}]})

    def loads(self) -> None:
        """As sglang/srt/entrypoints/v1_loads.py (0.5.23): one load snapshot per DP rank, its core scalars (the
        rollout's drain waits on num_running_reqs + num_waiting_reqs)."""
        engine, launch = self.state.engine, self.state.launch
        self.send_json(200, {
            "timestamp": datetime.now(UTC).isoformat(), "version": self.state.version, "accelerator": None,
            "num_accelerators": launch.tp_size, "loads": [{
                "dp_rank": 0, "num_running_reqs": engine.running, "num_waiting_reqs": engine.waiting,
                "max_total_num_tokens": self.state.max_total_num_tokens,
                "max_running_requests": launch.max_running_requests,
                "gen_throughput": round(engine.aggregate_tok_s(), 2)}]})

    def metrics(self) -> None:
        """As SGLang 0.5.23 with --enable-metrics (served.py): the scheduler's gauges now, the requests served."""
        if not self.state.launch.enable_metrics:
            self.send_json(404, {"detail": "Not Found"})
            return
        engine = self.state.engine
        with engine.lock:
            running, waiting, prompt_tokens = engine.running, engine.waiting, engine.running_prompt_tokens
        data = self.state.served.text({
            "num_running_reqs": running, "num_queue_reqs": waiting,
            # the KV pool's share the running requests' prompts hold
            "token_usage": round(min(1.0, prompt_tokens / self.state.max_total_num_tokens), 4),
            "gen_throughput": round(engine.aggregate_tok_s(), 2)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # --- generation -------------------------------------------------------
    def run_generation(self, prompt: Sequence[Any], max_tokens: int, stream: bool,
                       chunk: Callable[[str, int], Any], final: Callable[[str, int, int], Any],
                       usage_chunk: Callable[[int, int], Any] | None = None) -> None:
        """Generate for a prompt of these tokens (ids, or a text's pieces: prompt_pieces)."""
        engine = self.state.engine
        prompt_tokens = len(prompt)
        tick = STREAM_TICK_S if stream else BATCH_TICK_S
        observed = self.state.served.request(prompt, stream, time.monotonic())
        if stream:
            self.start_stream()
        produced = 0
        interval = self.state.launch.stream_interval if stream else 1
        for step in engine.generate(prompt_tokens, max_tokens, tick, interval=interval):
            observed.produced(produced + step, time.monotonic(), finished=produced + step >= max_tokens)
            if stream:
                self.send_event(chunk(token_text(produced, step), produced + step))
            produced += step
        if produced:
            observed.produced(produced, time.monotonic(), finished=True)
            observed.finished(time.monotonic())
        if stream:
            if usage_chunk is not None:
                self.send_event(usage_chunk(prompt_tokens, produced))
            self.end_stream()
        else:
            self.send_json(200, final(token_text(0, produced), prompt_tokens, produced))
        engine.complete()

    def generate(self) -> None:
        body = self.read_json()
        input_ids = body.get("input_ids")  # the benchmark sends ids with --tokenize-prompt
        prompt = input_ids if isinstance(input_ids, list) else prompt_pieces(body.get("text") or "")
        prompt_tokens = len(prompt)
        max_tokens = int((body.get("sampling_params") or {}).get("max_new_tokens") or 128)
        rid = uuid.uuid4().hex

        def meta(prompt_tokens: int, produced: int, done: bool) -> dict[str, Any]:
            finish = {"type": "length", "length": produced} if done else None
            return {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": produced,
                    "finish_reason": finish}

        self.run_generation(
            prompt, max_tokens, bool(body.get("stream")),
            chunk=lambda _new, total: {"text": token_text(0, total), "index": 0,
                                       "meta_info": meta(prompt_tokens, total, total >= max_tokens)},
            final=lambda out, p, n: {"text": out, "meta_info": meta(p, n, True)})

    def completions(self, chat: bool) -> None:
        body = self.read_json()
        if chat:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
            max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
        else:
            prompt = body.get("prompt") or ""
            prompt = " ".join(prompt) if isinstance(prompt, list) else str(prompt)
            max_tokens = int(body.get("max_tokens") or 16)
        rid = uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        model = self.state.launch.served_model_name

        def usage(prompt_tokens: int, produced: int) -> dict[str, int]:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": produced,
                    "total_tokens": prompt_tokens + produced}

        def choice(text: str, done: bool, delta: bool) -> dict[str, Any]:
            content: dict[str, Any]
            if chat:
                content = {"delta" if delta else "message": {"role": "assistant", "content": text}}
            else:
                content = {"text": text}
            return {"index": 0, **content, "logprobs": None, "finish_reason": "length" if done else None}

        def envelope(choices: list[dict[str, Any]], streamed: bool, **extra: Any) -> dict[str, Any]:
            return {"id": rid, "object": kind + (".chunk" if streamed and chat else ""), "created": created,
                    "model": model, "choices": choices, **extra}

        stream_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.run_generation(
            prompt_pieces(prompt), max_tokens, bool(body.get("stream")),
            chunk=lambda new, total: envelope([choice(new, total >= max_tokens, True)], True),
            final=lambda out, p, n: envelope([choice(out, True, False)], False, usage=usage(p, n)),
            usage_chunk=(lambda p, n: envelope([], True, usage=usage(p, n))) if stream_usage else None)


ROUTES: dict[tuple[str, str], Callable[[Handler], None]] = {
    ("GET", "/health"): Handler.health_generate,
    ("GET", "/health_generate"): Handler.health_generate,
    ("GET", "/ready"): Handler.health,
    ("GET", "/v1/models"): Handler.models,
    ("GET", "/model_info"): Handler.model_info,
    ("GET", "/get_model_info"): Handler.model_info,
    ("GET", "/server_info"): Handler.server_info,
    ("GET", "/get_server_info"): Handler.server_info,
    ("GET", "/metrics"): Handler.metrics,
    ("GET", "/v1/loads"): Handler.loads,
    ("POST", "/generate"): Handler.generate,
    ("POST", "/v1/completions"): lambda h: h.completions(chat=False),
    ("POST", "/v1/chat/completions"): lambda h: h.completions(chat=True),
}
