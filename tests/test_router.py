"""Replicas behind SGLang's router (issue 15 point 4), no SSH: the router chosen in the inventory, its release, the
drain/add-back calls around a replica's restart, and the deploy engine calling the drain before the server stops."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from dataclasses import replace as replaced
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath

import pytest
from helpers.deploy_plan import NOW, PROJECT, facts, first_plan, target
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.rollback import READY, ScriptedHost
from helpers.router import (
    GROUP,
    RouterHost,
    StoppableHost,
    answering,
    config_of,
    inventory,
    router_releases,
    router_run,
    site_of,
)
from helpers.systemd_syntax import exec_start_argv, parse_unit_file
from rich.console import Console

import deploy_lib.host_scripts.router
from deploy_cli import present
from deploy_cli.present import outcome_json
from deploy_lib import store
from deploy_lib.deploy.plan import plan_deploy, switch_batches
from deploy_lib.deploy.project import Project, resolve_group
from deploy_lib.errors import ConfigError, LockHeld, PreflightError, ReadinessFailed, RollbackFailed, RouterFailed
from deploy_lib.facts import host as host_facts
from deploy_lib.host.switch import Transition
from deploy_lib.inventory.model import HostVars, RouterPolicy, load_inventory
from deploy_lib.metrics.router_counters import COUNTED, ClientsSaw, RouterCounters, clients_saw, parse_counters
from deploy_lib.ops.fleet import Rollout
from deploy_lib.ops.router import (
    DEFAULT_LOCK,
    ROUTER_VERSION,
    RouterMembership,
    admit_workers,
    build_router_release,
    replica_urls,
    router_site,
    worker_url,
)
from deploy_lib.ops.router_deploy import RouterFront, behind_router, one_at_a_time, router_in_front
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import StoreLayout


def test_the_group_vars_name_the_router_host_port_and_policy_and_its_venv_comes_from_the_bundled_lock(
        tmp_path: Path) -> None:
    site = site_of(tmp_path)
    assert (site.host.name, site.port, site.policy) == ("edge", 31000, RouterPolicy.round_robin)
    assert site.lock == DEFAULT_LOCK and f"sglang_router=={ROUTER_VERSION} \\" in DEFAULT_LOCK.read_text()
    assert site.index == "https://pypi.org/simple" and site.wheelhouse is None
    with_house = site_of(tmp_path, ", router_wheelhouse: wheels, router_lock: my.lock")
    assert (with_house.wheelhouse, with_house.lock, with_house.index) == (tmp_path / "wheels", tmp_path / "my.lock",
                                                                          None)
    loaded = load_inventory(inventory(tmp_path))
    assert router_site(loaded, [loaded.hosts["edge"]]) is None  # a host without `router`: no router around it


def test_the_bundled_router_lock_covers_cpython_3_11_to_3_14_on_x86_64_and_aarch64() -> None:
    """Each compiled dependency pins one wheel per Python (4) and machine (2), sglang-router its two abi3 wheels;
    a lock regenerated for one host only would leave the others without a wheel (`router_lock` needed)."""
    from deploy_lib.venvs.lock import load_lock
    hashes = {requirement.name: len(requirement.hashes) for requirement in load_lock(DEFAULT_LOCK).requirements}
    assert hashes["sglang-router"] == 2
    compiled = ("aiohttp", "frozenlist", "multidict", "orjson", "propcache", "pydantic-core", "setproctitle", "yarl")
    assert {name: hashes[name] for name in compiled} == dict.fromkeys(compiled, 8)
    assert set(hashes.values()) == {1, 2, 8}  # pure-Python wheels: one for all


@pytest.mark.parametrize(("extra", "says"), [
    (", router_wheelhouse: w, router_index: 'https://example.org/simple'", "both set"),
])
def test_router_vars_that_cannot_both_hold_are_refused(tmp_path: Path, extra: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        site_of(tmp_path, extra)


def test_hosts_naming_different_routers_or_an_unknown_one_are_refused_naming_the_inventory(tmp_path: Path) -> None:
    loaded = load_inventory(inventory(tmp_path))
    with pytest.raises(ConfigError, match=r"different routers \(a: edge, edge: none\)"):
        router_site(loaded, [loaded.hosts["a"], loaded.hosts["edge"]])
    path = tmp_path / "unknown.yaml"
    path.write_text((GROUP % "").replace("router: edge", "router: nowhere"))
    unknown = load_inventory(path)
    with pytest.raises(ConfigError, match=f"{path}: router host 'nowhere' is not in the inventory"):
        router_site(unknown, unknown.group("replicas"))


def test_a_replica_url_is_the_hosts_inventory_address_and_its_profile_port(tmp_path: Path) -> None:
    loaded = load_inventory(inventory(tmp_path))
    assert [worker_url(host, 8000) for host in loaded.group("replicas")] == [
        "http://192.0.2.2:8000", "http://[2001:db8::3]:8000"]


def test_the_router_release_runs_launch_router_on_the_replicas_and_its_id_follows_what_it_serves(
        tmp_path: Path) -> None:
    site = site_of(tmp_path)
    layout = StoreLayout("sglang-router")
    venv = PurePosixPath("/opt/sglang-deploy/sglang-router/venvs/abc")
    workers = ["http://192.0.2.2:8000", "http://[2001:db8::3]:8000"]
    release = build_router_release(site, venv, "abc", workers, layout.env_file, "replicas")
    unit = parse_unit_file(release.unit_text)
    assert exec_start_argv(release.unit_text) == (
        f"{venv}/bin/python3", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", "31000",
        "--policy", "round_robin", "--worker-urls", *workers)
    assert unit.values("Service", "EnvironmentFile") == (str(layout.env_file(release.id)),)
    assert unit.values("Service", "User") == ("nobody",)
    assert release.metadata["router"]["workers"] == workers
    same = build_router_release(site, venv, "abc", workers, layout.env_file, "replicas")
    fewer = build_router_release(site, venv, "abc", workers[:1], layout.env_file, "replicas")
    other_venv = build_router_release(site, venv, "abd", workers, layout.env_file, "replicas")
    assert same.id == release.id and len({release.id, fewer.id, other_venv.id}) == 3


@pytest.mark.parametrize(("drained", "said"), [(3, "3 requests"), (1, "1 request")])
def test_a_replica_is_drained_once_before_its_restart_and_added_back_after(tmp_path: Path, drained: int,
                                                                           said: str) -> None:
    remote = answering(remove={"was_listed": True, "drained": drained, "elapsed_s": 0.4}, add={"elapsed_s": 0.2})
    progress = RecordingProgress()
    membership = RouterMembership(site_of(tmp_path), lambda: remote, lambda: "http://192.0.2.2:8000", progress)
    membership.before_restart()
    membership.before_restart()  # a rollback restarts again: the replica is out already
    membership.readmit()
    assert [(c["action"], c["worker"], c["router"]) for c in config_of(remote)] == [
        ("remove", "http://192.0.2.2:8000", "http://127.0.0.1:31000"),
        ("add", "http://192.0.2.2:8000", "http://127.0.0.1:31000")]
    assert f"router: {said} in flight on http://192.0.2.2:8000 finished first" in progress.of_kind("note")


def test_a_router_that_is_not_running_needs_no_drain_and_is_not_asked_again(tmp_path: Path) -> None:
    remote = answering(remove={"router_down": True, "elapsed_s": 0.01})
    progress = RecordingProgress()
    membership = RouterMembership(site_of(tmp_path), lambda: remote, lambda: "http://192.0.2.2:8000", progress)
    membership.before_restart()
    membership.readmit()
    assert [c["action"] for c in config_of(remote)] == ["remove"]
    assert "nothing listens on edge:31000" in progress.of_kind("note")[0]


def test_a_router_that_fails_to_take_the_replica_out_stops_its_deploy_with_the_routers_words(tmp_path: Path) -> None:
    remote = answering(remove={"error": "DELETE /workers/x answered 500: boom"})
    membership = RouterMembership(site_of(tmp_path), lambda: remote, lambda: "http://192.0.2.2:8000",
                                  RecordingProgress())
    with pytest.raises(RouterFailed, match=r"router on edge: taking http://192\.0\.2\.2:8000 out: DELETE") as caught:
        membership.before_restart()
    assert caught.value.exit_code == 10 and membership.taken_out is None


class _Connect:
    """Opens "connections" to the router's host: each is the one FakeRemote; counts how many were opened."""

    def __init__(self, remote: FakeRemote) -> None:
        self.remote, self.opened = remote, 0

    def __call__(self, target: object) -> _Connect:
        self.opened += 1
        return self

    def __enter__(self) -> FakeRemote:
        return self.remote

    def __exit__(self, *exc_info: object) -> None:
        pass


