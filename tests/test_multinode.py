"""Multi-node SGLang as one release (pure): node ranks from the group, node 0's --dist-init-addr on every node,
the flags each node renders (checked against the real SGLang parsers), one release id for the whole group."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from pydantic import ValidationError

from deploy_lib.deploy.project import Target, resolve_group
from deploy_lib.errors import ConfigError, ReadinessFailed
from deploy_lib.facts.diagnose import Diagnosis
from deploy_lib.health.downtime import Downtime
from deploy_lib.host.switch import Transition
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.multinode import (
    dist_init_addr,
    group_release_id,
    group_release_id_over,
    plan_nodes,
    refuse_single_host,
)
from deploy_lib.ops.multinode_switch import Member, NodeFailed, activate, blamed, common_release, each, restore
from deploy_lib.profile import LoadedProfile, Profile, load_profile
from deploy_lib.release.argv_check import build_parser, check_argv, find_option
from deploy_lib.release.model import build_release
from deploy_lib.release.server_args import sglang_args
from deploy_lib.remote import Put, Step, StepResult
from deploy_lib.store import HEALTHY, HistoryEntry, ReleaseRecord, StoreFacts, StoreLayout, Tags, history_entry

pytest_plugins = ("helpers.wheelcache",)  # real_options
PROFILES = Path(__file__).resolve().parent.parent / "inventory" / "profiles"

NODES = """\
all:
  children:
    pair:
      hosts:
        n1: {ansible_host: 192.0.2.11}
        n2: {ansible_host: 192.0.2.12}
    ranked:
      hosts:
        r1: {ansible_host: 192.0.2.21, node_rank: 1}
        r0: {ansible_host: "2001:db8::20", node_rank: 0}
    half_ranked:
      hosts:
        h1: {ansible_host: 192.0.2.31, node_rank: 0}
        h2: {ansible_host: 192.0.2.32}
    same_rank:
      hosts:
        s1: {ansible_host: 192.0.2.41, node_rank: 1}
        s2: {ansible_host: 192.0.2.42, node_rank: 1}
    three:
      hosts:
        t1: {}
        t2: {}
        t3: {}
"""


def group(tmp_path: Path, name: str) -> list[Target]:
    path = tmp_path / "hosts.yaml"
    path.write_text(NODES)
    return resolve_group(load_inventory(path), name)


def two_nodes(**parallel: Any) -> LoadedProfile:
    """The reference profile (TP8) over two nodes of four GPUs each."""
    loaded = load_profile(PROFILES, "glm5-nvfp4")
    data = loaded.profile.model_dump(mode="json")
    data["parallel"] = {**data["parallel"], "nnodes": 2, **parallel}
    return loaded.model_copy(update={"profile": Profile.model_validate(data)})


def test_node_ranks_follow_the_groups_order_and_every_node_dials_node_0(tmp_path: Path) -> None:
    nodes = plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, "pair"), "pair")
    assert [(node.rank, node.name) for node in nodes] == [(0, "n1"), (1, "n2")]
    rendered = [" ".join(sglang_args(node.loaded.profile, "0.5.23")) for node in nodes]
    assert "--tp-size 8 --nnodes 2 --node-rank 0 --dist-init-addr 192.0.2.11:5757" in rendered[0]
    assert "--tp-size 8 --nnodes 2 --node-rank 1 --dist-init-addr 192.0.2.11:5757" in rendered[1]
    assert all(node.loaded.profile.parallel.gpus_per_node == 4 for node in nodes)


def test_the_hosts_node_rank_var_orders_the_nodes_and_an_ipv6_node_0_is_bracketed(tmp_path: Path) -> None:
    nodes = plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, "ranked"), "ranked")
    assert [(node.rank, node.name) for node in nodes] == [(0, "r0"), (1, "r1")]
    assert {node.loaded.profile.parallel.dist_init_addr for node in nodes} == {"[2001:db8::20]:5757"}
    assert dist_init_addr("[2001:db8::1]", 80) == "[2001:db8::1]:80"


def test_a_dist_init_addr_written_in_the_profile_is_used_as_written(tmp_path: Path) -> None:
    """A dedicated network for the rendezvous: the profile names node 0's address on it."""
    nodes = plan_nodes(two_nodes(dist_init_addr="10.9.0.1:6000"), group(tmp_path, "pair"), "pair")
    assert [node.loaded.profile.parallel.dist_init_addr for node in nodes] == ["10.9.0.1:6000"] * 2


