"""Live load in `status` (issue 42): running and queued requests, KV cache usage and the generation rate, read from
the current release's /metrics on its host (deploy_lib/metrics/live.py, host_scripts/metrics_read.py).

The status tests answer the host's reads with a FakeRemote; the host script itself runs here, as the host runs it
(`python3 -I -S -` with the step's stdin), against the simulated server on 127.0.0.1."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.current_release import host_with_current
from helpers.fake_remote import FakeRemote
from helpers.sim_http import FlatModel, running_sim
from rich.console import Console

from deploy_cli import present, reports
from deploy_lib.commands.status import StatusReport, read_status
from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.health.probe import ProbeTarget
from deploy_lib.metrics import parse_scrape
from deploy_lib.metrics.live import LiveLoad, metrics_step, parse_metrics_result
from deploy_lib.remote import StepResult

REPO = Path(__file__).resolve().parent.parent
TARGET = resolve_target(Project(REPO).inventory(None), None)
TWO_RANKS = "\n".join([
    "# TYPE sglang:num_running_reqs gauge",
    'sglang:num_running_reqs{model_name="glm-5",dp_rank="0"} 30',
    'sglang:num_running_reqs{model_name="glm-5",dp_rank="1"} 34',
    "# TYPE sglang:num_queue_reqs gauge",
    'sglang:num_queue_reqs{model_name="glm-5",dp_rank="0"} 2',
    'sglang:num_queue_reqs{model_name="glm-5",dp_rank="1"} 0',
    "# TYPE sglang:token_usage gauge",
    'sglang:token_usage{model_name="glm-5",dp_rank="0"} 0.41',
    'sglang:token_usage{model_name="glm-5",dp_rank="1"} 0.57',
    "# TYPE sglang:gen_throughput gauge",
    'sglang:gen_throughput{model_name="glm-5",dp_rank="0"} 410.5',
    'sglang:gen_throughput{model_name="glm-5",dp_rank="1"} 430.0', ""])


def host(metrics: bool) -> FakeRemote:
    """r1 current and active; its recorded profile has features.metrics as given."""
    return (host_with_current("active", {"features": {"metrics": metrics}})
            .reply(lambda step: step.name.startswith("readiness probe"),
                   stdout='{"port_open": true, "health_status": 200}\n'))


def shown(report: StatusReport, monkeypatch: pytest.MonkeyPatch) -> str:
    out = io.StringIO()
    monkeypatch.setattr(present, "console", Console(file=out, width=200))
    reports.print_status(report)
    return out.getvalue()


def test_status_shows_the_live_load_summed_over_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    remote = host(metrics=True).reply("read /metrics", stdout=TWO_RANKS)
    report = read_status(TARGET, "sglang", remote)
    assert report.live_load == LiveLoad(running=64, queued=2, token_usage=0.57, gen_throughput=840.5)
    assert "live load: 64 running, 2 queued, KV cache 57% used, generating 840 tok/s" in shown(report, monkeypatch)
    [read] = [step for step in remote.ran if step.name == "read /metrics"]
    assert b'"http://127.0.0.1:8000/metrics"' in (read.stdin or b"")  # the server's own host, on loopback


def test_status_says_why_there_is_no_live_load(monkeypatch: pytest.MonkeyPatch) -> None:
    without = host(metrics=False)
    off = read_status(TARGET, "sglang", without)
    assert off.live_load is None and "features.metrics off" in str(off.live_load_problem)
    assert "read /metrics" not in without.ran_names() and any(n.startswith("readiness") for n in without.ran_names())
    assert "live load: not served: the release has features.metrics off" in shown(off, monkeypatch)
    not_served = read_status(TARGET, "sglang", host(metrics=True).reply("read /metrics", exit_code=3,
                                                                        stderr="HTTP 404\n"))
    assert not_served.live_load_problem == ("/metrics not served (HTTP 404): the release was started without "
                                            "--enable-metrics")
    down = read_status(TARGET, "sglang", host(metrics=True).reply("read /metrics", exit_code=4,
                                                                  stderr="<urlopen error [Errno 111] refused>\n"))
    assert down.live_load_problem == "/metrics not read (<urlopen error [Errno 111] refused>)"


def run_on_host(port: int) -> StepResult:
    """The step as the host runs it: its argv (the python named: this one) with its stdin, against 127.0.0.1."""
    step = metrics_step(ProbeTarget(unit=None, port=port, host="127.0.0.1", python=sys.executable), timeout_s=10)
    done = subprocess.run(step.argv, input=step.stdin, capture_output=True, timeout=60, check=False)
    return StepResult(step, done.returncode, done.stdout.decode(), done.stderr.decode(), 0.0)


def test_the_host_script_reads_a_servers_metrics_and_tells_a_404_from_nothing_listening() -> None:
    with running_sim({"enable_metrics": True}, FlatModel()) as sim:
        answered = run_on_host(int(sim.base.rsplit(":", 1)[1]))
    scrape = parse_metrics_result(answered, at_s=0.0)
    assert answered.exit_code == 0 and not isinstance(scrape, str)
    assert LiveLoad.of(scrape) == LiveLoad.of(parse_scrape(answered.stdout, 0.0))
    assert LiveLoad.of(scrape).running == 0 and LiveLoad.of(scrape).queued == 0
    with running_sim({"enable_metrics": False}, FlatModel()) as sim:
        refused = run_on_host(int(sim.base.rsplit(":", 1)[1]))
    assert (refused.exit_code, refused.stderr.strip()) == (3, "HTTP 404")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: a connection is refused
        nothing = run_on_host(port)
    assert nothing.exit_code == 4 and isinstance(parse_metrics_result(nothing, 0.0), str)
