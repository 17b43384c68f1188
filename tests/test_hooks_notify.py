"""Project hooks (hooks/pre-deploy, ...) run locally with the deploy's facts in the environment, a failing pre- hook
stopping the command; and webhook notifications, tested against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from tenacity import stop_after_attempt, wait_none

from deploy_lib.commands.deploy import Options
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, PreflightError, ReadinessFailed
from deploy_lib.host.hooks import HookContext, HookEvent, run_hook
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops import dispatch
from deploy_lib.ops.scope import Reach, Scope
from deploy_lib.outcomes import Action
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
    result = run_hook(tmp_path, HookEvent.post_deploy, replace(CONTEXT, outcome=Action.deployed),
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


# ---------------------------------------------------------------------------------------------------------------
# The hooks and the webhook around the ops layer's deploy, rollback and status (deploy_lib/ops/notices.py): a fake
# host, the project's real hook executables, a real HTTP receiver on loopback

ENV_DUMP = "env | grep ^SGLANG_DEPLOY_ | sort > \"$0.seen\"\n"


def told(target: Target, url: str) -> Target:
    """The target with the inventory's notify_webhook set to `url`."""
    return replace(target, host=target.host.model_copy(update={"vars": target.host.vars.model_copy(
        update={"notify_webhook": url})}))


def one_host(remote: FakeRemote, url: str | None, project_root: Path | None, asked: list[str] | None = None
             ) -> tuple[Scope, Reach, RecordingProgress]:
    """One host (the reference target) reached through `remote`, hooks from `project_root`, webhook `url`."""
    from helpers.deploy_plan import PROJECT, target
    host = told(target(), url) if url else target()
    progress = RecordingProgress()
    connected = asked if asked is not None else []

    def connect(found: Target, prefixed: bool) -> Any:
        connected.append(found.host.name)
        return nullcontext(remote)
    return (Scope(PROJECT.inventory(None), (host,)),
            Reach(connect, lambda name: progress, lambda question: None, {"PATH": "/usr/bin:/bin"},
                  project_root=project_root, notify_retry=FAST), progress)


def seen(root: Path, event: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (root / "hooks" / f"{event}.seen").read_text().splitlines())


def test_a_failing_pre_deploy_hook_stops_the_deploy_before_any_host_is_reached(tmp_path: Path) -> None:
    """Input tried: `deploy --profile glm5-nvfp4` with a pre-deploy hook that exits 3 (failed before: the ops
    deploy never ran the project's hooks)."""
    from helpers.deploy_plan import PROJECT
    from helpers.rollback import a_host
    _hook(tmp_path, "pre-deploy", "echo 'change freeze'; exit 3\n")
    connected: list[str] = []
    scope, reach, _ = one_host(a_host(), None, tmp_path, connected)
    with pytest.raises(PreflightError, match="deploy stopped before any host changed") as stopped:
        dispatch.deploy(PROJECT, scope, "glm5-nvfp4", Options(grace_s=0), reach)
    assert "| change freeze" in stopped.value.message and stopped.value.exit_code == 3
    assert connected == []


def test_a_deploy_done_runs_post_deploy_and_tells_the_webhook(tmp_path: Path,
                                                              receiver: tuple[str, type[_Receiver]]) -> None:
    from helpers.deploy_plan import PROJECT
    from helpers.rollback import a_host
    url, handler = receiver
    for event in ("pre-deploy", "post-deploy", "post-rollback"):
        _hook(tmp_path, event, ENV_DUMP)
    scope, reach, _ = one_host(a_host(), url, tmp_path)
    fleet = dispatch.deploy(PROJECT, scope, "glm5-nvfp4", Options(grace_s=0), reach)
    outcome = dispatch.one(fleet)
    assert outcome.action == "deployed"
    host = scope.names[0]
    assert seen(tmp_path, "pre-deploy") == {"SGLANG_DEPLOY_COMMAND": "deploy", "SGLANG_DEPLOY_EVENT": "pre-deploy",
                                            "SGLANG_DEPLOY_HOSTS": host, "SGLANG_DEPLOY_PROFILE": "glm5-nvfp4"}
    assert seen(tmp_path, "post-deploy") == {
        "SGLANG_DEPLOY_COMMAND": "deploy", "SGLANG_DEPLOY_EVENT": "post-deploy", "SGLANG_DEPLOY_HOSTS": host,
        "SGLANG_DEPLOY_PROFILE": "glm5-nvfp4", "SGLANG_DEPLOY_RELEASE": outcome.release_id,
        "SGLANG_DEPLOY_PREVIOUS": "B", "SGLANG_DEPLOY_OUTCOME": "deployed"}
    assert not (tmp_path / "hooks" / "post-rollback.seen").exists(), "nothing was rolled back"
    body, = handler.bodies
    assert (body["event"], body["host"], body["release"], body["serving"]) == ("deployed", host, outcome.release_id,
                                                                              outcome.release_id)
    assert body["text"] == f":white_check_mark: sglang-deploy {host} (sglang): deployed release " \
                           f"{outcome.release_id} (was B)"


