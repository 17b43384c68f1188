"""The readiness ladder: verdicts per rung, the retry policy, a ladder against scripted snapshots, the probe itself."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import pytest
from helpers.fake_remote import FakeRemote
from helpers.health import SYSTEMCTL, closed_port, fake_tools, run_probe
from helpers.recording_progress import RecordingProgress
from tenacity import stop_after_attempt

from deploy_lib.errors import ReadinessFailed, StepFailed
from deploy_lib.facts.diagnose import (
    JOURNAL_SYNC,
    diagnose,
    journal_cursor_step,
    journal_step,
    parse_journal_cursor,
    unit_matches,
)
from deploy_lib.health import (
    POLL_S,
    WATCH_S,
    GenerationProbe,
    NotReady,
    ProbeRejected,
    ProbeTarget,
    Ready,
    Rung,
    Snapshot,
    UnitFailed,
    assess,
    parse_snapshot,
    predict_start,
    probe_step,
)
from deploy_lib.host.benchmark import BenchRun
from deploy_lib.host.readiness import grace_policy, ladder_policy, wait_ready
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.progress import NullProgress
from deploy_lib.remote import FabricRemote, Put, SSHTarget, Step
from deploy_lib.versions import health_path_for


def noop(_seconds: float) -> None:
    pass


def snapshot(active: str = "active", sub: str = "running", restarts: int = 0, pid: int = 4242,
             status: int = 0, code: int = 1, result: str = "success", port: bool = False,
             port_error: str | None = "refused", health: int | None = None, gen: dict[str, Any] | None = None,
             log: str | None = None, cursor: str = "s=1") -> Snapshot:
    """A probe snapshot as host_scripts/probe.py prints it."""
    return Snapshot.model_validate({
        "unit": {"ActiveState": active, "SubState": sub, "NRestarts": str(restarts), "ExecMainPID": str(pid),
                 "ExecMainStatus": str(status), "ExecMainCode": str(code), "Result": result,
                 "InvocationID": "abc"},
        "port_open": port, "port_error": None if port else port_error, "health_status": health,
        "generation": gen, "last_log": None if log is None else {"text": log, "cursor": cursor},
    })


LOADING = snapshot(log="[2026-11-29 11:02:03 TP0] Load weight begin. avail mem=93.21 GB", cursor="s=1")
WARMING = snapshot(port=True, health=503, log="[2026-11-29 11:04:40] INFO:     Uvicorn running on "
                   "http://127.0.0.1:30000 (Press CTRL+C to quit)", cursor="s=2")
GEN_SLOW = snapshot(port=True, health=200, gen={"status": None, "error": "timeout", "seconds": 60.0},
                    log="[2026-11-29 11:04:43] The server is fired up and ready to roll!", cursor="s=3")
READY = snapshot(port=True, health=200, gen={"status": 200, "text": " Paris", "seconds": 0.2},
                 log="[2026-11-29 11:04:43] The server is fired up and ready to roll!", cursor="s=3")
CRASHED = snapshot(active="failed", sub="failed", pid=0, status=1, result="exit-code",
                   log="sglang.service: Failed with result 'exit-code'.", cursor="s=9")


# --- assess: one verdict per rung and unit state -------------------------------------------------------------

@pytest.mark.parametrize(("snap", "expected"), [
    (snapshot(active="failed", sub="failed", status=1, result="exit-code"),
     "the unit failed (Result=exit-code, exit status 1)"),
    (snapshot(active="activating", sub="auto-restart", status=9, code=2), "killed by SIGKILL"),
    (snapshot(active="inactive", sub="dead", status=0), "the unit is inactive"),
    (snapshot(restarts=1), "restarted 1 time(s) since our start"),
])
def test_a_dead_failed_or_restarted_unit_stops_the_ladder(snap: Snapshot, expected: str) -> None:
    verdict = assess(snap, baseline_restarts=0, rung=Rung.GENERATE)
    assert isinstance(verdict, UnitFailed)
    assert expected in verdict.message
    assert verdict.rung == Rung.UNIT
    assert any(line.startswith("unit ") for line in verdict.evidence)


def test_a_new_main_pid_means_the_server_was_restarted() -> None:
    verdict = assess(snapshot(pid=5000), baseline_restarts=0, rung=Rung.GENERATE, baseline_pid=4242)
    assert isinstance(verdict, UnitFailed)
    assert "PID 4242 to 5000" in verdict.message


def test_a_unit_still_activating_is_retried() -> None:
    verdict = assess(snapshot(active="activating", sub="start"), 0, Rung.GENERATE)
    assert isinstance(verdict, NotReady) and verdict.rung == Rung.UNIT


def test_each_rung_is_ready_once_it_and_the_rungs_below_pass() -> None:
    assert isinstance(assess(LOADING, 0, Rung.UNIT), Ready)
    assert isinstance(assess(WARMING, 0, Rung.PORT), Ready)
    assert isinstance(assess(GEN_SLOW, 0, Rung.HEALTH), Ready)
    assert isinstance(assess(READY, 0, Rung.GENERATE), Ready)


@pytest.mark.parametrize(("snap", "rung", "reason"), [
    (LOADING, Rung.PORT, "port closed (refused): still loading"),
    (WARMING, Rung.HEALTH, "503: warming up"),
    (GEN_SLOW, Rung.GENERATE, "generation failed: timeout after 60.0 s"),
    (snapshot(port=True, health=200, gen={"status": 200, "text": "", "seconds": 0.1}), Rung.GENERATE,
     "without text"),
    (snapshot(port=True, health=200, gen={"status": 500, "body": "Internal Server Error"}), Rung.GENERATE,
     "status 500"),
])
def test_a_server_on_its_way_up_is_not_ready_at_the_rung_it_is_on(snap: Snapshot, rung: Rung, reason: str) -> None:
    verdict = assess(snap, 0, Rung.GENERATE)
    assert isinstance(verdict, NotReady)
    assert verdict.rung == rung
    assert reason in verdict.message


@pytest.mark.parametrize(("snap", "rung"), [
    (snapshot(port=True, health=404), Rung.HEALTH),
    (snapshot(port=True, health=200, gen={"status": 401, "body": '{"error": "Unauthorized"}'}), Rung.GENERATE),
])
def test_a_client_error_stops_the_ladder_since_waiting_cannot_fix_it(snap: Snapshot, rung: Rung) -> None:
    verdict = assess(snap, 0, Rung.GENERATE)
    assert isinstance(verdict, ProbeRejected) and verdict.rung == rung
    assert verdict.hint


def test_without_a_unit_to_watch_the_ladder_starts_at_the_port() -> None:
    bare = Snapshot(port_open=True, health_status=200)
    assert isinstance(assess(bare, 0, Rung.HEALTH), Ready)
    unknown = Snapshot(unit_error="systemctl show exited 1: Failed to connect to bus")
    verdict = assess(unknown, 0, Rung.HEALTH)
    assert isinstance(verdict, NotReady) and "Failed to connect to bus" in verdict.message


# --- the policy as a value ----------------------------------------------------------------------------------

def failing_with(error: Exception) -> Any:
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise error
    attempt.calls = calls  # type: ignore[attr-defined]
    return attempt


def test_the_policy_retries_not_ready_at_once_since_the_probe_waits_on_the_host() -> None:
    progress = RecordingProgress()
    policy = ladder_policy(1800, progress).copy(sleep=noop, stop=stop_after_attempt(7))
    attempt = failing_with(NotReady("port closed", Rung.PORT))
    with pytest.raises(NotReady):
        policy(attempt)
    assert len(attempt.calls) == 7
    waits = [sleep for _attempt, sleep in progress.of_kind("retry")]  # type: ignore[misc]
    assert waits == [0.0] * 6


@pytest.mark.parametrize("error", [UnitFailed("the unit failed", Rung.UNIT), ProbeRejected("401", Rung.GENERATE)])
def test_the_policy_stops_at_once_on_anything_but_not_ready(error: Exception) -> None:
    policy = ladder_policy(1800, NullProgress()).copy(sleep=noop, stop=stop_after_attempt(50))
    attempt = failing_with(error)
    with pytest.raises(type(error)):
        policy(attempt)
    assert len(attempt.calls) == 1


def test_the_policy_never_starts_an_attempt_past_its_deadline() -> None:
    attempt = failing_with(NotReady("loading", Rung.PORT))
    with pytest.raises(NotReady):
        ladder_policy(0, NullProgress()).copy(sleep=noop)(attempt)
    assert len(attempt.calls) == 1


# --- the ladder against a remote that answers scripted snapshots --------------------------------------------

def is_probe(step: Step | Put) -> bool:
    return isinstance(step, Step) and step.name.startswith("readiness probe")


def scripted(snapshots: Sequence[Snapshot]) -> FakeRemote:
    """A remote whose probe steps are answered by `snapshots`, one each, in order."""
    remote = FakeRemote()
    for snap in reversed(snapshots):  # the last rule added answers first
        remote.reply(is_probe, stdout=snap.model_dump_json(by_alias=True) + "\n", times=1)
    return remote


def probe_steps(remote: FakeRemote) -> list[Step]:
    return [step for batch in remote.batches for step in batch if isinstance(step, Step) and is_probe(step)]


def probe_configs(remote: FakeRemote) -> list[dict[str, Any]]:
    """The config each probe step carried: the argument of the call appended to the probe's source."""
    calls = [(step.stdin or b"").decode().rstrip("\n").rsplit("\n", 1)[-1] for step in probe_steps(remote)]
    return [json.loads(ast.literal_eval(call.removeprefix("run_probe_and_print(").removesuffix(")")))
            for call in calls]