def front_of(tmp_path: Path, router: FakeRemote) -> RouterFront:
    """The router on `edge` in front of group `replicas`, as `deploy --group replicas` finds it."""
    loaded = load_inventory(inventory(tmp_path))
    front = router_in_front(loaded, resolve_group(loaded, "replicas"), False, _Connect(router))
    assert front is not None and front.target.host.name == "edge"
    return front


def replica(ports: list[int | None]) -> FakeRemote:
    """A replica's host whose current release serves on each of `ports` in turn (None: no release is current)."""
    remote = FakeRemote()
    for port in reversed(ports):  # the rule added last answers first
        if port is None:
            remote.reply("router: serving release", exit_code=1, times=1)
        else:
            remote.reply("router: serving release", stdout=json.dumps({"profile": {"server": {"port": port}}}),
                         times=1)
    return remote


def _around(tmp_path: Path, deploy_one: object, add: dict | None = None, ports: list[int | None] | None = None,
            ) -> tuple[FakeRemote, object]:
    router = answering(remove={"was_listed": True}, add=add or {})
    try:
        result: object = behind_router(front_of(tmp_path, router), target(), "sglang", replica(ports or [8000, 8000]),
                                       RecordingProgress(), deploy_one)  # type: ignore[arg-type]
    except Exception as error:
        result = error
    return router, result


def test_a_replica_rolled_back_to_a_healthy_release_goes_back_into_the_router(tmp_path: Path) -> None:
    def rolled_back(drain: object) -> None:
        drain()  # type: ignore[operator]
        failed = ReadinessFailed("a: release N failed; rolled back, release O is serving")
        failed.serving_id = "O"
        raise failed
    remote, result = _around(tmp_path, rolled_back)
    assert isinstance(result, ReadinessFailed)
    assert [c["action"] for c in config_of(remote)] == ["remove", "add"]