class DeadExceptB(dict):  # type: ignore[type-arg]
    """Probe answers by release: B (what served before) comes up, every other release dies at its start."""

    def __missing__(self, release_id: str) -> list[object]:
        from helpers.rollback import DEAD, READY
        return [READY] if release_id == "B" else [DEAD]


def test_a_deploy_rolled_back_automatically_runs_post_rollback_and_tells_the_webhook(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: a deploy whose new release dies at its start; B is restored."""
    from helpers.deploy_plan import PROJECT
    from helpers.rollback import a_host
    url, handler = receiver
    for event in ("post-deploy", "post-rollback"):
        _hook(tmp_path, event, ENV_DUMP)
    remote = a_host()
    remote.probes = DeadExceptB()
    scope, reach, _ = one_host(remote, url, tmp_path)
    with pytest.raises(ReadinessFailed, match="rolled back, release B is serving") as failed:
        dispatch.deploy(PROJECT, scope, "glm5-nvfp4", Options(grace_s=0), reach)
    new = failed.value.release_id
    assert seen(tmp_path, "post-deploy")["SGLANG_DEPLOY_OUTCOME"] == "rolled-back"
    after = seen(tmp_path, "post-rollback")
    assert (after["SGLANG_DEPLOY_RELEASE"], after["SGLANG_DEPLOY_PREVIOUS"], after["SGLANG_DEPLOY_OUTCOME"]) == (
        "B", new, "rolled-back")
    body, = handler.bodies
    assert (body["event"], body["release"], body["serving"]) == ("rolled-back", new, "B")
    assert "rolled back, release B is serving" in body["text"]


def test_a_rollback_by_hand_runs_its_hooks_and_tells_the_webhook(tmp_path: Path,
                                                                 receiver: tuple[str, type[_Receiver]]) -> None:
    from helpers.rollback import READY, ScriptedHost
    url, handler = receiver
    for event in ("pre-rollback", "post-rollback"):
        _hook(tmp_path, event, ENV_DUMP)
    scope, reach, _ = one_host(ScriptedHost({"A": [READY], "B": [READY]}), url, tmp_path)
    outcome = dispatch.one(dispatch.rollback(scope, "sglang", "A", reach))
    assert (outcome.action, outcome.release_id, outcome.previous_id) == ("rolled back", "A", "B")
    assert seen(tmp_path, "pre-rollback")["SGLANG_DEPLOY_RELEASE"] == "A"
    assert "SGLANG_DEPLOY_OUTCOME" not in seen(tmp_path, "pre-rollback")
    after = seen(tmp_path, "post-rollback")
    assert (after["SGLANG_DEPLOY_RELEASE"], after["SGLANG_DEPLOY_PREVIOUS"], after["SGLANG_DEPLOY_OUTCOME"]) == (
        "A", "B", "rolled-back")
    body, = handler.bodies
    assert (body["event"], body["release"], body["serving"]) == ("rolled-back", "A", "A")
    assert body["message"] == "rolled back by hand to release A (was B)"


def test_a_failing_post_hook_and_an_unreachable_webhook_are_notes_and_the_deploy_stands(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: a post-deploy hook that exits 1, the webhook a port nothing listens on."""
    from helpers.deploy_plan import PROJECT
    from helpers.rollback import a_host
    url, _ = receiver
    closed = url.replace(url.split(":")[2].split("/")[0], "1")
    _hook(tmp_path, "post-deploy", "echo 'pager down' >&2; exit 1\n")
    scope, reach, progress = one_host(a_host(), closed, tmp_path)
    outcome = dispatch.one(dispatch.deploy(PROJECT, scope, "glm5-nvfp4", Options(grace_s=0), reach))
    assert outcome.action == "deployed"
    notes = [str(note) for note in progress.of_kind("note") if "hook" in str(note)]
    assert len(notes) == 2
    assert "post-deploy hook" in notes[0] and "exited with status 1" in notes[0] and "pager down" in notes[0]
    assert f"{scope.names[0]}: the deployed notification was not delivered to the webhook" in notes[1]


def test_a_crash_loop_given_up_is_told_by_the_status_read_that_recorded_it(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]]) -> None:
    """The read that first finds the crash loop records it and tells the webhook; a later read (the crash already in
    history) tells nobody again."""
    from helpers.crashes import crash_loop_status

    from deploy_lib.ops.fleet import FleetRun, HostRun
    from deploy_lib.ops.notices import crash_loops
    url, handler = receiver
    scope, reach, _ = one_host(FakeRemote(), url, tmp_path)
    host = scope.names[0]
    first = replace(crash_loop_status(), host=host, recorded_crashes=4)
    crash_loops(FleetRun((HostRun(host, result=first),), ((host,),)), scope, reach)
    crash_loops(FleetRun((HostRun(host, result=replace(first, recorded_crashes=0)),), ((host,),)), scope, reach)
    body, = handler.bodies
    assert (body["event"], body["host"], body["release"]) == ("crash-loop-given-up", host, "r2")
    assert body["text"].startswith(f":rotating_light: sglang-deploy {host} (sglang): release r2 is down: gave up "
                                   "after 3 restarts: exit status 1")