@pytest.mark.parametrize(("group_name", "message"), [
    ("three", "group three has 3 host(s) (t1, t2, t3); the profile's parallel.nnodes is 2"),
    ("half_ranked", "node_rank is set for some hosts but not for h2"),
    ("same_rank", "the node ranks must be 0..1, each on one host: node_rank 1 on s1, s2"),
])
def test_a_group_that_does_not_give_each_node_one_rank_is_refused(tmp_path: Path, group_name: str,
                                                                  message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, group_name), group_name)


def test_a_node_rank_in_the_profile_is_refused_since_the_group_gives_the_ranks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"parallel\.node_rank 1: a group deploy gives each node its rank"):
        plan_nodes(two_nodes(dist_init_port=5757, node_rank=1), group(tmp_path, "pair"), "pair")


def test_a_multi_node_profile_is_not_deployed_to_one_host_alone() -> None:
    with pytest.raises(ConfigError, match="its nodes start, verify and roll back together") as refused:
        refuse_single_host(two_nodes(dist_init_port=5757), "n1")
    assert "--group G" in (refused.value.hint or "")
    refuse_single_host(load_profile(PROFILES, "glm5-nvfp4"), "n1")  # single-node: deployed as always


@pytest.mark.parametrize(("parallel", "message"), [
    ({}, "nnodes > 1 needs dist_init_port"),
    ({"dist_init_port": 5757, "dist_init_addr": "10.0.0.1:5757"}, "not both"),
])
def test_a_profile_without_one_rendezvous_address_is_refused(parallel: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        two_nodes(**parallel)


def test_every_node_gets_one_release_id_that_changes_when_any_node_changes(tmp_path: Path) -> None:
    nodes = plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, "pair"), "pair")
    layout = StoreLayout(service="sglang", root=PurePosixPath("/opt/sglang-deploy"))
    own = [build_release(node.loaded, layout, "0.5.23", {}).id for node in nodes]
    assert own[0] != own[1]  # each node's content differs (its rank)
    shared = group_release_id(own)
    releases = [build_release(node.loaded, layout, "0.5.23", {}, release_id=shared) for node in nodes]
    assert {release.id for release in releases} == {shared}
    assert all(f"--node-rank {rank}" in str(r.launcher_text) for rank, r in enumerate(releases))
    moved = plan_nodes(two_nodes(dist_init_port=5858), group(tmp_path, "pair"), "pair")
    assert group_release_id([own[0], build_release(moved[1].loaded, layout, "0.5.23", {}).id]) != shared
    assert group_release_id(list(reversed(own))) != shared  # ranks swapped: another release


def test_a_group_whose_nodes_each_render_their_current_release_keeps_its_id() -> None:
    """Input tried: both nodes' plans took their current release's id (each renders what it holds, its id an earlier
    tool's), then one node changed, then the nodes on different current releases (an interrupted deploy)."""
    assert group_release_id_over(["0123456789ab", "0123456789ab"], ["0123456789ab", "0123456789ab"]) == "0123456789ab"
    assert group_release_id_over(["0123456789ab", "feedfeedfeed"], ["0123456789ab", "0123456789ab"]) == \
        group_release_id(["0123456789ab", "feedfeedfeed"])
    assert group_release_id_over(["aaaaaaaaaaaa", "bbbbbbbbbbbb"], ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]) == \
        group_release_id(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    assert group_release_id_over(["aaaaaaaaaaaa", "aaaaaaaaaaaa"], [None, None]) == \
        group_release_id(["aaaaaaaaaaaa", "aaaaaaaaaaaa"])


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_each_nodes_flags_are_those_of_the_real_sglang_parser(real_options: Callable[[str], dict[str, Any]],
                                                              version: str, tmp_path: Path) -> None:
    options = real_options(version)
    for node in plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, "pair"), "pair"):
        args = list(sglang_args(node.loaded.profile, version))
        assert check_argv(options, args) == []
        parsed = vars(build_parser(options).parse_args(args))
        dest = {flag: find_option(options, flag)["dest"] for flag in ("--nnodes", "--node-rank", "--dist-init-addr")}
        assert (parsed[dest["--nnodes"]], parsed[dest["--node-rank"]], parsed[dest["--dist-init-addr"]]) == \
            (2, node.rank, "192.0.2.11:5757")


