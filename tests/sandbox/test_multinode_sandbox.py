"""Multi-node SGLang as one release on two sandbox guests (issue 15 point 3): the simulator's node 0 waits for node
rank 1 at --dist-init-addr over real TCP between the guests; a node that fails takes both nodes back to the previous
common release, and the error names that node. Driven through `invoke deploy --group` as a user types it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.guest_group import GuestGroup, booted_group
from helpers.json_doc import by_host

from sandbox import manage

pytestmark = pytest.mark.sandbox
FAULT = "/etc/sglang-sim/fault-multinode"  # read by the mn-faulty release only
TWO_NODES = "extends: glm5-nvfp4\nparallel:\n  tp: 8\n  nnodes: 2\n  dist_init_port: 5757\n"
PROFILES = {"mn": TWO_NODES,
            "mn-faulty": TWO_NODES + f"env:\n  OMP_NUM_THREADS: '5'\n  SGLANG_SIM_FAULT: {FAULT}\n"}


class Pair(GuestGroup):
    fault_path = FAULT

    def journal(self, guest: manage.Guest) -> str:
        return manage.run_on(guest, "journalctl -u sglang.service -o cat --no-pager")


@pytest.fixture(scope="module")
def pair(venv_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two guests of this module's own in one inventory group: node rank 0 and node rank 1, in that order."""
    with booted_group(Pair, "n", 2, PROFILES, venv_layer, tmp_path_factory) as pair:
        yield pair


def test_two_nodes_meet_at_node_0s_address_and_run_one_release(pair: Pair) -> None:
    code, report, stderr = pair.deploy("mn")
    assert code == 0, stderr
    parts = by_host(report)
    assert [parts[name]["outcome"] for name in pair.names] == ["deployed", "deployed"]
    release = parts[pair.names[0]]["release"]
    assert parts[pair.names[1]]["release"] == release  # one release id on both nodes
    assert [pair.current(guest) for guest in pair.guests] == [release, release]
    follower_log = pair.journal(pair.guests[1])
    assert "2 of 2 nodes joined (node rank 1)" in follower_log, follower_log
    assert "node rank 0 serves HTTP" in follower_log
    assert ":5757: 2 of 2 nodes joined (node rank 0)" in pair.journal(pair.guests[0])
    code, status, stderr = pair.invoke("status")
    assert code == 0, stderr
    assert by_host(status)[pair.names[0]]["readiness"] == "ready (health 200)"
    assert by_host(status)[pair.names[1]]["readiness"] == \
        "node rank 1 of 2: no HTTP here (node rank 0 serves it); unit active"
    code, report, stderr = pair.invoke("deploy", "--profile", str(pair.root / "inventory" / "profiles" /
                                                                  "mn-faulty.yaml"), "--dry-run")
    assert code == 0, stderr
    planned = [by_host(report)[name] for name in pair.names]
    assert [part["outcome"] for part in planned] == ["planned", "planned"]
    assert planned[0]["release"] == planned[1]["release"] != release
    assert [pair.current(guest) for guest in pair.guests] == [release, release]  # a dry run changes nothing
    code, report, stderr = pair.deploy("mn")  # the same profile on the same nodes: nothing to do
    assert code == 0, stderr
    assert [by_host(report)[name]["outcome"] for name in pair.names] == ["unchanged", "unchanged"]


def test_a_failing_node_takes_both_nodes_back_to_the_previous_release_and_is_named(pair: Pair) -> None:
    code, report, stderr = pair.deploy("mn")
    assert code == 0, stderr
    before = by_host(report)[pair.names[0]]["release"]
    pair.fault(pair.guests[1], "oom")
    try:
        code, report, stderr = pair.deploy("mn-faulty")
    finally:
        pair.fault(pair.guests[1], None)
    assert code == 6, stderr
    parts = by_host(report)
    assert [parts[name]["outcome"] for name in pair.names] == ["failed", "failed"]
    assert [parts[name]["serving"] for name in pair.names] == [before, before]
    cause = parts[pair.names[0]]["cause"]
    assert f"failed on {pair.names[1]} (node rank 1)" in cause and "out of memory" in cause, cause
    assert f"rolled back, release {before} is serving on every node" in cause
    assert "Watchdog caught collective operation timeout" in pair.journal(pair.guests[0])  # node 0: the symptom
    assert [pair.current(guest) for guest in pair.guests] == [before, before]
    for guest in pair.guests:
        assert manage.run_on(guest, "systemctl is-active sglang.service").strip() == "active"


def test_a_group_rollback_of_a_multi_node_release_switches_both_nodes_together(pair: Pair) -> None:
    code, report, stderr = pair.deploy("mn")
    assert code == 0, stderr
    before = by_host(report)[pair.names[0]]["release"]
    code, report, stderr = pair.deploy("mn-faulty")  # no fault written: a healthy second release
    assert code == 0, stderr
    after = by_host(report)[pair.names[0]]["release"]
    joined = pair.journal(pair.guests[1]).count("2 of 2 nodes joined (node rank 1)")
    code, report, stderr = pair.invoke("rollback")
    assert code == 0, stderr
    assert [by_host(report)[name]["outcome"] for name in pair.names] == ["rolled back", "rolled back"]
    assert [by_host(report)[name]["release"] for name in pair.names] == [before, before]
    assert [pair.current(guest) for guest in pair.guests] == [before, before] != [after, after]
    assert pair.journal(pair.guests[1]).count("2 of 2 nodes joined (node rank 1)") == joined + 1  # met node 0 again