def test_a_replica_left_stopped_stays_out_of_the_router_and_the_error_says_so(tmp_path: Path) -> None:
    def stopped(drain: object) -> None:
        drain()  # type: ignore[operator]
        raise RollbackFailed("a: the rollback failed too; the unit is stopped")
    remote, result = _around(tmp_path, stopped)
    assert isinstance(result, RollbackFailed)
    assert "http://192.0.2.10:8000 is left out of the router on edge" in result.message
    assert [c["action"] for c in config_of(remote)] == ["remove"]


def test_a_replica_drained_then_refused_the_lock_goes_back_into_the_router_serving_as_before(tmp_path: Path) -> None:
    """A deploy that takes the host's lock with its first change (compare-and-set in the switch's round trip) can
    be refused after the drain: another command changed the store meanwhile, nothing was changed here."""
    def refused(drain: object) -> None:
        drain()  # type: ignore[operator]
        raise LockHeld("a: the release store on a changed after this command read it; nothing was changed")
    remote, result = _around(tmp_path, refused)
    assert isinstance(result, LockHeld) and "left out of the router" not in result.message
    assert [(c["action"], c["worker"]) for c in config_of(remote)] == [("remove", "http://192.0.2.10:8000"),
                                                                         ("add", "http://192.0.2.10:8000")]


def test_a_replica_whose_deploy_changed_nothing_before_its_restart_is_never_taken_out_nor_is_the_router_reached(
        tmp_path: Path) -> None:
    router = answering()
    front = front_of(tmp_path, router)
    replica_host = replica([8000])
    assert behind_router(front, target(), "sglang", replica_host, RecordingProgress(),
                         lambda drain: "unchanged") == "unchanged"
    assert config_of(router) == [] and front.connect.opened == 0  # type: ignore[attr-defined]
    assert replica_host.ran_names() == []  # nor is the replica's serving release read


def test_a_rollback_of_the_routers_own_release_on_a_replica_host_drains_no_replica(tmp_path: Path) -> None:
    """`rollback --host a -s sglang-router`: a's vars name the router, but the service is the router's own."""
    router = answering()
    front = front_of(tmp_path, router)
    replica_host = replica([8000])

    def restarted(drain: object) -> str:
        assert drain is None
        return "rolled back"
    assert behind_router(front, target(), "sglang-router", replica_host, RecordingProgress(), restarted) == \
        "rolled back"
    assert config_of(router) == [] and replica_host.ran_names() == []


@dataclass(frozen=True)
class Deployed:
    release_id: str


def deployed(drain: object) -> Deployed:
    """A deploy of release N that drains first, as the engine calls `before_restart`."""
    drain()  # type: ignore[operator]
    return Deployed("N")


def test_a_first_deploy_behind_a_router_drains_nothing_and_the_router_lists_the_new_server_after(
        tmp_path: Path) -> None:
    router, result = _around(tmp_path, deployed, ports=[None, 8000])
    assert result == Deployed("N")
    assert [(c["action"], c["worker"]) for c in config_of(router)] == [("add", "http://192.0.2.10:8000")]


def test_the_deploy_engine_drains_before_the_switch_and_restart_and_again_on_each_activation() -> None:
    """Transition.activate is where a deploy, its automatic rollback and a hand rollback switch and restart."""
    host = ScriptedHost({"A": [READY], "B": [READY]})
    drained_at: list[int] = []
    run = Transition(host, StoreLayout("sglang"), target(), RecordingProgress(), {}, grace_s=0,
               before_restart=lambda: drained_at.append(len(host.batches)))
    run.activate("A", first_plan()[1].release.metadata(), None, 0,
                 switch_batches(run.layout, "A", held=False, stop_timeout_s=120))
    switched_in = next(i for i, batch in enumerate(host.batches)
                       if any(getattr(step, "name", "") == "switch: temp link" for step in batch))
    assert drained_at == [switched_in]  # called when every batch before the switch had run, none after


def test_restart_and_stop_of_a_replica_call_the_routers_hook_before_the_server_stops() -> None:
    """`invoke restart --host H` drains before the switch and restart (and adds back after, as a deploy); `invoke stop
    --host H` drains before the unit stops."""
    from deploy_lib.commands.deploy import start, stop
    host = ScriptedHost({"A": [READY], "B": [READY]})
    drained_at: list[int] = []
    outcome = start(target(), "sglang", host, RecordingProgress(), {}, restart=True,
                    before_restart=lambda: drained_at.append(len(host.batches)))
    switched_in = next(i for i, batch in enumerate(host.batches)
                       if any(getattr(step, "name", "") == "switch: temp link" for step in batch))
    assert outcome.action == "restarted" and drained_at == [switched_in]
    stopped = ScriptedHost({"A": [READY], "B": [READY]})
    drained_at.clear()
    stop(target(), "sglang", stopped, before_stop=lambda: drained_at.append(len(stopped.batches)))
    stopped_in = next(i for i, batch in enumerate(stopped.batches)
                      if any("stop" in getattr(step, "argv", ()) for step in batch))
    assert len(drained_at) == 1 and drained_at[0] <= stopped_in  # before the stop's round trip (only reads between)


def test_a_stopped_replica_stays_out_of_the_router_until_it_is_started(tmp_path: Path) -> None:
    router = answering(remove={"was_listed": True})
    progress = RecordingProgress()

    def stopping(drain: object) -> str:
        drain()  # type: ignore[operator]
        return "stopped"
    assert behind_router(front_of(tmp_path, router), target(), "sglang", replica([8000]), progress, stopping,
                         leaves_out="stopped") == "stopped"
    assert [c["action"] for c in config_of(router)] == ["remove"]
    assert "http://192.0.2.10:8000 stays out of the router on edge until `invoke start`" in progress.of_kind("note")[0]