# ---------------------------------------------------------------------------------------------------------------
# The other commands that deploy a release (ops.commands.patch, tune, router_deploy) run the deploy hooks and tell
# the webhook the same way

def _patch(scope: Scope, reach: Reach, tmp_path: Path) -> object:
    from helpers.deploy_plan import PROJECT

    from deploy_lib.bundled import ROLES_DIR
    from deploy_lib.patches import find_patch_set
    return dispatch.patch(PROJECT, scope, find_patch_set(ROLES_DIR, "fusion-sm120"), "glm5-nvfp4", "sglang", True,
                          reach)


def _tune(scope: Scope, reach: Reach, tmp_path: Path) -> object:
    from helpers.tune_loop import BASE, MRR, request
    return dispatch.tune(scope, BASE, request(*MRR), reach)


def _router(scope: Scope, reach: Reach, tmp_path: Path) -> object:
    from helpers.router import site_of
    return dispatch.router_deploy(scope, site_of(tmp_path), ["http://192.0.2.2:8000"], "replicas", reach)


@pytest.mark.parametrize(("command", "run", "profile"), [("patch", _patch, "glm5-nvfp4+fusion-sm120"),
                                                         ("tune", _tune, "glm5-nvfp4"),
                                                         ("router.deploy", _router, None)])
def test_a_failing_pre_deploy_hook_stops_patch_tune_and_router_deploy_before_any_host_is_touched(
        tmp_path: Path, command: str, run: Any, profile: str | None) -> None:
    """Input tried: `patch-fusion --enable --profile glm5-nvfp4`, `tune --vary ...` and `router.deploy` with a
    pre-deploy hook that exits 3 (failed before: none of them ran the project's hooks, so a change freeze the hook
    enforces did not hold for them)."""
    _hook(tmp_path, "pre-deploy", ENV_DUMP + "echo 'change freeze'; exit 3\n")
    remote, connected = FakeRemote(), []
    scope, reach, _ = one_host(remote, None, tmp_path, connected)
    with pytest.raises(PreflightError, match=f"{command} stopped before any host changed") as stopped:
        run(scope, reach, tmp_path)
    assert "| change freeze" in stopped.value.message and stopped.value.exit_code == 3
    assert remote.batches == [], "nothing was sent to the host"
    # the patch reads the host's profile for its question when none is given: connected, nothing sent yet
    assert connected == (scope.names if command == "patch" else []), "tune and router.deploy do not even connect"
    told = seen(tmp_path, "pre-deploy")
    assert (told["SGLANG_DEPLOY_COMMAND"], told.get("SGLANG_DEPLOY_PROFILE")) == (command, profile)


@pytest.mark.parametrize("keep", ["winner", "none"])
def test_a_sweep_runs_the_deploy_hooks_and_tells_the_webhook_of_the_winner_it_kept(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]], keep: str) -> None:
    """Input tried: `tune` over three max_running_requests values, the fastest kept (a new release serves), and
    with `keep: none` (the release from before serves again: nothing changed that anyone must hear of)."""
    from helpers.tune_loop import BASE, MRR, a_sweep_host, request
    url, handler = receiver
    for event in ("pre-deploy", "post-deploy"):
        _hook(tmp_path, event, ENV_DUMP)
    scope, reach, _ = one_host(a_sweep_host(*MRR), url, tmp_path)
    report = dispatch.tune(scope, BASE, request(*MRR, keep=keep), reach)
    assert seen(tmp_path, "pre-deploy")["SGLANG_DEPLOY_COMMAND"] == "tune"
    after = seen(tmp_path, "post-deploy")
    serving = getattr(report, "serving", None)
    kept = keep == "winner"
    assert (after["SGLANG_DEPLOY_COMMAND"], after["SGLANG_DEPLOY_PROFILE"], after["SGLANG_DEPLOY_RELEASE"],
            after["SGLANG_DEPLOY_PREVIOUS"], after["SGLANG_DEPLOY_OUTCOME"]) == (
        "tune", "glm5-nvfp4", serving, "B", "deployed" if kept else "unchanged")
    assert (serving != "B") is kept
    if kept:
        body, = handler.bodies
        assert (body["event"], body["host"], body["release"]) == ("deployed", scope.names[0], serving)
        assert body["message"] == f"deployed release {serving} (was B)"
    else:
        assert handler.bodies == []


