"""What the router's clients saw while a replica was out of it and back: the router's own request counters read just
before the replica's removal and just after it was listed healthy again, and the difference (pure).

sglang-router 0.3.2 serves Prometheus metrics on port 29000 of every address by default (`--prometheus-port`,
`--prometheus-host` in sglang_router/router_args.py, 0.3.2), which the tool's router unit leaves as they are. Read
from the real binary: `smg_router_requests_total` counts the requests it routes (generation and OpenAI routes, not
its admin routes), and `smg_http_responses_total{status_code, error_code}` every response it sent, a request it had no
worker for as `status_code="503", error_code="no_available_workers"`. A failed request is a 5xx response: the tool's
own calls (`/workers`, `/health`) answer 2xx or 4xx, and a client's 4xx is the client's own mistake, not the roll's.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy_lib.metrics.exposition import ExpositionError, text_samples

ROUTER_METRICS_PORT = 29000  # sglang_router/router_args.py 0.3.2: --prometheus-port's default
ROUTED = "smg_router_requests_total"
RESPONSES = "smg_http_responses_total"
COUNTED = (ROUTED, RESPONSES)  # the only families the router's host sends back (host_scripts/router.py)
# history: the figures of a "router" line (one per replica readmitted)
ROUTED_FIGURE, FAILED_FIGURE = "router.requests", "router.failed"


@dataclass(frozen=True)
class RouterCounters:
    """The router's counters at one reading, summed over their series."""

    routed: float
    failed: float  # 5xx responses


@dataclass(frozen=True)
class ClientsSaw:
    """The router's requests between two readings around one replica's switch, and how many of them failed."""

    requests: int
    failed: int

    def line(self, worker: str) -> str:
        said = "none failed" if not self.failed else f"{self.failed} failed (5xx)"
        return f"router: clients sent {self.requests} requests while {worker} was out and back; {said}"

    def figures(self) -> dict[str, float]:
        return {ROUTED_FIGURE: float(self.requests), FAILED_FIGURE: float(self.failed)}


def parse_counters(text: str) -> RouterCounters | str:
    """The counters in the router's /metrics text (a counter not there yet has counted nothing), or why the text
    cannot be read."""
    routed = failed = 0.0
    try:
        for sample in text_samples(text):
            if sample.name == ROUTED:
                routed += sample.value
            elif sample.name == RESPONSES and sample.labels.get("status_code", "").startswith("5"):
                failed += sample.value
    except ExpositionError as error:
        return f"its metrics are {error}"
    return RouterCounters(routed, failed)


def clients_saw(before: RouterCounters | str, after: RouterCounters | str) -> ClientsSaw | str:
    """The requests and failures between the two readings, or why they are not known."""
    if isinstance(before, str) or isinstance(after, str):
        return before if isinstance(before, str) else str(after)
    if after.routed < before.routed or after.failed < before.failed:
        return "its counters went down in between (the router restarted)"
    return ClientsSaw(round(after.routed - before.routed), round(after.failed - before.failed))
