"""Multi-node SGLang as one release on two sandbox guests (issue 15 point 3): the simulator's node 0 waits for node
rank 1 at --dist-init-addr over real TCP between the guests; a node that fails takes both nodes back to the previous
common release, and the error names that node. Driven through `invoke deploy --group` as a user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from projects import project_for_guest

from sandbox import manage, names

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
FAULT = "/etc/sglang-sim/fault-multinode"  # read by the mn-faulty release only
STORE = "/opt/sglang-deploy/sglang"
TWO_NODES = "extends: glm5-nvfp4\nparallel:\n  tp: 8\n  nnodes: 2\n  dist_init_port: 5757\n"
PROFILES = {"mn": TWO_NODES,
            "mn-faulty": TWO_NODES + f"env:\n  OMP_NUM_THREADS: '5'\n  SGLANG_SIM_FAULT: {FAULT}\n"}


@dataclass
class Pair:
    guests: list[manage.Guest]
    root: Path
    inventory: str

    @property
    def names(self) -> list[str]:
        return [guest.name for guest in self.guests]

    def invoke(self, *argv: str) -> tuple[int, dict[str, Any], str]:
        """`invoke ARGV --group sandbox --json` (and `--yes` for a command that changes the hosts): exit code, the
        JSON document, stderr (progress, errors)."""
        environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")}
        consent = ("--yes",) if argv[0] in ("deploy", "rollback") else ()
        ran = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv, "-i", self.inventory,
                              "--group", names.GROUP, "--json", *consent],
                             capture_output=True, text=True, env=environ, cwd=self.root, timeout=900)
        return ran.returncode, json.loads(ran.stdout), ran.stderr

    def deploy(self, profile: str) -> tuple[int, dict[str, Any], str]:
        return self.invoke("deploy", "--profile", str(self.root / "inventory" / "profiles" / f"{profile}.yaml"))

    def current(self, guest: manage.Guest) -> str:
        return manage.run_on(guest, f"readlink {STORE}/current").strip().rsplit("/", 1)[-1]

    def journal(self, guest: manage.Guest) -> str:
        return manage.run_on(guest, "journalctl -u sglang.service -o cat --no-pager")


@pytest.fixture(scope="module")
def pair(venv_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two guests of this module's own in one inventory group: node rank 0 and node rank 1, in that order."""
    guest_names = [f"pt{os.getpid()}n{n}"[:12] for n in (1, 2)]
    guests: list[manage.Guest] = []
    try:
        for name in guest_names:
            guests.append(manage.up(name, record=False, layers=(venv_layer,)))
        root = tmp_path_factory.mktemp("multinode")
        _, inventory = project_for_guest(root, guests[0], PROFILES)
        Path(inventory).write_text(manage.inventory_text(guests))
        yield Pair(guests, root, inventory)
    finally:
        for name in guest_names:
            manage.down(name, record=False)


def test_two_nodes_meet_at_node_0s_address_and_run_one_release(pair: Pair) -> None:
    code, report, stderr = pair.deploy("mn")
    assert code == 0, stderr
    parts = report["hosts"]
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
    assert status[pair.names[0]]["readiness"] == "ready (health 200)"
    assert status[pair.names[1]]["readiness"] == \
        "node rank 1 of 2: no HTTP here (node rank 0 serves it); unit active"
    code, report, stderr = pair.invoke("deploy", "--profile", str(pair.root / "inventory" / "profiles" /
                                                                  "mn-faulty.yaml"), "--dry-run")
    assert code == 0, stderr
    planned = [report["hosts"][name] for name in pair.names]
    assert [part["outcome"] for part in planned] == ["planned", "planned"]
    assert planned[0]["release"] == planned[1]["release"] != release
    assert [pair.current(guest) for guest in pair.guests] == [release, release]  # a dry run changes nothing
    code, report, stderr = pair.deploy("mn")  # the same profile on the same nodes: nothing to do
    assert code == 0, stderr
    assert [report["hosts"][name]["outcome"] for name in pair.names] == ["unchanged", "unchanged"]


def test_a_failing_node_takes_both_nodes_back_to_the_previous_release_and_is_named(pair: Pair) -> None:
    code, report, stderr = pair.deploy("mn")
    assert code == 0, stderr
    before = report["hosts"][pair.names[0]]["release"]
    manage.run_on(pair.guests[1], f"mkdir -p /etc/sglang-sim && echo oom > {FAULT}")
    try:
        code, report, stderr = pair.deploy("mn-faulty")
    finally:
        manage.run_on(pair.guests[1], f"rm -f {FAULT}")
    assert code == 6, stderr
    parts = report["hosts"]
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
    before = report["hosts"][pair.names[0]]["release"]
    code, report, stderr = pair.deploy("mn-faulty")  # no fault written: a healthy second release
    assert code == 0, stderr
    after = report["hosts"][pair.names[0]]["release"]
    joined = pair.journal(pair.guests[1]).count("2 of 2 nodes joined (node rank 1)")
    code, report, stderr = pair.invoke("rollback")
    assert code == 0, stderr
    assert [report["hosts"][name]["outcome"] for name in pair.names] == ["rolled back", "rolled back"]
    assert [report["hosts"][name]["release"] for name in pair.names] == [before, before]
    assert [pair.current(guest) for guest in pair.guests] == [before, before] != [after, after]
    assert pair.journal(pair.guests[1]).count("2 of 2 nodes joined (node rank 1)") == joined + 1  # met node 0 again
