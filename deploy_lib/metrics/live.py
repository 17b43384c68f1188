"""The server's load now, read from its /metrics on its host: the step that reads it (deploy_lib/host_scripts/
metrics_read.py, run by the host's python3 against the server's own address) and what `status` shows of it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from deploy_lib.health import http_url
from deploy_lib.health.probe import ProbeTarget
from deploy_lib.metrics.exposition import ExpositionError, Scrape, parse_scrape
from deploy_lib.metrics.names import Metric
from deploy_lib.remote import Step, StepResult

METRICS_READ_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("metrics_read.py").read_text()
ANSWERED, NOT_SERVED, UNREACHABLE = 0, 3, 4  # metrics_read.py's exit codes


def metrics_step(target: ProbeTarget, timeout_s: float = 5.0) -> Step:
    """One read of the server's /metrics (no API key: SGLang serves it without one, srt/utils/auth.py)."""
    url = http_url(target.probe_host, target.port) + "/metrics"
    stdin = f"{METRICS_READ_SOURCE}\nsys.exit(read_metrics({json.dumps(url)}, {timeout_s!r}))\n".encode()
    return Step(name="read /metrics", argv=(target.python, "-I", "-S", "-"), stdin=stdin,
                ok=frozenset({ANSWERED, NOT_SERVED, UNREACHABLE}), timeout_s=timeout_s + 15, repeatable=True)


def parse_metrics_result(result: StepResult, at_s: float) -> Scrape | str:
    """The scrape, or why there is none (said as status shows it)."""
    why = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.exit_code}"
    if result.exit_code == NOT_SERVED:
        return f"/metrics not served ({why}): the release was started without --enable-metrics"
    if result.exit_code != ANSWERED:
        return f"/metrics not read ({why})"
    try:
        return parse_scrape(result.stdout, at_s)
    except ExpositionError as error:
        return f"/metrics not read ({error})"


@dataclass(frozen=True)
class LiveLoad:
    """The scheduler's gauges at one reading, summed over its ranks (token usage: the fullest rank's)."""

    running: float | None
    queued: float | None
    token_usage: float | None        # 0-1
    gen_throughput: float | None     # tokens/s over the scheduler's last logging interval

    @classmethod
    def of(cls, scrape: Scrape) -> LiveLoad:
        return cls(running=scrape.total(Metric.RUNNING), queued=scrape.total(Metric.QUEUED),
                   token_usage=scrape.highest(Metric.TOKEN_USAGE), gen_throughput=scrape.total(Metric.GEN_THROUGHPUT))

    def line(self) -> str:
        def count(value: float | None) -> str:
            return "?" if value is None else f"{value:.0f}"

        usage = "?" if self.token_usage is None else f"{self.token_usage:.0%}"
        rate = "?" if self.gen_throughput is None else f"{self.gen_throughput:.0f} tok/s"
        return (f"live load: {count(self.running)} running, {count(self.queued)} queued, KV cache {usage} used, "
                f"generating {rate}")
