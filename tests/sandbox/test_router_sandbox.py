"""Replicas behind SGLang's own router (issue 15 point 4) on sandbox guests: the real sglang-router 0.3.2 wheel
deployed by the tool as its own unit and release on the guest the inventory names, the replicas' URLs rendered from
the group, and a rolling deploy of the replicas taking each out of the router before its restart and back after,
while a client sends requests through the router: none fails."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers.guest_group import STORE, GuestGroup, booted_group
from helpers.http_client import http
from helpers.json_doc import by_host, result

from deploy_lib.commands.releases import list_releases
from deploy_lib.deploy.project import resolve_target
from deploy_lib.inventory.model import load_inventory
from deploy_lib.metrics.router_counters import FAILED_FIGURE, ROUTED_FIGURE
from deploy_lib.remote import FabricRemote
from deploy_lib.store.facts import parse_history
from sandbox import manage
from sandbox.traffic import Client

pytestmark = pytest.mark.sandbox
PORT = manage.ROUTER_PORT
T = TypeVar("T")
PROFILES = {f"replica-{n}": f"extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '{n}'\n" for n in (3, 5)} | {
    "replica-8001": "extends: glm5-nvfp4\nserver:\n  port: 8001\n"}


class Replicas(GuestGroup):
    fault_path = "/etc/sglang-sim/fault-router"  # no test here sets a fault

    def baseline(self) -> list[str]:
        """Every guest on the reference profile's release; each guest's release id."""
        code, report, stderr = self.deploy("glm5-nvfp4")
        assert code == 0, stderr
        return self.releases(report)

    def releases(self, report: dict[str, Any]) -> list[str]:
        return [by_host(report)[name]["release"] for name in self.names]


@pytest.fixture(scope="module")
def replicas(venv_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Two guests of this module's own in group `sandbox`, whose vars name the first as the router's host; the
    router's venv comes from a wheelhouse of sglang-router's lock (the guests have no internet)."""
    with booted_group(Replicas, "r", 2, PROFILES, venv_layer, tmp_path_factory) as group:
        Path(group.inventory).write_text(manage.inventory_text(group.guests, router=group.guests[0].name))
        yield group


def router_urls(fleet: Replicas) -> list[tuple[str, bool]]:
    """The workers the router lists, read from its own API (GET /workers)."""
    status, body = http(f"http://{fleet.guests[0].guest_ip}:{PORT}/workers")
    assert status == 200, body
    return sorted((worker["url"], worker["is_healthy"]) for worker in json.loads(body)["workers"])


def deploy_router(fleet: Replicas) -> tuple[int, dict, str]:
    return fleet.invoke("router.deploy", "--profile", str(fleet.root / "inventory" / "profiles" / "glm5-nvfp4.yaml"))


def no_request_fails(fleet: Replicas, action: Callable[[], T]) -> T:
    """`action()`'s result, run while a client sends requests through the router on four threads: some went through
    and none failed."""
    ended: list[T] = []
    traffic = Client(f"http://{fleet.guests[0].guest_ip}:{PORT}").during(lambda: ended.append(action()))
    sent = len(traffic.latencies + traffic.failures)
    assert traffic.failures == [], f"{len(traffic.failures)} failed of {sent}: {traffic.failures[:3]}; ended {ended}"
    assert traffic.latencies  # requests went through the router while the action ran
    return ended[0]


def test_a_rolling_deploy_behind_the_router_fails_no_client_request(replicas: Replicas) -> None:
    baseline = replicas.baseline()
    code, report, stderr = deploy_router(replicas)
    assert code == 0, stderr
    assert result(report)["action"] == "deployed"
    workers = [f"http://{guest.guest_ip}:8000" for guest in replicas.guests]
    assert result(report)["workers"] == workers
    router_host = replicas.guests[0]
    assert manage.run_on(router_host, "systemctl is-active sglang-router.service").strip() == "active"
    assert router_urls(replicas) == [(url, True) for url in sorted(workers)]

    code, report, stderr = no_request_fails(replicas, lambda: replicas.deploy("replica-3", "--serial", "1"))
    assert code == 0, stderr
    new = replicas.releases(report)
    assert not set(new) & set(baseline)
    for guest in replicas.guests:  # each host was taken out before its restart and added back after
        lines = [line for line in stderr.splitlines() if line.startswith(f"{guest.name} ")]
        assert any("router: drain" in line for line in lines) and any("router: add back" in line for line in lines)
    assert router_urls(replicas) == [(url, True) for url in sorted(workers)]
    for guest in replicas.guests:  # what the router's clients saw while each was out and back: reported and kept
        clients = by_host(report)[guest.name]["clients"]
        assert clients["requests"] > 0 and clients["failed"] == 0, clients
        entries, _ = parse_history(manage.run_on(guest, f"cat {STORE}/history.jsonl"))
        [seen] = [entry for entry in entries
                  if entry.event == "router" and entry.tags.release == by_host(report)[guest.name]["release"]]
        assert seen.outcome == "healthy"
        assert seen.figures == {ROUTED_FIGURE: clients["requests"], FAILED_FIGURE: 0}