TARGET = ProbeTarget(unit="sglang.service", port=30000, api_key="sk-test-6f1c")


def fast(n: int, progress: Any = None) -> Any:
    return ladder_policy(1800, progress or NullProgress()).copy(sleep=noop, stop=stop_after_attempt(n))


def test_the_ladder_climbs_from_loading_to_a_real_generation() -> None:
    remote = scripted([LOADING, WARMING, GEN_SLOW, READY])
    progress = RecordingProgress()
    report = wait_ready(remote, TARGET, deadline_s=1800, progress=progress, policy=fast(10, progress))
    assert report.rung == Rung.GENERATE and report.attempts == 4
    assert report.last_log_line == "[2026-11-29 11:04:43] The server is fired up and ready to roll!"
    assert progress.of_kind("phase") == ["readiness: port", "readiness: health", "readiness: generate"]
    assert [name for name, _s in progress.of_kind("done")] == [  # type: ignore[misc]
        "readiness: unit", "readiness: port", "readiness: health", "readiness: generate"]
    # Each new server line is shown once, not once per probe.
    assert len(progress.of_kind("log")) == 3
    # Each probe asks only for lines after the newest one already seen.
    configs = probe_configs(remote)
    assert [config["journal_after_cursor"] for config in configs] == [None, "s=1", "s=2", "s=3"]
    assert [config["health_path"] for config in configs] == ["/health"] * 4


