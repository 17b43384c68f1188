"""Clients sending requests to a router (or any server) while something else happens: the latency of each answered
request and why each other one failed. `Client` sends on several threads, one request after another on each (used
by the router's sandbox test, `make bench` and `make demo-fleet`); `Paced` sends at a fixed rate whatever the server
answers (open loop, as users do: a slower server gets the same offered load, and more requests in flight), each
request's body chosen by its number (the watch's and the workload's sandbox tests)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

OWN_IDS = 100_000  # token ids of one request's own, at most
BODY = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 8}}).encode()


@dataclass(frozen=True)
class Shape:
    """Requests of one shape to /generate, as token ids: `prompt_tokens` each, of which the first `shared_tokens` are
    the same in every request of the shape (a prefix the server can cache) and the rest the request's own (request
    n's from `first_id` + OWN_IDS x (n + 1): no two requests share them, whatever their shapes); `output_tokens`
    generated."""

    prompt_tokens: int
    output_tokens: int
    shared_tokens: int = 0
    stream: bool = False
    first_id: int = 1_000_000

    def body(self, number: int) -> bytes:
        start = self.first_id + OWN_IDS * (number + 1)
        return json.dumps({"input_ids": [*range(self.first_id, self.first_id + self.shared_tokens),
                                         *range(start, start + self.prompt_tokens - self.shared_tokens)],
                           "stream": self.stream,
                           "sampling_params": {"max_new_tokens": self.output_tokens, "ignore_eos": True}}).encode()


@dataclass
class Traffic:
    """What a window of requests saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, of each answered request (HTTP 200)
    failures: list[str] = field(default_factory=list)     # each other request's status or error

    @property
    def p99_s(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def post(url: str, body: bytes, timeout_s: float, traffic: Traffic, lock: threading.Lock) -> None:
    """POST `body` to `url`/generate; its latency or its failure added to `traffic`."""
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
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


@dataclass
class Client:
    """POST /generate to `url` on `threads` threads while an action runs."""

    url: str
    threads: int = 4
    timeout_s: float = 60

    def during(self, action: Callable[[], object]) -> Traffic:
        """The requests sent while `action()` ran (each thread finishes the request it has in flight)."""
        traffic, lock, stop = Traffic(), threading.Lock(), threading.Event()

        def loop() -> None:
            while not stop.is_set():
                post(self.url, BODY, self.timeout_s, traffic, lock)
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


@dataclass
class Paced:
    """POST /generate to `url` at `rate_per_s` requests a second, each on its own thread; request n's body is
    `body(n)` (n from 0)."""

    url: str
    rate_per_s: float
    body: Callable[[int], bytes]
    timeout_s: float = 60

    def _send(self, more: Callable[[int], bool], traffic: Traffic, lock: threading.Lock,
              stop: threading.Event) -> list[threading.Thread]:
        """Request after request at the rate while `more(number)`; their threads, still running."""
        senders: list[threading.Thread] = []
        start, number = time.monotonic(), 0
        while more(number):
            sender = threading.Thread(target=post, args=(self.url, self.body(number), self.timeout_s, traffic, lock),
                                      daemon=True)
            sender.start()
            senders.append(sender)
            number += 1
            stop.wait(max(0.0, start + number / self.rate_per_s - time.monotonic()))
        return senders

    def _answered(self, senders: list[threading.Thread]) -> None:
        for sender in senders:
            sender.join(timeout=self.timeout_s + 10)

    def send(self, count: int) -> Traffic:
        """`count` requests at the rate, all answered or failed."""
        traffic = Traffic()
        self._answered(self._send(lambda number: number < count, traffic, threading.Lock(), threading.Event()))
        return traffic

    def during(self, action: Callable[[], object]) -> Traffic:
        """The requests sent while `action()` ran, all answered or failed."""
        traffic, lock, stop = Traffic(), threading.Lock(), threading.Event()
        senders: list[threading.Thread] = []
        pacer = threading.Thread(target=lambda: senders.extend(self._send(lambda _: not stop.is_set(), traffic,
                                                                          lock, stop)), daemon=True)
        pacer.start()
        try:
            action()
        finally:
            stop.set()
            pacer.join()
            self._answered(senders)
        return traffic
