"""Records the /metrics answers tests/test_metrics_watch.py judges: the simulated server (in this process, on
127.0.0.1) serves traffic of one shape, and its /metrics is read before and after each window. Written to
tests/data/metrics/watch/<window>.{start,end}.prom; the window lengths the test uses are in WINDOWS there.

    .venv/bin/python -m tests.helpers.record_watch_metrics

Every window's server first serves WARM_UP requests (so the window's figures are deltas, not totals), then its
window's requests, CONCURRENCY at a time: prompts of 600 tokens (a shared prefix of 256, 344 of their own), 8
output tokens, every other one streamed. The releases: `old` and `same` at 150 ms to the first token and 100
tokens/s per request; `slow` is the same server ten times slower (the simulator's throughput scale 0.1).
"""

from __future__ import annotations

import itertools
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers.sim_http import FlatModel, SimClient, running_sim

OUT = Path(__file__).resolve().parent.parent / "data" / "metrics" / "watch"
WARM_UP = 10
CONCURRENCY = 16
MODEL = FlatModel(ttft_s=0.15, tok_s=100.0)
SHARED = list(range(1000, 1256))
# window -> (requests in it, throughput scale of its server)
RECORDINGS = {"old": (60, 1.0), "same": (60, 1.0), "slow": (60, 0.1), "quiet": (5, 1.0), "busy": (240, 1.0)}
numbers = itertools.count()


def send(client: SimClient, count: int) -> None:
    def one(number: int) -> None:
        client.post("/generate", {"input_ids": SHARED + [number * 1000 + i for i in range(344)],
                                  "stream": number % 2 == 0, "sampling_params": {"max_new_tokens": 8}})

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, [next(numbers) for _ in range(count)]))


def record() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for window, (requests, scale) in RECORDINGS.items():
        with running_sim({"enable_metrics": True}, MODEL, scale) as client:
            send(client, WARM_UP)
            (OUT / f"{window}.start.prom").write_text(client.metrics_text())
            send(client, requests)
            (OUT / f"{window}.end.prom").write_text(client.metrics_text())


if __name__ == "__main__":
    record()