def test_each_probe_waits_on_the_host_for_a_change_from_the_state_it_saw_last() -> None:
    loading, warming = LOADING.model_copy(update={"state": "loading"}), WARMING.model_copy(update={"state": "warming"})
    remote = scripted([loading, warming, READY])
    wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(10))
    configs = probe_configs(remote)
    assert [config["seen"] for config in configs] == [None, "loading", "warming"]
    assert [config["wait_s"] for config in configs] == [WATCH_S] * 3
    assert all(config["poll_s"] == POLL_S for config in configs)
    # the step's own timeout covers the wait
    assert all(step.timeout_s > WATCH_S + TARGET.http_timeout_s for step in probe_steps(remote))


def test_a_probe_never_waits_past_the_ladders_deadline() -> None:
    remote = scripted([LOADING, LOADING, LOADING])
    with pytest.raises(ReadinessFailed):  # each probe takes 2.5 s of the 3 s deadline
        wait_ready(remote, TARGET, deadline_s=3, progress=NullProgress(), policy=fast(3),
                   clock=lambda: 2.5 * len(probe_steps(remote)))
    assert [config["wait_s"] for config in probe_configs(remote)] == [WATCH_S, 0.5, 0.0]


def test_a_unit_that_fails_midway_stops_the_ladder_at_once_with_evidence() -> None:
    remote = scripted([LOADING, CRASHED, READY])
    progress = RecordingProgress()
    with pytest.raises(UnitFailed) as failed:
        wait_ready(remote, TARGET, deadline_s=1800, progress=progress, policy=fast(10, progress))
    assert len(probe_steps(remote)) == 2
    assert progress.of_kind("phase") == ["readiness: port"]
    assert progress.of_kind("log")[-1] == "sglang.service: Failed with result 'exit-code'."
    assert failed.value.rung == Rung.UNIT
    assert "last log line: sglang.service: Failed with result 'exit-code'." in failed.value.evidence
    assert isinstance(failed.value, ReadinessFailed) and failed.value.exit_code == 6


def test_a_restart_by_systemd_between_probes_is_a_failure() -> None:
    remote = scripted([LOADING, snapshot(restarts=1, pid=4300), READY])
    with pytest.raises(UnitFailed, match="restarted 1 time"):
        wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(10))


def test_the_deadline_ends_in_readiness_failed_naming_the_rung_and_last_log_line() -> None:
    remote = scripted([LOADING, snapshot(), snapshot()])  # the later probes saw no new log line
    with pytest.raises(ReadinessFailed) as failed:
        wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(3))
    assert type(failed.value) is ReadinessFailed
    assert failed.value.rung == Rung.PORT
    assert "still loading" in failed.value.message and "deadline 1800 s" in failed.value.message
    assert f"last log line: {LOADING.last_log.text}" in failed.value.evidence  # type: ignore[union-attr]
    assert "startup_timeout_s" in (failed.value.hint or "")


