"""The simulated SGLang server (sandbox/sim) run inside the test process on 127.0.0.1, on an ephemeral port, with a
flat pacing model: a client for its HTTP endpoints. No guest, no subprocess."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "sandbox" / "sim"))
from sglang_sim.engine import Engine, Launch
from sglang_sim.server import ServerState, SimHTTPServer, Status

MODEL = "sim-model"


@dataclass(frozen=True)
class FlatModel:
    """The first token after `ttft_s`, then `tok_s` tokens/s per request whatever the load."""

    ttft_s: float = 0.005
    tok_s: float = 4000.0

    def aggregate_tok_s(self, concurrency: int, *_: Any) -> float:
        return self.tok_s * concurrency

    def per_request_tok_s(self, *_: Any) -> float:
        return self.tok_s

    def time_to_first_token_s(self, *_: Any) -> float:
        return self.ttft_s


class SimClient:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: dict[str, Any]) -> bytes:
        request = urllib.request.Request(self.base + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return bytes(answer.read())

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=60) as answer:
            return bytes(answer.read()).decode()


@contextmanager
def running_sim(args: dict[str, Any], model: FlatModel = FlatModel(), scale: float = 1.0) -> Iterator[SimClient]:
    """The simulated server, up, with these parsed launch arguments (SGLang's names: enable_metrics, ...)."""
    launch = Launch.from_args({"model_path": "org/sim", "served_model_name": MODEL, **args})
    engine = Engine(model=model, launch=launch, fused_on_sm120=False, scale=scale,  # type: ignore[arg-type]
                    hang_generation=False, die_after=None, on_fatal=lambda message: None)
    state = ServerState(launch, engine, "0.5.23", True, "GlmMoeDsaForCausalLM", 8192, 100_000)
    state.status = Status.UP
    server = SimHTTPServer(("127.0.0.1", 0), state)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimClient(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
