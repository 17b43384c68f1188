"""Groups as targets on three sandbox guests at once (issue 15): a parallel deploy, a failed host inside a batch,
--max-fail stopping a rollout, the host lock held on one host of the group. Driven through `invoke` as a user
types it, against an inventory whose group `sandbox` holds the three guests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.guest_group import STORE, GuestGroup, booted_group
from helpers.json_doc import by_host

from deploy_lib.deploy.project import resolve_target
from deploy_lib.host.store import host_lock
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = pytest.mark.sandbox
FAULT = "/etc/sglang-sim/fault-fleet"  # read by the fleet-* releases only
PROFILES = {f"fleet-{n}": f"extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '{n}'\n  SGLANG_SIM_FAULT: {FAULT}\n"
            for n in (3, 5, 6, 7)}


class Fleet(GuestGroup):
    fault_path = FAULT

    def history_length(self, guest: manage.Guest) -> int:
        return len(manage.run_on(guest, f"cat {STORE}/history.jsonl").splitlines())

    def baseline(self) -> list[str]:
        """Every guest on the reference profile's release, no fault; returns each guest's release id (a release's id
        covers the host's own settings: each guest has its own hub, so its own HF_ENDPOINT)."""
        for guest in self.guests:
            self.fault(guest, None)
        code, report, stderr = self.deploy("glm5-nvfp4")
        assert code == 0, stderr
        return [by_host(report)[name]["release"] for name in self.names]

    def releases(self, report: dict[str, Any]) -> list[str | None]:
        """The release each guest was taken to (or tried), in group order."""
        return [by_host(report)[name].get("release") for name in self.names]


@pytest.fixture(scope="module")
def fleet(venv_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three guests of this module's own in one inventory group."""
    with booted_group(Fleet, "f", 3, PROFILES, venv_layer, tmp_path_factory) as fleet:
        yield fleet


def test_a_group_deploy_reaches_every_guest_in_parallel_and_reports_each(fleet: Fleet) -> None:
    baseline = fleet.baseline()
    code, report, stderr = fleet.deploy("fleet-3")
    assert code == 0, stderr
    assert {host: part["outcome"] for host, part in by_host(report).items()} == dict.fromkeys(fleet.names, "deployed")
    new = fleet.releases(report)
    assert not set(new) & set(baseline)
    assert report["rollout"]["serving"] == {release: [name] for release, name in zip(new, fleet.names, strict=True)}
    assert [fleet.current(guest) for guest in fleet.guests] == new
    for name in fleet.names:  # each host's progress lines carry its name
        assert any(line.startswith(f"{name} ") and "readiness" in line for line in stderr.splitlines())


def test_a_failed_host_inside_a_batch_rolls_back_alone_while_the_others_deploy(fleet: Fleet) -> None:
    baseline = fleet.baseline()
    failing = fleet.guests[1]
    fleet.fault(failing, "oom")
    code, report, stderr = fleet.deploy("fleet-5")
    assert code == 6, stderr
    parts = by_host(report)
    assert [parts[name]["outcome"] for name in fleet.names] == ["deployed", "failed", "deployed"]
    assert parts[failing.name]["serving"] == baseline[1] and "rolled back" in parts[failing.name]["cause"]
    new = fleet.releases(report)
    assert [fleet.current(guest) for guest in fleet.guests] == [new[0], baseline[1], new[2]]
    assert manage.run_on(failing, "systemctl is-active sglang.service").strip() == "active"


def test_max_fail_stops_the_rollout_and_leaves_the_hosts_not_started_untouched(fleet: Fleet) -> None:
    baseline = fleet.baseline()
    fleet.fault(fleet.guests[0], "oom")
    untouched = {guest.name: fleet.history_length(guest) for guest in fleet.guests[1:]}
    code, report, stderr = fleet.deploy("fleet-6", "--serial", "1", "--max-fail", "0")
    assert code == 6, stderr
    assert report["rollout"]["batches"] == [[name] for name in fleet.names]
    assert report["rollout"]["not_started"] == fleet.names[1:]
    assert report["rollout"]["stopped"] == "1 host failed, more than --max-fail 0"
    assert report["rollout"]["serving"] == {baseline[0]: [fleet.names[0]], "untouched": fleet.names[1:]}
    assert [fleet.current(guest) for guest in fleet.guests] == baseline
    assert {guest.name: fleet.history_length(guest) for guest in fleet.guests[1:]} == untouched  # not connected to


def test_a_host_whose_lock_is_held_is_refused_and_the_others_proceed_within_max_fail(fleet: Fleet) -> None:
    baseline = fleet.baseline()
    locked = fleet.guests[0]
    target = resolve_target(load_inventory(Path(fleet.inventory)), locked.name)
    with FabricRemote(target.ssh) as remote, host_lock(remote, target.layout("sglang"), "test holds it", "pytest"):
        code, report, stderr = fleet.deploy("fleet-7", "--serial", "1", "--max-fail", "1")
    assert code == 4, stderr
    assert by_host(report)[locked.name]["error"] == "LockHeld" and "test holds it" in stderr
    new = fleet.releases(report)
    assert report["rollout"]["serving"] == {"as before": [locked.name], new[1]: [fleet.names[1]],
                                            new[2]: [fleet.names[2]]}
    assert [fleet.current(guest) for guest in fleet.guests] == [baseline[0], new[1], new[2]]



def test_a_dry_run_of_a_group_plans_each_host_and_changes_nothing(fleet: Fleet) -> None:
    baseline = fleet.baseline()
    histories = [fleet.history_length(guest) for guest in fleet.guests]
    code, report, stderr = fleet.deploy("fleet-3", "--dry-run")
    assert code == 0, stderr
    assert [by_host(report)[name]["outcome"] for name in fleet.names] == ["planned"] * 3
    assert all(by_host(report)[name]["changes"] for name in fleet.names)  # OMP_NUM_THREADS and the fault file
    assert report["rollout"]["serving"] == {release: [name]
                                            for release, name in zip(baseline, fleet.names, strict=True)}
    assert [fleet.current(guest) for guest in fleet.guests] == baseline
    assert [fleet.history_length(guest) for guest in fleet.guests] == histories