def test_the_api_key_travels_only_in_secret_steps_and_is_never_reported() -> None:
    remote = scripted([LOADING, GEN_SLOW, READY])
    progress = RecordingProgress()
    wait_ready(remote, TARGET, deadline_s=1800, progress=progress, policy=fast(5, progress))
    # Every probe carries the generation request, so readiness needs no extra round trip once /health is 200.
    assert all(step.secret and b"sk-test-6f1c" in (step.stdin or b"") for step in probe_steps(remote))
    assert all("sk-test-6f1c" not in " ".join(step.argv) for step in probe_steps(remote))
    assert "sk-test-6f1c" not in repr(TARGET) + repr(probe_steps(remote)) + repr(progress.events)


def test_a_server_bound_to_every_address_is_probed_on_loopback() -> None:
    remote = scripted([READY])
    wait_ready(remote, ProbeTarget(unit=None, port=30000, host="0.0.0.0"), deadline_s=60, progress=NullProgress(),
               policy=fast(1))
    assert probe_configs(remote)[0]["host"] == "127.0.0.1"


def test_a_probe_without_an_api_key_is_not_masked() -> None:
    step = probe_step(ProbeTarget(unit="sglang.service", port=30000), Rung.GENERATE)
    assert not step.secret and step.argv == ("python3", "-I", "-S", "-") and step.sudo


def test_a_host_without_python3_fails_the_probe_step_loudly() -> None:
    remote = FakeRemote().reply(is_probe, exit_code=127, stderr="sudo: python3: command not found")
    with pytest.raises(StepFailed):
        wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(10))
    assert len(probe_steps(remote)) == 1


def test_a_probe_that_prints_no_snapshot_stops_the_ladder_at_once() -> None:
    remote = FakeRemote().reply(is_probe, stdout="Traceback (most recent call last):\n", stderr="SyntaxError")
    with pytest.raises(ReadinessFailed, match="printed no snapshot") as failed:
        wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(10))
    assert "SyntaxError" in failed.value.evidence
    assert len(probe_steps(remote)) == 1


def test_a_start_slower_than_history_predicts_gets_one_note() -> None:
    ticks = iter(range(0, 10_000, 100))
    prediction = predict_start([100.0, 110.0, 120.0])
    progress = RecordingProgress()
    wait_ready(scripted([LOADING] * 4 + [READY]), TARGET, deadline_s=1800, progress=progress,
               prediction=prediction, policy=fast(10, progress), clock=lambda: float(next(ticks)))
    assert progress.of_kind("note") == ["start is taking longer than the last 3 starts (median 110 s)"]


def test_healthy_then_dead_within_the_grace_window_is_a_failure() -> None:
    remote = scripted([READY, snapshot(port=True, health=200), CRASHED])
    grace = grace_policy(60).copy(sleep=noop, stop=stop_after_attempt(5))
    with pytest.raises(ReadinessFailed) as failed:
        wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(3), grace_s=60,
                   grace=grace)
    assert failed.value.rung == "grace"
    assert "then within the 60 s grace window: the unit failed" in failed.value.message


def test_a_server_that_stays_up_through_the_grace_window_is_ready() -> None:
    remote = scripted([READY] + [snapshot(port=True, health=200)] * 3)
    grace = grace_policy(60).copy(sleep=noop, stop=stop_after_attempt(3))
    report = wait_ready(remote, TARGET, deadline_s=1800, progress=NullProgress(), policy=fast(3), grace_s=60,
                        grace=grace)
    assert report.rung == Rung.GENERATE and report.attempts == 4
    # The grace window re-checks health without generating again, each look waiting on the host for a change.
    assert [config["generate"] is None for config in probe_configs(remote)] == [False, True, True, True]
    assert [config["wait_s"] for config in probe_configs(remote)][1:] == [WATCH_S] * 3


# --- prediction and version rules ----------------------------------------------------------------------------

def test_prediction_needs_a_few_starts_and_uses_the_recent_median() -> None:
    assert predict_start([]) is None
    assert predict_start([300.0, 310.0]) is None
    prediction = predict_start([900.0] * 5 + [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0])
    assert prediction is not None
    assert prediction.samples == 10 and prediction.median_s == 145.0
    assert prediction.threshold_s == 145.0 * 1.5 + 30