def test_a_router_in_front_of_servers_that_need_an_api_key_is_refused_naming_the_profile(tmp_path: Path) -> None:
    (tmp_path / "inventory" / "profiles").mkdir(parents=True)
    keyed = tmp_path / "inventory" / "profiles" / "keyed.yaml"
    keyed.write_text("extends: glm5-nvfp4\nserver:\n  api_key: {env: MY_KEY}\n")
    reference = PROJECT.profiles_dir / "glm5-nvfp4.yaml"
    (tmp_path / "inventory" / "profiles" / reference.name).write_text(reference.read_text())
    loaded = load_inventory(inventory(tmp_path))
    targets = resolve_group(loaded, "replicas")
    project = Project(tmp_path)
    assert replica_urls(project, "glm5-nvfp4", loaded, targets) == ["http://192.0.2.2:8000",
                                                                   "http://[2001:db8::3]:8000"]
    with pytest.raises(ConfigError, match=f"{keyed}: server.api_key is set: the router in front of a cannot"):
        replica_urls(project, "keyed", loaded, targets)


def test_a_replica_the_router_will_not_take_back_fails_its_deploy_saying_it_serves_the_new_release(
        tmp_path: Path) -> None:
    remote, result = _around(tmp_path, deployed, add={"error": "the router did not list it as a healthy worker"})
    assert isinstance(result, RouterFailed) and result.serving_id == "N"
    assert [c["action"] for c in config_of(remote)] == ["remove", "add"]
    assert "adding http://192.0.2.10:8000 back" in result.message


class PortedHost(ScriptedHost):
    """ScriptedHost (releases A and B, B current) whose release B serves on port 8001, A on 8000; the record of the
    release `current` points to is read as the host would read it at that moment."""

    def __init__(self) -> None:
        super().__init__({"A": [READY], "B": [READY]})
        self.metadata = {}
        for rule in self._rules:  # the release.json files the store facts read: B's port changed
            if rule.matches(Step(store.FACT_RELEASE_FILES, ("true",))):
                lines = []
                for line in rule.stdout.splitlines():
                    path, text = line.split("\0")
                    data = json.loads(text)
                    if path.endswith("/B/release.json"):
                        data["profile"]["server"]["port"] = 8001
                    self.metadata[data["id"]] = data
                    lines.append(f"{path}\0{json.dumps(data)}\n")
                rule.stdout = "".join(lines)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        if batch and batch[0].name == "router: serving release":
            self.reply("router: serving release", stdout=json.dumps(self.metadata[self.current]), times=1)
        return super().run(batch, on_output)


def test_a_rollback_behind_a_router_drains_the_port_it_routes_to_now_and_readmits_the_release_it_went_back_to(
        tmp_path: Path) -> None:
    """`invoke rollback --group G` (and `--host H`) on a replica: B serves on 8001, the rollback goes back to A on
    8000. Failed before the fix: the drain took out the target's URL (:8000), so the router kept sending requests to
    the server being stopped (:8001)."""
    from deploy_lib.commands.deploy import rollback
    host = PortedHost()
    router = answering(remove={"was_listed": True, "drained": 2}, add={})
    serving_at_drain: list[str] = []

    def drain_then(drain: object) -> object:
        def before_restart() -> None:
            serving_at_drain.append(host.current)
            drain()  # type: ignore[operator]
        return rollback(target(), "sglang", host, RecordingProgress(), "A", {}, grace_s=0,
                        before_restart=before_restart)
    progress = RecordingProgress()
    outcome = behind_router(front_of(tmp_path, router), target(), "sglang", host, progress, drain_then)
    assert outcome.action == "rolled back" and host.current == "A" and outcome.ready is not None
    assert serving_at_drain == ["B"]  # out of the router while B still served, before the switch
    assert [(c["action"], c["worker"]) for c in config_of(router)] == [("remove", "http://192.0.2.10:8001"),
                                                                         ("add", "http://192.0.2.10:8000")]
    [moved] = [note for note in progress.of_kind("note") if "moved" in note]
    assert "from http://192.0.2.10:8001 to http://192.0.2.10:8000" in moved and "router.deploy" in moved


def test_a_host_behind_a_router_finds_it_alone_and_a_host_without_one_loads_no_router(tmp_path: Path) -> None:
    """`deploy --host a` / `rollback --host a` of one replica: the router its group names is found for it alone."""
    loaded = load_inventory(inventory(tmp_path))
    [alone] = [t for t in resolve_group(loaded, "replicas") if t.host.name == "a"]
    front = router_in_front(loaded, [alone], False, _Connect(answering()))
    assert front is not None and (front.site.host.name, front.site.port) == ("edge", 31000)
    assert router_in_front(loaded, resolve_group(loaded, "ungrouped"), False, _Connect(answering())) is None