def test_a_stopped_router_is_restarted_by_a_router_deploy_and_replicas_deploy_meanwhile(replicas: Replicas) -> None:
    code, report, stderr = deploy_router(replicas)
    assert code == 0, stderr
    assert result(report)["action"] == "unchanged"
    manage.run_on(replicas.guests[0], "systemctl stop sglang-router.service")
    code, report, stderr = replicas.deploy("replica-5", "--serial", "1")
    assert code == 0, stderr  # a router that is down routes nothing: the replicas restart without draining
    assert stderr.count("nothing listens on") == 2
    code, report, stderr = deploy_router(replicas)
    assert code == 0, stderr
    assert result(report)["action"] == "deployed"  # the same release, restarted and verified
    router_target = resolve_target(load_inventory(Path(replicas.inventory)), replicas.guests[0].name)
    with FabricRemote(router_target.ssh) as remote:  # its store reads as a server's (`releases -s sglang-router`)
        rows = list_releases(router_target, "sglang-router", remote)
    assert [(row.id, row.outcome) for row in rows] == [(result(report)["release_id"], "healthy")]
    assert router_urls(replicas) == sorted((f"http://{guest.guest_ip}:8000", True) for guest in replicas.guests)


def test_a_rolling_rollback_behind_the_router_drains_each_replica_and_fails_no_client_request(
        replicas: Replicas) -> None:
    baseline = replicas.baseline()
    code, report, stderr = deploy_router(replicas)
    assert code == 0, stderr
    code, report, stderr = replicas.deploy("replica-5", "--serial", "1")
    assert code == 0, stderr
    code, report, stderr = no_request_fails(replicas, lambda: replicas.invoke("rollback", "--serial", "1"))
    assert code == 0, stderr
    assert replicas.releases(report) == baseline  # back on the last healthy release before replica-5's
    for guest in replicas.guests:  # each host was taken out before its restart and added back after
        lines = [line for line in stderr.splitlines() if line.startswith(f"{guest.name} ")]
        assert any("router: drain" in line for line in lines) and any("router: add back" in line for line in lines)
    assert router_urls(replicas) == sorted((f"http://{guest.guest_ip}:8000", True) for guest in replicas.guests)


def drained_and_added_back(stderr: str, guest_name: str | None = None) -> bool:
    """The progress (of `guest_name`'s lines in a group run) shows the replica taken out and added back."""
    lines = [line for line in stderr.splitlines() if guest_name is None or line.startswith(f"{guest_name} ")]
    return any("router: drain" in line for line in lines) and any("router: add back" in line for line in lines)


def test_one_replica_deployed_and_rolled_back_by_host_onto_another_port_is_drained_and_fails_no_request(
        replicas: Replicas) -> None:
    """`deploy --host` and `rollback --host` of one replica drain it as a group deploy does, each time from the URL
    the router routes to then: the deploy moves the server to port 8001, the rollback back to 8000."""
    baseline = replicas.baseline()
    code, _, stderr = deploy_router(replicas)
    assert code == 0, stderr
    router_host, moved = replicas.guests
    steady = f"http://{router_host.guest_ip}:8000"
    [(deployed, deploy_report, deploy_err), (rolled, rollback_report, rollback_err)] = no_request_fails(
        replicas, lambda: [replicas.deploy("replica-8001", host=moved.name),
                           replicas.invoke("rollback", host=moved.name)])
    assert deployed == 0, deploy_err
    assert rolled == 0, rollback_err
    assert result(deploy_report)["outcome"] == "deployed"
    assert drained_and_added_back(deploy_err) and drained_and_added_back(rollback_err)
    assert f"from http://{moved.guest_ip}:8000 to http://{moved.guest_ip}:8001" in deploy_err
    assert f"from http://{moved.guest_ip}:8001 to http://{moved.guest_ip}:8000" in rollback_err
    assert result(rollback_report)["outcome"] == "rolled back" and result(rollback_report)["release"] == baseline[1]
    assert router_urls(replicas) == sorted([(steady, True), (f"http://{moved.guest_ip}:8000", True)])