@pytest.mark.parametrize(("version", "path"), [
    ("0.5.9", "/health"), ("0.5.15.post1", "/health"), ("0.5.20", "/ready"), ("0.5.23", "/ready"),
    ("0.6.0rc1", "/ready"), ("0.5.19rc3", "/health"), ("1.0", "/ready"),
])
def test_the_health_path_follows_the_installed_sglang(version: str, path: str) -> None:
    assert health_path_for(version) == path


def test_a_version_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a version"):
        health_path_for("unknown")


# --- the probe script itself, run as the host runs it: `python3 -` with the step's stdin ---------------------

class FakeSGLang(BaseHTTPRequestHandler):
    """The endpoints the probe uses, as SGLang answers them; class state is set per test."""

    health_status: ClassVar[int] = 200
    healthy_from: ClassVar[int | None] = None  # /health answers 200 from this request on (counted from 1)
    health_requests: ClassVar[int] = 0
    api_key: ClassVar[str] = "sk-local-77"
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        if self.path != "/health":
            self.reply(404, b"")
            return
        FakeSGLang.health_requests += 1
        healthy = self.healthy_from is not None and self.health_requests >= self.healthy_from
        self.reply(200 if healthy else self.health_status, b"")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen_auth.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.reply(401, b'{"error": "Unauthorized"}')
        elif self.path == "/generate" and body["sampling_params"]["max_new_tokens"] == 2:
            self.reply(200, json.dumps({"text": " Paris", "meta_info": {"completion_tokens": 2}}).encode())
        else:
            self.reply(400, b"{}")

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLang)
    FakeSGLang.seen_auth = []
    FakeSGLang.healthy_from, FakeSGLang.health_requests = None, 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_probe_reports_a_closed_port_as_refused_and_tries_nothing_further(tmp_path: Path) -> None:
    target = ProbeTarget(unit=None, port=closed_port())
    result = run_probe(probe_step(target, Rung.GENERATE))
    assert result["port_open"] is False and result["port_error"] == "refused"
    assert result["health_status"] is None and result["generation"] is None


def test_probe_sees_a_warming_server_and_does_not_generate_yet(server: ThreadingHTTPServer) -> None:
    FakeSGLang.health_status = 503
    target = ProbeTarget(unit=None, port=server.server_address[1], api_key="sk-local-77")
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.GENERATE)))
    assert snap.port_open and snap.health_status == 503 and snap.generation is None
    assert FakeSGLang.seen_auth == []


def test_a_proxy_in_the_probes_environment_never_sees_its_requests(server: ThreadingHTTPServer) -> None:
    """Input tried: http_proxy and HTTP_PROXY naming a closed port: health and generation still reach the server."""
    FakeSGLang.health_status = 200
    target = ProbeTarget(unit=None, port=server.server_address[1], api_key="sk-local-77",
                         generation=GenerationProbe(timeout_s=10))
    proxy = f"http://127.0.0.1:{closed_port()}"
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.GENERATE), http_proxy=proxy, HTTP_PROXY=proxy))
    assert snap.health_status == 200 and snap.generation is not None and snap.generation.status == 200


def test_probe_generates_with_the_api_key_in_the_header_only(server: ThreadingHTTPServer) -> None:
    FakeSGLang.health_status = 200
    target = ProbeTarget(unit=None, port=server.server_address[1], api_key="sk-local-77",
                         generation=GenerationProbe(timeout_s=10))
    step = probe_step(target, Rung.GENERATE)
    raw = run_probe(step)
    assert "sk-local-77" not in json.dumps(raw)
    assert FakeSGLang.seen_auth == ["Bearer sk-local-77"]
    assert isinstance(assess(Snapshot.model_validate(raw), None, Rung.GENERATE), Ready)
    assert raw["generation"]["text"] == " Paris"


def test_probe_reports_a_wrong_api_key_as_the_server_answered_it(server: ThreadingHTTPServer) -> None:
    FakeSGLang.health_status = 200
    target = ProbeTarget(unit=None, port=server.server_address[1], api_key="wrong")
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.GENERATE)))
    assert snap.generation is not None and snap.generation.status == 401
    assert isinstance(assess(snap, None, Rung.GENERATE), ProbeRejected)


def test_a_waiting_probe_returns_at_the_first_look_that_differs_from_what_the_caller_saw(
        server: ThreadingHTTPServer) -> None:
    FakeSGLang.health_status, FakeSGLang.healthy_from = 503, 4
    target = ProbeTarget(unit=None, port=server.server_address[1], health_path="/health", generation=None)
    warming = Snapshot.model_validate(run_probe(probe_step(target, Rung.HEALTH)))  # request 1
    assert warming.health_status == 503 and warming.state
    ready = Snapshot.model_validate(run_probe(probe_step(target, Rung.HEALTH, seen=warming.state, wait_s=60)))
    # requests 2 and 3 still saw 503, so it looked again (one round trip); request 4 saw 200 and it returned then
    assert ready.health_status == 200 and ready.state != warming.state
    assert FakeSGLang.health_requests == 4