@pytest.mark.parametrize(("serial", "batches"), [
    ((), [["a"], ["b"]]),                 # no --serial behind a router: one replica at a time
    (("2",), [["a", "b"]]),               # a --serial given is kept, even one taking every replica
    (("50%",), [["a"], ["b"]]),
])
def test_a_group_behind_a_router_restarts_one_replica_at_a_time_unless_serial_says_otherwise(
        tmp_path: Path, serial: tuple[str, ...], batches: list[list[str]]) -> None:
    front = front_of(tmp_path, answering())
    progress = RecordingProgress()
    rollout = one_at_a_time(front, Rollout.parse(serial), progress)
    assert rollout.batches(["a", "b"]) == batches
    assert bool(progress.of_kind("note")) == (not serial)
    if not serial:
        assert "one at a time (--serial 1)" in progress.of_kind("note")[0]
    assert one_at_a_time(None, Rollout.parse(()), progress).batches(["a", "b"]) == [["a", "b"]]


def test_a_gpu_check_that_stops_a_replica_drains_it_first_and_adds_it_back_once_it_serves_again(
        tmp_path: Path) -> None:
    """`invoke gpu-check --stop-server --host H` of a replica: taken out before its server stops for the check, added
    back once the current release serves again (failed before: the check stopped the server with the replica still
    in the router)."""
    from deploy_lib.commands.gpu_check import run_gpu_check
    host = StoppableHost({"A": [READY], "B": [READY]})
    router = answering(remove={"was_listed": True, "drained": 1}, add={})
    stops_before_drain: list[int] = []

    def checked(drain: object) -> object:
        def before_stop() -> None:
            stops_before_drain.append(host.ran_names().count("systemd: stop"))
            drain()  # type: ignore[operator]
        return run_gpu_check(target(), "sglang", host, RecordingProgress(), None, True, {}, before_stop=before_stop)
    behind_router(front_of(tmp_path, router), target(), "sglang", host, RecordingProgress(), checked)
    assert stops_before_drain == [0]
    assert "systemd: stop" in host.ran_names() and host.history()[-1][:2] == ("start", "healthy")
    assert [c["action"] for c in config_of(router)] == ["remove", "add"]


def test_a_gpu_check_that_fails_after_the_stop_restarts_the_replica_and_puts_it_back_into_the_router(
        tmp_path: Path) -> None:
    """The all-reduce's round trip is lost: the check fails, the release is started again and serves, so the replica
    goes back into the router and the error does not call it left out."""
    from deploy_lib.commands.gpu_check import run_gpu_check
    from deploy_lib.errors import ConnectFailed
    host = StoppableHost({"A": [READY], "B": [READY]})
    host.reply("all-reduce check", raises=ConnectFailed("the connection to a was lost during the all-reduce check"))
    router = answering(remove={"was_listed": True}, add={})
    with pytest.raises(ConnectFailed) as failed:
        behind_router(front_of(tmp_path, router), target(), "sglang", host, RecordingProgress(),
                      lambda drain: run_gpu_check(target(), "sglang", host, RecordingProgress(), None, True, {},
                                                  before_stop=drain))
    assert host.history()[-1][:2] == ("start", "healthy")
    assert failed.value.serving_id == "B" and "left out of the router" not in failed.value.message
    assert [c["action"] for c in config_of(router)] == ["remove", "add"]


def installed_replica(unit_link: str) -> FakeRemote:
    """A replica's host with release r1 current and serving, its unit file at `unit_link`."""
    layout = StoreLayout("sglang")
    metadata = {"id": "r1", "tags": {}, "profile": {"server": {"port": 8000}}}
    return (FakeRemote()
            .reply(store.FACT_LOCK, exit_code=1)
            .reply(store.FACT_CURRENT, stdout="releases/r1\n")
            .reply(store.FACT_RELEASE_DIRS, stdout="r1\0r1/release.json\0")
            .reply(store.FACT_RELEASE_FILES, stdout=f"{layout.releases}/r1/release.json\0{json.dumps(metadata)}\n")
            .reply("router: serving release", stdout=json.dumps(metadata))
            .reply(host_facts.FACT_UNIT, stdout="ActiveState=active\nSubState=running\nLoadState=loaded\n")
            .reply(host_facts.FACT_UNIT_LINK, stdout=unit_link + "\n"))


def test_an_uninstalled_replica_is_drained_under_the_lock_before_its_unit_stops_and_removed_from_the_router(
        tmp_path: Path) -> None:
    """`invoke uninstall --host H` of a replica (failed before: the unit stopped with the replica still in the
    router): the replica is gone, so it is not added back, and a note says the router's own release still names it."""
    from deploy_lib.commands.uninstall import uninstall
    host = installed_replica(f"{StoreLayout('sglang').current}/sglang.service")
    router = answering(remove={"was_listed": True, "drained": 2})
    progress = RecordingProgress()
    ran_at_drain: list[list[str]] = []

    def removed(drain: object) -> object:
        def before_stop() -> None:
            ran_at_drain.append(host.ran_names())
            drain()  # type: ignore[operator]
        return uninstall(target(), "sglang", host, tmp_path / "state", before_stop=before_stop)
    done = behind_router(front_of(tmp_path, router), target(), "sglang", host, progress, removed,
                         leaves_out="uninstalled")
    [at_drain] = ran_at_drain
    assert store.LOCK_TAKE in at_drain and "uninstall: stop" not in at_drain
    assert "uninstall: release store" in host.ran_names() and done.service == "sglang"  # type: ignore[attr-defined]
    assert [(c["action"], c["worker"]) for c in config_of(router)] == [("remove", "http://192.0.2.10:8000")]
    [note] = [note for note in progress.of_kind("note") if "uninstalled" in note]
    assert "http://192.0.2.10:8000 is removed from the router on edge" in note and "router.deploy" in note


