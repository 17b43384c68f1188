"""Project hooks (hooks/pre-deploy, ...) run locally with the deploy's facts in the environment, a failing pre- hook
stopping the command; and webhook notifications, tested against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from tenacity import stop_after_attempt, wait_none

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.hooks import HookContext, HookEvent, run_hook
from deploy_lib.inventory import load_inventory
from deploy_lib.remote.webhook import NOTIFY_RETRY, Notification, Notifier, NotifyEvent, send

CONTEXT = HookContext(command="deploy", hosts=("gpu1", "gpu2"), profile="glm5-nvfp4", release_id="ac2a8743bd47",
                      previous_id=None, outcome=None)
FAST = NOTIFY_RETRY.copy(wait=wait_none(), stop=stop_after_attempt(3))


def _hook(root: Path, event: str, body: str) -> Path:
    path = root / "hooks" / event
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_hook_gets_the_deploys_facts_in_its_environment_and_runs_in_the_project(tmp_path: Path) -> None:
    """Input tried: a post-deploy hook that writes its environment, with a stale SGLANG_DEPLOY_PREVIOUS inherited."""
    _hook(tmp_path, "post-deploy", "env | grep ^SGLANG_DEPLOY_ | sort > seen; pwd >> seen\n")
    result = run_hook(tmp_path, HookEvent.post_deploy, replace(CONTEXT, outcome="deployed"),
                      {"PATH": "/usr/bin:/bin", "SGLANG_DEPLOY_PREVIOUS": "stale"})
    assert result is not None and result.ok
    assert (tmp_path / "seen").read_text().splitlines() == [
        "SGLANG_DEPLOY_COMMAND=deploy", "SGLANG_DEPLOY_EVENT=post-deploy", "SGLANG_DEPLOY_HOSTS=gpu1,gpu2",
        "SGLANG_DEPLOY_OUTCOME=deployed", "SGLANG_DEPLOY_PROFILE=glm5-nvfp4", "SGLANG_DEPLOY_RELEASE=ac2a8743bd47",
        str(tmp_path)]


def test_a_failing_pre_deploy_hook_stops_the_command_with_its_output(tmp_path: Path) -> None:
    """Input tried: a pre-deploy hook that prints why and exits 3 (e.g. a change freeze)."""
    _hook(tmp_path, "pre-deploy", "echo 'change freeze until Monday'; exit 3\n")
    with pytest.raises(PreflightError) as stopped:
        run_hook(tmp_path, HookEvent.pre_deploy, CONTEXT, {"PATH": "/usr/bin:/bin"})
    message = str(stopped.value)
    assert "pre-deploy hook" in message and "exited with status 3; deploy stopped before any host changed" in message
    assert "| change freeze until Monday" in message


def test_a_failing_post_hook_is_a_result_not_an_error(tmp_path: Path) -> None:
    _hook(tmp_path, "post-rollback", "echo 'pager down' >&2; exit 1\n")
    result = run_hook(tmp_path, HookEvent.post_rollback, CONTEXT, {"PATH": "/usr/bin:/bin"})
    assert result is not None and (result.exit_code, result.output) == (1, "pager down")


def test_no_hook_runs_nothing_and_a_hook_that_cannot_run_is_refused(tmp_path: Path) -> None:
    assert run_hook(tmp_path, HookEvent.pre_deploy, CONTEXT, {}) is None
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "pre-deploy").write_text("#!/bin/sh\nexit 0\n")  # not executable
    with pytest.raises(ConfigError, match="is not an executable file"):
        run_hook(tmp_path, HookEvent.pre_deploy, CONTEXT, {})


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []  # each fixture makes a subclass with lists of its own
    statuses: ClassVar[list[int]] = []  # the statuses to answer with, in turn; then 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.bodies.append(body)
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, type[_Receiver]]]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    handler = type("Receiver", (_Receiver,), {"bodies": [], "statuses": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    finally:
        server.shutdown()
        server.server_close()


HOSTILE = "release \"x\" failed: `rm -rf /`; <b>bold</b> \\n\u2028 é"


def test_a_notification_is_posted_as_json_with_slack_text(receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: a rollback notification whose message holds quotes, a backslash, HTML and a line separator."""
    url, handler = receiver
    notifier = Notifier(url, FAST)
    notifier.notify(Notification(NotifyEvent.rolled_back, "gpu1", "sglang", HOSTILE, "21a6cd18cbea", "ac2a8743bd47"))
    results = notifier.close()
    assert [result.delivered for result in results] == [True]
    body, = handler.bodies
    assert (body["event"], body["host"], body["message"], body["release"], body["serving"]) == (
        "rolled-back", "gpu1", HOSTILE, "21a6cd18cbea", "ac2a8743bd47")
    assert body["text"].startswith(":leftwards_arrow_with_hook: sglang-deploy gpu1 (sglang): release \"x\"")


def test_a_receiver_answering_503_is_retried_and_a_404_is_not(receiver: tuple[str, type[_Receiver]]) -> None:
    url, handler = receiver
    handler.statuses[:] = [503, 502]
    note = Notification(NotifyEvent.gate_failed, "gpu1", "sglang", "below the gate")
    assert send(url, note, FAST).delivered and len(handler.bodies) == 1
    handler.statuses[:] = [404, 200]
    refused = send(url, note, FAST)
    assert (refused.delivered, refused.error) == (False, "HTTP 404 Not Found")
    assert handler.statuses == [200]  # not asked again


def test_an_unreachable_receiver_never_raises(receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: a port nothing listens on (the receiver's, after it is shut down)."""
    url, _ = receiver
    closed = url.replace(url.split(":")[2].split("/")[0], "1")  # port 1: refused at once on loopback
    notifier = Notifier(closed, FAST)
    notifier.notify(Notification(NotifyEvent.crash_loop, "gpu1", "sglang", "gave up after 5 restarts"))
    result, = notifier.close()
    assert not result.delivered and result.error


def test_no_webhook_sends_nothing_and_the_inventory_refuses_a_url_that_is_not_http(tmp_path: Path) -> None:
    notifier = Notifier(None)
    notifier.notify(Notification(NotifyEvent.deployed, "gpu1", "sglang", "deployed"))
    assert notifier.close() == []
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts: {gpu1: {}}\n  vars: {notify_webhook: 'file:///etc/passwd'}\n")
    with pytest.raises(ConfigError, match="host gpu1: notify_webhook: String should match pattern"):
        load_inventory(inventory)