def test_a_group_sweep_tells_each_hosts_webhook_of_the_winner_it_serves_now(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: `tune --group pair` over two replicas, the winner measured on a (the rollout leaves it
    "unchanged") and rolled out to b: both went from B to the winner, so both webhooks hear "deployed"."""
    from helpers.deploy_plan import PROJECT
    from helpers.tune_group import BASE, FOUR_CAPS, replica
    from helpers.tune_loop import a_sweep_host, request

    from deploy_lib.ops.tune_group import GroupTune
    url, handler = receiver
    _hook(tmp_path, "post-deploy", ENV_DUMP)
    hosts = {"a": a_sweep_host(*FOUR_CAPS), "b": a_sweep_host(*FOUR_CAPS)}
    scope = Scope(PROJECT.inventory(None), tuple(told(replica(name), url) for name in hosts), group="pair")
    reach = Reach(lambda found, prefixed: nullcontext(hosts[found.host.name]), lambda name: RecordingProgress(),
                  lambda question: None, {"PATH": "/usr/bin:/bin"}, project_root=tmp_path, notify_retry=FAST)
    result = dispatch.tune(scope, BASE, request(*FOUR_CAPS), reach)
    assert isinstance(result, GroupTune) and result.serving is not None
    winner = result.serving["a"]
    assert result.serving == {"a": winner, "b": winner} and winner != "B"
    assert [run.result.action for run in (result.rollout.runs if result.rollout else ()) if run.result] == [
        "unchanged", "deployed"]
    after = seen(tmp_path, "post-deploy")
    assert (after["SGLANG_DEPLOY_HOSTS"], after["SGLANG_DEPLOY_RELEASE"], after["SGLANG_DEPLOY_PREVIOUS"],
            after["SGLANG_DEPLOY_OUTCOME"]) == ("a,b", winner, "B", "deployed")
    assert sorted((body["host"], body["event"], body["release"]) for body in handler.bodies) == [
        ("a", "deployed", winner), ("b", "deployed", winner)]


def test_a_router_release_that_did_not_come_up_tells_the_webhook_it_was_rolled_back(
        tmp_path: Path, receiver: tuple[str, type[_Receiver]]) -> None:
    """Input tried: a router release whose unit fails at its start, restored to the one before (the router's own
    switch, ladder and restore: ops.router_deploy.activate_router) between router.deploy's hooks."""
    from helpers.rollback import DEAD, READY
    from helpers.router import RouterHost, router_releases, router_run

    from deploy_lib.errors import RouterFailed
    from deploy_lib.ops.notices import Announced
    from deploy_lib.ops.router import SERVICE
    from deploy_lib.ops.router_deploy import RouterOutcome, activate_router
    url, handler = receiver
    _hook(tmp_path, "post-rollback", ENV_DUMP)
    router_store, new, tags, old = router_releases(tmp_path, healthy_before=True)
    remote = RouterHost({new.id: DEAD, old: READY})
    scope, reach, _ = one_host(remote, url, tmp_path)

    def release() -> RouterOutcome:  # deploy_router's switch and verification, its venv and staging left out
        activate_router(router_run(remote), router_store, new, tags, [])
        return RouterOutcome(Action.deployed, new.id, old, ())
    with pytest.raises(RouterFailed):
        Announced("router.deploy", scope, SERVICE, reach).around_one(release, lambda done: done)
    after = seen(tmp_path, "post-rollback")
    assert (after["SGLANG_DEPLOY_COMMAND"], after["SGLANG_DEPLOY_RELEASE"], after["SGLANG_DEPLOY_PREVIOUS"]) == (
        "router.deploy", old, new.id)
    body, = handler.bodies
    assert (body["event"], body["service"], body["release"], body["serving"]) == ("rolled-back", SERVICE, new.id, old)