def test_a_waiting_probe_that_sees_no_change_returns_its_last_look_when_the_wait_ends(
        server: ThreadingHTTPServer) -> None:
    FakeSGLang.health_status = 503
    target = ProbeTarget(unit=None, port=server.server_address[1], health_path="/health", generation=None)
    warming = Snapshot.model_validate(run_probe(probe_step(target, Rung.HEALTH)))
    again = Snapshot.model_validate(run_probe(probe_step(target, Rung.HEALTH, seen=warming.state, wait_s=0.3)))
    assert again.state == warming.state and again.health_status == 503
    # it kept looking until the wait was over (how often it looked within 0.3 s is this machine's speed: a busy one
    # looked once, so the count is no assertion; a late return is what a busy machine adds, never an early one)
    assert again.probe_s >= 0.3 - POLL_S and FakeSGLang.health_requests >= 2


JOURNALCTL = """#!/bin/sh
printf '%s\\n' "$@" > "{directory}/journalctl.args"
echo '{"__CURSOR":"s=abc;i=2f","MESSAGE":"[2026-11-29 11:02:03 TP0] Load weight begin. avail mem=93.21 GB"}'
"""


def test_probe_reads_the_unit_state_and_newest_journal_line(tmp_path: Path) -> None:
    path = fake_tools(tmp_path, systemctl=SYSTEMCTL, journalctl=JOURNALCTL)
    target = ProbeTarget(unit="sglang.service", port=closed_port())
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.GENERATE, after_cursor="s=abc;i=2e"), path))
    assert snap.unit is not None and snap.unit.active_state == "active" and snap.unit.exec_main_pid == 4242
    assert snap.last_log is not None and snap.last_log.cursor == "s=abc;i=2f"
    assert "Load weight begin" in snap.last_log.text
    # the unit's matches as every journal read has them (`-u` takes UNIT= from PID 1 only)
    assert (tmp_path / "journalctl.args").read_text().splitlines() == ["-n", "1", "-o", "json", "--no-pager", "-q",
                                                                   *unit_matches("sglang.service")]
    assert (tmp_path / "systemctl.args").read_text().startswith("show sglang.service")
    assert isinstance(assess(snap, 0, Rung.GENERATE), NotReady)


def test_probe_reports_no_line_when_nothing_was_logged_since_the_cursor(tmp_path: Path) -> None:
    """The newest entry is the one the last probe already showed: no new line, not the same one again."""
    path = fake_tools(tmp_path, systemctl=SYSTEMCTL, journalctl=JOURNALCTL)
    target = ProbeTarget(unit="sglang.service", port=closed_port())
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.GENERATE, after_cursor="s=abc;i=2f"), path))
    assert snap.last_log is None and snap.journal_error is None


def test_probe_without_systemd_tools_still_answers(tmp_path: Path) -> None:
    target = ProbeTarget(unit="sglang.service", port=closed_port())
    snap = Snapshot.model_validate(run_probe(probe_step(target, Rung.PORT), str(tmp_path)))
    assert snap.unit is None and snap.unit_error == "systemctl not found"
    assert snap.journal_error == "journalctl not found"


# --- on the sandbox VM: real systemd, journald, sudo and SSH ------------------------------------------------

UNIT = "ladder-probe.service"
PORT = 30123
# A stand-in server: loads, binds, warms up (503), then serves; modes make it crash, die or hang.
FAKE_SERVER = '''
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
load_s, warm_s, port, mode = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("[2026-11-29 11:02:12 TP0] Load weight begin. avail mem=93.21 GB", flush=True)
time.sleep(load_s)
if mode == "crash":
    print("ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.", flush=True)
    sys.exit(1)
up_at = time.monotonic() + warm_s
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if time.monotonic() >= up_at else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if mode == "hang":
            time.sleep(3600)
        body = json.dumps({"text": " Paris"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if mode == "die":  # dead once it has served the ladder's generation: within any grace window, on any machine
            os._exit(1)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
print(f"[2026-11-29 11:04:40] INFO:     Uvicorn running on http://127.0.0.1:{port}", flush=True)
time.sleep(warm_s)
print("[2026-11-29 11:04:43] The server is fired up and ready to roll!", flush=True)
server.serve_forever()
'''