def test_a_group_deploy_behind_the_router_without_serial_goes_one_replica_at_a_time(replicas: Replicas) -> None:
    replicas.baseline()
    code, report, stderr = deploy_router(replicas)
    assert code == 0, stderr
    code, report, stderr = no_request_fails(replicas, lambda: replicas.deploy("replica-3"))
    assert code == 0, stderr
    assert "restart one at a time (--serial 1)" in stderr
    assert report["rollout"]["batches"] == [[name] for name in replicas.names]
    assert all(drained_and_added_back(stderr, guest.name) for guest in replicas.guests)


def test_restart_stop_and_start_of_one_replica_by_host_fail_no_request_and_the_stopped_one_stays_out(
        replicas: Replicas) -> None:
    replicas.baseline()
    code, _, stderr = deploy_router(replicas)
    assert code == 0, stderr
    router_host, other = replicas.guests
    ended: dict[str, tuple[int, dict, str]] = {}
    out_while_stopped: list[list[tuple[str, bool]]] = []

    def restart_stop_start() -> None:
        for command in ("restart", "stop"):
            ended[command] = replicas.invoke(command, host=other.name)
        out_while_stopped.append(router_urls(replicas))
        ended["start"] = replicas.invoke("start", host=other.name)
    no_request_fails(replicas, restart_stop_start)
    for command, (code, _, output) in ended.items():
        assert code == 0, f"{command}: {output}"
    assert drained_and_added_back(ended["restart"][2]) and drained_and_added_back(ended["start"][2])
    assert "router: drain" in ended["stop"][2] and "stays out of the router" in ended["stop"][2]
    assert out_while_stopped == [[(f"http://{router_host.guest_ip}:8000", True)]]
    assert router_urls(replicas) == sorted((f"http://{guest.guest_ip}:8000", True) for guest in replicas.guests)


def test_a_gpu_check_stopping_one_replica_drains_it_first_and_adds_it_back_after(replicas: Replicas) -> None:
    """`gpu-check --stop-server --host H`: the all-reduce needs the GPUs, so the server stops for it; the replica is
    taken out of the router first and added back once the release serves again. The guest's venv has no torch, so
    the check reports it cannot run the all-reduce (exit 3, docs/gpu-check.md) and the release restarts anyway."""
    baseline = replicas.baseline()
    code, _, stderr = deploy_router(replicas)
    assert code == 0, stderr
    checked = replicas.guests[1]
    code, report, stderr = no_request_fails(replicas, lambda: replicas.invoke("gpu-check", "--stop-server",
                                                                              host=checked.name))
    assert code == 3, stderr
    assert result(report)["check"]["error"].startswith("needs torch with CUDA"), report
    assert drained_and_added_back(stderr)
    # out before the check (the server stops just before it: unit test), back after the restart's readiness
    assert stderr.index("router: drain") < stderr.index("▸ topology") < stderr.index("readiness: health") \
        < stderr.index("router: add back")
    assert replicas.current(checked) == baseline[1]
    assert router_urls(replicas) == sorted((f"http://{guest.guest_ip}:8000", True) for guest in replicas.guests)


def test_an_uninstalled_replica_is_drained_first_and_removed_from_the_router(replicas: Replicas) -> None:
    """`uninstall --host H` of a replica: taken out of the router before its unit stops, and left out (its server is
    gone). Last in the module: the guest it uninstalls serves nothing after it."""
    replicas.baseline()
    code, _, stderr = deploy_router(replicas)
    assert code == 0, stderr
    router_host, removed = replicas.guests
    code, _, output = no_request_fails(replicas, lambda: replicas.invoke("uninstall", host=removed.name))
    assert code == 0, output
    assert "router: drain" in output and "router: add back" not in output
    assert f"http://{removed.guest_ip}:8000 is removed from the router on {router_host.name}" in output
    assert router_urls(replicas) == [(f"http://{router_host.guest_ip}:8000", True)]