def test_uninstalling_a_replica_whose_unit_the_tool_did_not_make_leaves_it_serving_in_the_router(
        tmp_path: Path) -> None:
    """The tool leaves a unit it did not make running, so that server still serves: the router is not touched."""
    from deploy_lib.commands.uninstall import uninstall
    host = installed_replica("/etc/systemd/system/hand-made.service")
    router = answering()
    front = front_of(tmp_path, router)
    behind_router(front, target(), "sglang", host, RecordingProgress(),
                  lambda drain: uninstall(target(), "sglang", host, tmp_path / "state", before_stop=drain),
                  leaves_out="uninstalled")
    assert config_of(router) == [] and front.connect.opened == 0  # type: ignore[attr-defined]


def test_an_uninstall_whose_drain_the_router_refuses_removes_nothing_and_releases_the_hosts_lock(
        tmp_path: Path) -> None:
    """The router answers an error to the removal: exit 10 with the router's words, the replica's unit and store
    stay as they were, and the host's lock is released (failed before: the lock was left held, so every later
    command on the host was refused until `invoke unlock`)."""
    from deploy_lib.commands.uninstall import uninstall
    host = installed_replica(f"{StoreLayout('sglang').current}/sglang.service")
    router = answering(remove={"error": "DELETE /workers/x answered 500: boom"})
    with pytest.raises(RouterFailed, match=r"taking http://192\.0\.2\.10:8000 out: DELETE"):
        behind_router(front_of(tmp_path, router), target(), "sglang", host, RecordingProgress(),
                      lambda drain: uninstall(target(), "sglang", host, tmp_path / "state", before_stop=drain),
                      leaves_out="uninstalled")
    names = host.ran_names()
    assert not any(name.startswith("uninstall: ") and name != "uninstall: read history" for name in names)
    assert names.index(store.LOCK_TAKE) < names.index("lock: release")


# ---------------------------------------------------------------------------------------------------------------
# The router's own release through the server's switch, ladder and restore (deploy/switch.Transition, issue 24)


def test_a_router_release_is_switched_and_verified_by_the_routers_own_readiness_probe(tmp_path: Path) -> None:
    """The ladder's probe for the router: its unit, its port and /health, no generation (it serves none itself)."""
    from deploy_lib.ops.router_deploy import activate_router
    router_store, new, tags, _ = router_releases(tmp_path, healthy_before=True)
    remote = RouterHost({new.id: READY})
    run = router_run(remote)
    activate_router(run, router_store, new, tags, [])
    assert remote.switches() == [new.id] and run.verified == new.id
    probes = [step.name for step in remote.ran if getattr(step, "name", "").startswith("readiness probe")]
    assert probes and set(probes) == {"readiness probe (health)"}
    assert "systemd: reset-failed" in [step.name for step in run.unsent], "sent with the healthy record"


def test_a_router_release_that_does_not_come_up_is_restored_to_its_last_healthy_one(tmp_path: Path) -> None:
    """Input tried: a new router release whose unit fails at its start (failed before: its own switch-back path, no
    grace window, no verification of the release switched back to through the same ladder, no rollback record)."""
    from helpers.rollback import DEAD

    from deploy_lib.ops.router_deploy import activate_router
    router_store, new, tags, old = router_releases(tmp_path, healthy_before=True)
    remote = RouterHost({new.id: DEAD, old: READY})
    with pytest.raises(RouterFailed, match=f"rolled back, release {old} is serving") as failed:
        activate_router(router_run(remote), router_store, new, tags, [])
    assert failed.value.exit_code == 10 and failed.value.serving_id == old and failed.value.release_id == new.id
    assert remote.switches() == [new.id, old]
    assert remote.history() == [("deploy", store.FAILED, new.id), ("rollback", store.HEALTHY, old)]


def test_a_router_release_that_fails_with_no_healthy_one_before_stops_the_router(tmp_path: Path) -> None:
    from helpers.rollback import DEAD

    from deploy_lib.ops.router_deploy import activate_router
    router_store, new, tags, old = router_releases(tmp_path, healthy_before=False)
    remote = RouterHost({new.id: DEAD, old: READY})
    with pytest.raises(RouterFailed, match="no earlier healthy release to roll back to, so the unit is stopped") as \
            failed:
        activate_router(router_run(remote), router_store, new, tags, [])
    assert failed.value.serving_id is None and remote.switches() == [new.id]
    assert "systemd: stop" in remote.ran_names()