def store(releases: list[str], healthy: list[str]) -> StoreFacts:
    """A node's store holding `releases`, whose history records `healthy` deployed healthy in that order."""
    tags = {rid: Tags(who="t", host="h", release=rid, profile="p", profile_hash="x") for rid in releases}
    when = datetime(2026, 11, 30, tzinfo=UTC)
    return StoreFacts(current=healthy[-1] if healthy else None,
                      releases=tuple(ReleaseRecord(rid, "2026-11-30T00:00:00Z", {}) for rid in releases),
                      incomplete=(), history=tuple(history_entry("deploy", HEALTHY, tags[rid], when)
                                                   for rid in healthy), lock=None)


def test_the_nodes_go_back_to_their_common_last_healthy_release_or_to_none() -> None:
    both = [store(["a", "b", "c"], ["a", "b"]), store(["a", "b", "c"], ["a", "b"])]
    assert common_release(both, exclude="c") == "b"
    assert common_release(both, exclude="b") == "a"  # b is the one that failed: the one before it
    apart = [store(["a", "b"], ["a", "b"]), store(["a", "b"], ["b", "a"])]  # node 1 was rolled back by hand
    assert common_release(apart, exclude="c") is None
    assert common_release([store(["c"], []), store(["c"], [])], exclude="c") is None


def test_the_node_named_is_the_one_whose_failure_explains_the_others() -> None:
    symptom = Diagnosis("nccl_timeout", "an NCCL collective timed out", "", ())
    oom = Diagnosis("cuda_out_of_memory", "CUDA out of memory", "", ())
    unknown = Diagnosis("unknown", "", "", ())
    assert blamed([("n1 (node rank 0)", symptom), ("n2 (node rank 1)", oom)], "n1 (node rank 0)") == \
        ("n2 (node rank 1)", oom)
    assert blamed([("n1 (node rank 0)", symptom), ("n2 (node rank 1)", unknown)], "n1 (node rank 0)") == \
        ("n1 (node rank 0)", symptom)


def test_a_multi_node_group_deploy_refuses_a_rolling_rollout_and_a_group_of_the_wrong_size(tmp_path: Path) -> None:
    from helpers.cli import invoke
    (tmp_path / "glm5-nvfp4.yaml").write_text((PROFILES / "glm5-nvfp4.yaml").read_text())
    profile = tmp_path / "two.yaml"
    profile.write_text("extends: glm5-nvfp4\nparallel:\n  nnodes: 2\n  dist_init_port: 5757\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(NODES)
    rolling = invoke("deploy", "--profile", str(profile), "-i", str(inventory), "--group", "pair", "--serial", "1",
                     "--yes")
    assert rolling.returncode == 2 and "its nodes restart together, so --serial and --max-fail do not apply" in \
        rolling.stderr
    three = invoke("deploy", "--profile", str(profile), "-i", str(inventory), "--group", "three", "--yes")
    assert three.returncode == 2 and "group three has 3 host(s) (t1, t2, t3); the profile's parallel.nnodes is 2" \
        in three.stderr
    alone = invoke("deploy", "--profile", str(profile), "-i", str(inventory), "--host", "n1", "--yes")
    assert alone.returncode == 2 and "is not deployed to n1 alone" in alone.stderr
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("all:\n  children:\n    mixed:\n      hosts:\n        m1: {profile: two.yaml}\n"
                     "        m2: {profile: glm5-nvfp4.yaml}\n")
    each_own = invoke("deploy", "-i", str(mixed), "--group", "mixed", "--yes")
    assert each_own.returncode == 2 and "profile two is multi-node: every host of group mixed runs it" in \
        each_own.stderr


def test_a_signal_while_nodes_act_is_raised_only_once_every_node_has_finished_its_round_trip() -> None:
    """The switch back after Ctrl-C must not share a connection with a node's step still running."""
    finished: list[str] = []

    def act(name: str) -> None:
        if name == "n1":
            os.kill(os.getpid(), signal.SIGINT)  # the main thread gets KeyboardInterrupt while it waits
        time.sleep(0.3)  # a round trip still under way when the signal comes
        finished.append(name)

    with pytest.raises(KeyboardInterrupt):
        each(["n1", "n2"], act)
    assert sorted(finished) == ["n1", "n2"]


# ---------------------------------------------------------------------------------------------------------------
# The coordinated switch against two scripted nodes: what each node runs, in which order across the nodes

READY = {"unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainPID": "7"},
         "port_open": True, "health_status": 200, "generation": {"status": 200, "text": " Paris"}}