@pytest.fixture(scope="module")
def sandbox() -> Iterator[FabricRemote]:
    """A guest of our own (named by our PID, so concurrent runs do not collide), logged into as the sudo
    user `deploy`, always stopped at the end."""
    script = Path(__file__).parent.parent / "sandbox" / "testhost.sh"
    env = dict(os.environ, TH_NAME=f"hh{os.getpid()}"[:12])

    def testhost(*args: str) -> str:
        return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True,
                              timeout=600, check=True).stdout

    try:
        testhost("start")
        facts = dict(line.split("=", 1) for line in testhost("info").splitlines() if "=" in line)
        remote = FabricRemote(SSHTarget(host=facts["guest_ip"], user="deploy", key_files=(Path(facts["key"]),),
                                        known_hosts_file=Path(facts["known_hosts"])))
        remote.run([Step("mkdir", ("mkdir", "-p", "/opt/ladder-probe"), sudo=True),
                    Put(PurePosixPath("/opt/ladder-probe/server.py"), FAKE_SERVER.encode(), 0o644, sudo=True)])
        yield remote
        remote.close()
    finally:
        testhost("stop")


def start_unit(remote: FabricRemote, mode: str, load_s: float = 1.0, warm_s: float = 1.0) -> tuple[str | None, float]:
    """Install the stand-in as a unit, restart it the way a deploy does; the journal cursor from before."""
    restart = "on-failure" if mode == "crash" else "no"
    unit = (f"[Service]\nExecStart=/usr/bin/python3 -u /opt/ladder-probe/server.py {load_s} {warm_s} {PORT} {mode}\n"
            f"Restart={restart}\nRestartSec=1\n")
    remote.run([Step("stop", ("systemctl", "stop", UNIT), sudo=True, ok=frozenset({0, 5})),
                Put(PurePosixPath(f"/etc/systemd/system/{UNIT}"), unit.encode(), 0o644, sudo=True),
                Step("reload", ("systemctl", "daemon-reload"), sudo=True),
                Step("reset", ("systemctl", "reset-failed", UNIT), sudo=True, ok=frozenset({0, 1}))])
    [cursor] = remote.run([journal_cursor_step(UNIT)])
    started_at = time.monotonic()
    remote.run([Step("restart", ("systemctl", "restart", UNIT), sudo=True)])
    return parse_journal_cursor(cursor.stdout), started_at


SANDBOX_TARGET = ProbeTarget(unit=UNIT, port=PORT, generation=GenerationProbe(timeout_s=2))


@pytest.mark.sandbox
def test_sandbox_ladder_reaches_a_generation_and_shows_only_this_starts_lines(sandbox: FabricRemote) -> None:
    start_unit(sandbox, "ok")  # an earlier start, whose lines must not show below
    cursor, started_at = start_unit(sandbox, "ok", warm_s=1.5)
    progress = RecordingProgress()
    report = wait_ready(sandbox, SANDBOX_TARGET, deadline_s=30, progress=progress, after_cursor=cursor,
                        started_at=started_at)
    assert report.rung == Rung.GENERATE
    assert report.snapshot.unit is not None and report.snapshot.unit.n_restarts == 0
    # the marks are every startup line read since the cursor, whatever the looks' cadence: this start's one, not the
    # earlier start's (the lines shown are the last one at each look, so a loaded machine may show none of them)
    assert sum("Load weight begin" in mark.text for mark in report.marks) == 1
    assert sum("Load weight begin" in str(line) for line in progress.of_kind("log")) <= 1
    assert "readiness: generate" in [name for name, _s in progress.of_kind("done")]  # type: ignore[misc]


@pytest.mark.sandbox
def test_sandbox_crash_while_loading_stops_the_ladder_and_is_diagnosed(sandbox: FabricRemote) -> None:
    cursor, started_at = start_unit(sandbox, "crash")
    with pytest.raises(UnitFailed) as failed:
        wait_ready(sandbox, SANDBOX_TARGET, deadline_s=60, progress=NullProgress(), after_cursor=cursor,
                   started_at=started_at)
    assert failed.value.rung == Rung.UNIT
    [journal] = sandbox.run([journal_step(UNIT, cursor)])
    assert diagnose(journal.stdout.splitlines()).signature == "fusion_gate"


