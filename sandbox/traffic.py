"""A client sending requests through a router (or any server) on several threads, one after another on each, while
something else happens: the latency of each answered request and why each other one failed. Used by the router's
sandbox test, `make bench` and `make demo-fleet`."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

BODY = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 8}}).encode()


@dataclass
class Traffic:
    """What a window of requests saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, of each answered request (HTTP 200)
    failures: list[str] = field(default_factory=list)     # each other request's status or error

    @property
    def p99_s(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


@dataclass
class Client:
    """POST /generate to `url` on `threads` threads while an action runs."""

    url: str
    threads: int = 4
    timeout_s: float = 60

    def one(self, traffic: Traffic, lock: threading.Lock) -> None:
        request = urllib.request.Request(self.url + "/generate", data=BODY,
                                         headers={"Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                answer.read()
                failure = None if answer.status == 200 else f"HTTP {answer.status}"
        except urllib.error.HTTPError as error:
            failure = f"HTTP {error.code}: {error.read()[:200]!r}"
        except (urllib.error.URLError, OSError) as error:
            failure = str(error)
        with lock:
            if failure:
                traffic.failures.append(failure)
            else:
                traffic.latencies.append(time.monotonic() - started)

    def during(self, action: Callable[[], object]) -> Traffic:
        """The requests sent while `action()` ran (each thread finishes the request it has in flight)."""
        traffic, lock, stop = Traffic(), threading.Lock(), threading.Event()

        def loop() -> None:
            while not stop.is_set():
                self.one(traffic, lock)
        workers = [threading.Thread(target=loop, daemon=True) for _ in range(self.threads)]
        for worker in workers:
            worker.start()
        try:
            action()
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=self.timeout_s + 10)
        return traffic