DEAD = {"unit": {"ActiveState": "failed", "SubState": "failed", "NRestarts": "0", "ExecMainPID": "0",
                 "Result": "exit-code", "ExecMainStatus": "1", "ExecMainCode": "1"}, "port_open": False}


class ScriptedNode(FakeRemote):
    """A node whose unit answers every probe with `answers[release]` (the release `current` names); every step it
    runs is appended to the log shared by the nodes, as (node, step name)."""

    def __init__(self, name: str, log: list[tuple[str, str]], answers: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.name, self.log, self.answers, self.current = name, log, answers, "A"
        self.reply(lambda step: getattr(step, "name", "").startswith("read sglang.service journal"),
                   stdout='{"__CURSOR": "c1"}\n')

    def run(self, batch: Sequence[Step | Put]) -> list[StepResult]:
        for step in batch:
            if step.name == "switch: temp link":
                self.current = step.argv[-2].removeprefix("releases/")  # type: ignore[union-attr]
            self.log.append((self.name, step.name))
        if batch and batch[0].name.startswith("readiness probe"):
            self.reply(batch[0].name, stdout=json.dumps(self.answers[self.current]), times=1)
        return super().run(batch)


def members(tmp_path: Path, answers: list[dict[str, dict[str, Any]]]) -> tuple[list[Member], list[tuple[str, str]],
                                                                               dict[str, dict[str, Any]]]:
    nodes = plan_nodes(two_nodes(dist_init_port=5757), group(tmp_path, "pair"), "pair")
    log: list[tuple[str, str]] = []
    history = store(["A", "B"], ["A"])
    found, metadata = [], {}
    for node, answer in zip(nodes, answers, strict=True):
        remote = ScriptedNode(node.name, log, answer)
        run = Transition(remote, node.target.layout("sglang"), node.target, RecordingProgress(), {}, grace_s=0)
        found.append(Member(node.name, node.rank, run, history))
        metadata[node.name] = {"profile": node.loaded.profile.model_dump(mode="json"), "profile_name": "two",
                               "sglang_version": "0.5.23"}
    return found, log, metadata


def test_every_node_stops_before_any_starts_and_only_node_0_serves_the_ladder(tmp_path: Path) -> None:
    nodes, log, metadata = members(tmp_path, [{"B": READY}, {"B": READY}])
    activate(nodes, "B", metadata)
    stops = [log.index((node.name, "systemd: stop")) for node in nodes]
    starts = [log.index((node.name, "systemd: restart")) for node in nodes]
    assert max(stops) < min(starts)
    probes = {(name, step) for name, step in log if step.startswith("readiness probe")}
    assert ("n1", "readiness probe (generate)") in probes and all(
        step == "readiness probe (unit)" for name, step in probes if name == "n2")
    assert [node.run.remote.current for node in nodes] == ["B", "B"]  # type: ignore[attr-defined]


def test_every_nodes_stop_and_restart_wait_for_the_longest_stop_bound_of_the_two_releases(tmp_path: Path) -> None:
    """Input tried: the release switched to has service.stop_timeout_s 400, above the current release's default:
    the node's stop and restart steps wait for that drain (plan.stop_wait_s), not the 60 s of an ordinary step."""
    from deploy_lib.deploy.plan import RESTART, stop_wait_s

    nodes, _, metadata = members(tmp_path, [{"B": READY}, {"B": READY}])
    for name in metadata:
        metadata[name]["profile"]["service"]["stop_timeout_s"] = 400
    activate(nodes, "B", metadata)
    for node in nodes:
        ran = [step for batch in node.run.remote.batches for step in batch  # type: ignore[attr-defined]
               if step.name in ("systemd: stop", RESTART)]
        assert [step.timeout_s for step in ran] == [stop_wait_s(400)] * 2


def test_a_node_that_dies_takes_every_node_back_and_is_named(tmp_path: Path) -> None:
    nodes, log, metadata = members(tmp_path, [{"A": READY, "B": READY}, {"A": READY, "B": DEAD}])
    tags = {node.name: Tags(who="t", host=node.name, release="B", profile="two", profile_hash="x") for node in nodes}
    with pytest.raises(NodeFailed) as failed:
        activate(nodes, "B", metadata)
    assert failed.value.where == "n2 (node rank 1)"
    for node in nodes:  # the releases the nodes go back to, as their stores hold them
        node.store = replace(node.store, releases=tuple(ReleaseRecord(r.id, r.staged_at, metadata[node.name])
                                                        for r in node.store.releases))
    with pytest.raises(ReadinessFailed) as ended:
        restore(nodes, "deploy", "B", tags, failed.value.failure, failed.value.where, "A", "A")
    assert "release B failed on n2 (node rank 1)" in ended.value.message
    assert "rolled back, release A is serving on every node" in ended.value.message and ended.value.serving_id == "A"
    assert [node.run.remote.current for node in nodes] == ["A", "A"]  # type: ignore[attr-defined]
    switched_back = [log.index((node.name, "systemd: restart"), log.index((node.name, "history: append")))
                     for node in nodes]
    assert max(log.index((node.name, "systemd: stop"), log.index((node.name, "history: append")))
               for node in nodes) < min(switched_back)


class SharedClock:
    """The client's monotonic clock, one for every node's run; it moves only while node 0's ladder probes."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PROBE_S = 70.0  # a readiness probe round trip: the group's start until node 0 answers
STOP_S = {"n1": 2.0, "n2": 9.0}  # how long each node's stop took on its host (n2 drains longer)
ANSWERING = {**READY, "generation": {"status": 200, "text": " Paris", "seconds": 0.5}}


class TimedNode(ScriptedNode):
    """A scripted node whose stop takes STOP_S on the host (the stops run at once, ended when the start begins) and
    whose probes take PROBE_S on the shared clock."""

    def __init__(self, node: ScriptedNode, clock: SharedClock) -> None:
        self.__dict__.update(node.__dict__)
        self.clock = clock

    def run(self, batch: Sequence[Step | Put]) -> list[StepResult]:
        timed = [replace(result, duration_s=STOP_S[self.name] if result.step.name == "systemd: stop" else
                         PROBE_S if result.step.name.startswith("readiness probe") else 0.0)
                 for result in super().run(batch)]
        self.clock.now += sum(result.duration_s for result in timed if result.step.name.startswith("readiness"))
        return timed


def timed_members(tmp_path: Path, serving_before: dict[str, bool]) -> list[Member]:
    nodes, _, _ = members(tmp_path, [{"A": ANSWERING, "B": ANSWERING}] * 2)
    clock = SharedClock()
    for node in nodes:
        node.run.remote, node.run.clock = TimedNode(node.run.remote, clock), clock  # type: ignore[arg-type]
        node.run.serving_before = serving_before[node.name]
    return nodes


def test_a_multi_node_releases_downtime_runs_from_its_first_node_stopped_to_node_0_answering(tmp_path: Path) -> None:
    """n2 (not node 0) stops first, 9 s before the start; node 0 answers 70 s after it: 79 s, of which its server's
    first generation 0.5 s; every node's history line keeps the group's downtime."""
    nodes = timed_members(tmp_path, {"n1": True, "n2": True})
    metadata = {node.name: {"profile": two_nodes(dist_init_port=5757).profile.model_dump(mode="json"),
                            "profile_name": "two", "sglang_version": "0.5.23"} for node in nodes}
    activate(nodes, "B", metadata)
    expected = Downtime(STOP_S["n2"] + PROBE_S, 0.5, {"first_generation": 0.5})
    assert [node.run.downtime for node in nodes] == [expected, expected]
    for node in nodes:
        node.run.record("deploy", HEALTHY, Tags("t", node.name, "B", "two", "x"))
        [line] = [HistoryEntry.from_json((step.stdin or b"").decode()) for step in node.run.remote.ran
                  if isinstance(step, Step) and step.name == "history: append"]
        assert Downtime.from_timings(line.timings) == expected, node.name


def test_a_multi_node_release_with_no_node_serving_before_has_no_downtime_and_one_serving_node_starts_it(
        tmp_path: Path) -> None:
    metadata = {name: {"profile": two_nodes(dist_init_port=5757).profile.model_dump(mode="json"),
                       "profile_name": "two", "sglang_version": "0.5.23"} for name in ("n1", "n2")}
    first = timed_members(tmp_path, {"n1": False, "n2": False})
    activate(first, "B", metadata)
    assert [node.run.downtime for node in first] == [None, None]
    only_node_0 = timed_members(tmp_path, {"n1": True, "n2": False})
    activate(only_node_0, "B", metadata)
    assert only_node_0[1].run.downtime == Downtime(STOP_S["n1"] + PROBE_S, 0.5, {"first_generation": 0.5})