@pytest.mark.sandbox
def test_sandbox_hang_while_loading_ends_at_the_deadline(sandbox: FabricRemote) -> None:
    cursor, started_at = start_unit(sandbox, "ok", load_s=3600)
    # the load never ends, so any deadline shows the same; one that also covers a busy machine's python start
    with pytest.raises(ReadinessFailed) as failed:
        wait_ready(sandbox, SANDBOX_TARGET, deadline_s=15, progress=NullProgress(), after_cursor=cursor,
                   started_at=started_at)
    assert type(failed.value) is ReadinessFailed and failed.value.rung == Rung.PORT
    assert "last log line: [2026-11-29 11:02:12 TP0] Load weight begin. avail mem=93.21 GB" in failed.value.evidence


@pytest.mark.sandbox
def test_sandbox_health_200_while_generation_hangs_is_not_ready(sandbox: FabricRemote) -> None:
    cursor, started_at = start_unit(sandbox, "hang", warm_s=0.5)
    # the generation never answers, so any deadline shows the same; one long enough for /health on a busy machine
    with pytest.raises(ReadinessFailed) as failed:
        wait_ready(sandbox, SANDBOX_TARGET, deadline_s=20, progress=NullProgress(), after_cursor=cursor,
                   started_at=started_at)
    assert failed.value.rung == Rung.GENERATE
    assert "generation failed: timeout" in failed.value.message


@pytest.mark.sandbox
def test_sandbox_healthy_then_dead_within_the_grace_window_fails(sandbox: FabricRemote) -> None:
    cursor, started_at = start_unit(sandbox, "die", warm_s=0.5)
    with pytest.raises(ReadinessFailed) as failed:
        wait_ready(sandbox, SANDBOX_TARGET, deadline_s=30, progress=NullProgress(), after_cursor=cursor,
                   started_at=started_at, grace_s=10)
    assert failed.value.rung == "grace"
    assert "grace window" in failed.value.message


# What systemd's exec child logs when the executable is missing, sent from a process outside the unit that exits at
# once: journald gives the message UNIT= but not _SYSTEMD_UNIT, as it does when the child is gone before it is read.
LOG_AS_THE_EXEC_CHILD = """import socket, sys
journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
journal.sendto(("UNIT=%s\\nMESSAGE=%s: Failed to locate executable /opt/gone/bin/python3: No such file or directory\\n"
                % (sys.argv[1], sys.argv[1])).encode(), "/run/systemd/journal/socket")
"""


@pytest.mark.sandbox
def test_sandbox_every_journal_read_sees_the_exec_childs_line_without_a_unit(sandbox: FabricRemote) -> None:
    """The line `journalctl -u` misses (it takes UNIT= from PID 1 only) is the one that names the missing venv: the
    cursor taken before a restart, the probe's newest line and the diagnosis's read all see it."""
    start_unit(sandbox, "ok")
    sandbox.run([Step("stop", ("systemctl", "stop", UNIT), sudo=True), JOURNAL_SYNC])  # nothing logs after this
    [before] = sandbox.run([journal_cursor_step(UNIT)])
    cursor = parse_journal_cursor(before.stdout)
    sandbox.run([Step("log as the exec child", ("python3", "-c", LOG_AS_THE_EXEC_CHILD, UNIT), sudo=True),
                 JOURNAL_SYNC])
    [newest] = sandbox.run([journal_cursor_step(UNIT)])
    assert parse_journal_cursor(newest.stdout) not in (None, cursor)
    [probed] = sandbox.run([probe_step(SANDBOX_TARGET, Rung.UNIT, after_cursor=cursor)])
    snapshot = parse_snapshot(probed, Rung.UNIT)
    assert snapshot.last_log is not None and "Failed to locate executable" in snapshot.last_log.text
    assert snapshot.last_log.cursor == parse_journal_cursor(newest.stdout)
    [journal] = sandbox.run([journal_step(UNIT, cursor)])
    assert diagnose(journal.stdout.splitlines()).signature == "missing_venv"


@pytest.mark.parametrize(("bind", "probe", "bench_url"), [
    ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:8000"), ("", "127.0.0.1", "http://127.0.0.1:8000"),
    ("::", "::1", "http://[::1]:8000"), ("10.0.0.5", "10.0.0.5", "http://10.0.0.5:8000"),
    ("fd00::5", "fd00::5", "http://[fd00::5]:8000"),
])
def test_a_server_bound_to_every_address_is_probed_and_benchmarked_on_loopback(bind: str, probe: str,
                                                                                bench_url: str) -> None:
    """The probe and the benchmark run on the host itself; `status` shows clients the host's address instead."""
    assert ProbeTarget(unit="sglang.service", port=8000, host=bind).probe_host == probe
    metadata = {"id": "r1", "venv": "/opt/v", "profile": {"server": {"host": bind, "port": 8000},
                                                          "model": {"path": "/m"}}}
    assert BenchRun.of_release(metadata, BenchSettings()).base_url == bench_url