class _FakeRouterAPI(BaseHTTPRequestHandler):
    """sglang-router 0.3.2's /workers routes on loopback: the router lists `listed` (all healthy); a POST lists its
    worker; the same server answers a worker's /health for the URLs in `serving`."""

    listed: list[str]
    posted: list[str]
    serving: set[int]

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            raw = str(getattr(self, "metrics", "")).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        elif self.path == "/workers":
            self._answer(200, {"workers": [{"id": url, "url": url, "is_healthy": True} for url in self.listed]})
        else:
            self._answer(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        url = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["url"]
        self.posted.append(url)
        self.listed.append(url)
        self._answer(202, {})


@pytest.fixture
def fake_router() -> Iterator[tuple[ThreadingHTTPServer, type[_FakeRouterAPI]]]:
    api = type("API", (_FakeRouterAPI,), {"listed": [], "posted": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, api
    server.shutdown()
    server.server_close()


def _refusing_url() -> str:
    """A loopback URL nothing listens on: a worker whose server is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _admit(router_url: str, workers: list[str], settle_s: float) -> dict:
    script = deploy_lib.host_scripts.router
    return dict(script.admit({"router": router_url, "workers": workers, "settle_s": settle_s},
                             time.monotonic() + 30))


def test_a_started_router_that_never_lists_a_serving_worker_gets_it_registered_and_a_down_one_is_reported(
        fake_router: tuple[ThreadingHTTPServer, type[_FakeRouterAPI]]) -> None:
    # sglang-router 0.3.2 answers /health before it lists its --worker-urls: a router deploy ended with one
    # replica missing from the router, though both served
    server, api = fake_router
    router = f"http://127.0.0.1:{server.server_address[1]}"
    serving, down = f"{router}/", _refusing_url()  # the fake answers a worker's /health on its own port
    answer = _admit(router, [serving, down], settle_s=0.2)
    assert answer == {"added": [serving], "not_serving": [down]}
    assert api.posted == [serving]


def test_a_worker_the_router_lists_by_itself_while_it_settles_is_not_registered_twice(
        fake_router: tuple[ThreadingHTTPServer, type[_FakeRouterAPI]]) -> None:
    server, api = fake_router
    router = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Timer(0.3, lambda: api.listed.append(router)).start()  # the router's own start-up registration
    assert _admit(router, [router], settle_s=20) == {"added": [], "not_serving": []}
    assert api.posted == []


def test_a_router_deploy_ends_with_the_workers_listed_and_notes_what_it_added_and_what_does_not_serve(
        tmp_path: Path) -> None:
    remote = answering(admit={"added": ["http://192.0.2.2:8000"], "not_serving": ["http://192.0.2.3:8000"],
                              "elapsed_s": 0.3})
    progress = RecordingProgress()
    workers = ["http://192.0.2.2:8000", "http://192.0.2.3:8000"]
    assert admit_workers(remote, site_of(tmp_path), workers, progress) == ("http://192.0.2.3:8000",)
    assert [(c["action"], c["workers"]) for c in config_of(remote)] == [("admit", workers)]
    notes = progress.of_kind("note")
    assert any("added it (POST /workers)" in str(note) and "192.0.2.2" in str(note) for note in notes)
    assert any("http://192.0.2.3:8000 does not answer /health" in str(note) for note in notes)


def test_a_router_that_stops_answering_while_its_workers_are_listed_fails_the_router_deploy(tmp_path: Path) -> None:
    remote = answering(admit={"router_down": True, "elapsed_s": 0.1})
    with pytest.raises(RouterFailed, match="stopped answering on port 31000") as caught:
        admit_workers(remote, site_of(tmp_path), ["http://192.0.2.2:8000"], RecordingProgress())
    assert caught.value.exit_code == 10
@pytest.mark.parametrize(("policy", "version", "refused"), [
    (RouterPolicy.power_of_two, "0.5.23", True), (RouterPolicy.power_of_two, "0.5.21", True),
    (RouterPolicy.power_of_two, "0.5.20", False), (RouterPolicy.power_of_two, "0.5.9", False),
    (RouterPolicy.round_robin, "0.5.23", False), (RouterPolicy.cache_aware, "0.5.23", False)])
def test_power_of_two_is_refused_at_plan_where_sglang_no_longer_serves_get_load(
        policy: RouterPolicy, version: str, refused: bool) -> None:
    """Issue 40: power_of_two was offered, but sglang-router 0.3.2 asks each worker for /get_load, which SGLang serves
    up to 0.5.20 (http_server.py) and not from 0.5.21 (the 0.5.21 to 0.5.23 wheels)."""
    base = target()
    behind = replaced(base, host=base.host.model_copy(update={
        "vars": HostVars(ansible_host="192.0.2.10", gpu_count=8, router="edge", router_policy=policy),
        "var_files": {"router_policy": Path("/inv/group_vars/replicas.yml")}}))
    host = facts()
    host = replaced(host, sglang=replaced(host.sglang, sglang_version=version))
    loaded = PROJECT.profile("glm5-nvfp4")
    if not refused:
        plan_deploy(loaded, behind, host, {}, False, NOW)
        return
    with pytest.raises(PreflightError) as refusal:
        plan_deploy(loaded, behind, host, {}, False, NOW)
    assert str(refusal.value).startswith(
        "/inv/group_vars/replicas.yml: host pve-gpu1: router_policy: power_of_two: the router asks each worker for "
        f"/get_load, which SGLang {version} does not serve (removed in 0.5.21): the router could not read the "
        "replicas' load")
    assert refusal.value.exit_code == 3 and "round_robin" in (refusal.value.hint or "")


# What the router's clients saw during a replica's switch: its counters, as sglang-router 0.3.2 writes them on its
# Prometheus port (captured from the real binary: one /generate with no worker, and the tool's own /workers calls).
ROUTER_METRICS = """\
# TYPE smg_http_requests_total counter
smg_http_requests_total{method="GET",path="/workers"} 1
smg_http_requests_total{method="POST",path="/generate"} 1
# TYPE smg_router_requests_total counter
smg_router_requests_total{router_type="http",backend_type="regular",connection_mode="http",model="default",\
endpoint="generate",streaming="false"} %d
# TYPE smg_http_responses_total counter
smg_http_responses_total{status_code="200",error_code=""} 2
smg_http_responses_total{status_code="503",error_code="no_available_workers"} %d
smg_http_responses_total{status_code="400",error_code=""} 1
"""


def test_the_routers_counters_give_the_requests_routed_and_the_5xx_answered_between_two_readings() -> None:
    """Only 5xx responses are failures: the 400 is a client's (or the tool's) own mistake."""
    before, after = parse_counters(ROUTER_METRICS % (100, 1)), parse_counters(ROUTER_METRICS % (160, 3))
    assert before == RouterCounters(100, 1)
    assert clients_saw(before, after) == ClientsSaw(60, 2)
    assert clients_saw(after, before) == "its counters went down in between (the router restarted)"
    assert clients_saw("its metrics were not read: refused", after) == "its metrics were not read: refused"
    assert parse_counters("") == RouterCounters(0, 0), "a counter not written yet has counted nothing"
    assert isinstance(parse_counters("smg_router_requests_total{ 5\n"), str)


def test_a_replica_out_of_the_router_and_back_says_what_its_clients_saw(tmp_path: Path) -> None:
    remote = answering(remove={"was_listed": True, "metrics": ROUTER_METRICS % (100, 1)},
                       add={"metrics": ROUTER_METRICS % (160, 1)})
    progress = RecordingProgress()
    membership = RouterMembership(site_of(tmp_path), lambda: remote, lambda: "http://192.0.2.2:8000", progress)
    membership.before_restart()
    membership.readmit()
    assert membership.clients == ClientsSaw(60, 0)
    assert "router: clients sent 60 requests while http://192.0.2.2:8000 was out and back; none failed" in \
        progress.of_kind("note")
    assert all(c["metrics"] == "http://127.0.0.1:29000/metrics" for c in config_of(remote))


def test_a_router_whose_metrics_cannot_be_read_leaves_what_clients_saw_unknown(tmp_path: Path) -> None:
    """Input tried: a router started with another --prometheus-port (nothing answers on 29000)."""
    remote = answering(remove={"was_listed": True, "metrics_error": "GET http://127.0.0.1:29000/metrics: refused"},
                       add={"metrics": ROUTER_METRICS % (160, 1)})
    progress = RecordingProgress()
    membership = RouterMembership(site_of(tmp_path), lambda: remote, lambda: "http://192.0.2.2:8000", progress)
    membership.before_restart()
    membership.readmit()
    assert membership.clients is None
    assert "router: what its clients saw while http://192.0.2.2:8000 was out is not known (its metrics were not " \
           "read: GET http://127.0.0.1:29000/metrics: refused)" in progress.of_kind("note")


def test_a_rollback_behind_a_router_records_what_clients_saw_in_its_outcome_and_the_replicas_history(
        tmp_path: Path) -> None:
    from deploy_lib.commands.deploy import rollback
    host = PortedHost()
    router = answering(remove={"was_listed": True, "metrics": ROUTER_METRICS % (100, 1)},
                       add={"metrics": ROUTER_METRICS % (130, 4)})
    outcome = behind_router(front_of(tmp_path, router), target(), "sglang", host, RecordingProgress(),
                            lambda drain: rollback(target(), "sglang", host, RecordingProgress(), "A", {}, grace_s=0,
                                                   before_restart=drain))  # type: ignore[arg-type]
    assert outcome.clients == ClientsSaw(30, 3)
    lines = [store.HistoryEntry.from_json((step.stdin or b"").decode()) for step in host.ran
             if isinstance(step, Step) and step.name == "history: append"]
    assert [(line.event, line.outcome, line.tags.release) for line in lines] == [
        ("rollback", "healthy", "A"), ("router", "failed", "A")], "written once A serves in the router again"
    assert lines[-1].figures == {"router.requests": 30.0, "router.failed": 3.0}
    assert outcome_json(outcome)["clients"] == {"requests": 30, "failed": 3}


def test_the_router_script_sends_back_only_the_counters_it_reads(
        fake_router: tuple[ThreadingHTTPServer, type[_FakeRouterAPI]]) -> None:
    server, api = fake_router
    api.metrics = ROUTER_METRICS % (7, 0)  # type: ignore[attr-defined]
    base = f"http://127.0.0.1:{server.server_address[1]}"
    script = deploy_lib.host_scripts.router
    read = script.counters({"metrics": base + "/metrics", "counted": list(COUNTED)})
    assert "smg_http_requests_total" not in read["metrics"]
    assert parse_counters(read["metrics"]) == RouterCounters(7, 0)
    refused = script.counters({"metrics": _refusing_url() + "/metrics", "counted": list(COUNTED)})
    assert set(refused) == {"metrics_error"} and "refused" in refused["metrics_error"].lower()


def test_a_rollout_behind_a_router_ends_with_what_its_clients_saw_summed_over_the_replicas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(present, "console", Console(file=out, width=300))
    present.print_clients([ClientsSaw(60, 0), None, ClientsSaw(40, 0)])
    present.print_clients([None])
    present.print_clients([ClientsSaw(10, 2)])
    assert out.getvalue().splitlines() == [
        "router: clients sent 100 requests through it while 2 replicas were out and back; none failed",
        "router: clients sent 10 requests through it while 1 replica was out and back; 2 failed (5xx)"]
