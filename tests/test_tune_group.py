"""`tune --group`: one sweep over a group's replicas at once (deploy_lib/ops/tune_group.py), each replica a scripted
host of tests/test_tune_loop.py (its store follows the engine's writes, its benchmark answers from its serving
release's profile); no SSH, no subprocess."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from helpers.deploy_plan import PROJECT
from helpers.ops import HOSTS
from helpers.recording_progress import RecordingProgress
from helpers.router import answering, config_of
from helpers.tune_group import BASE, FOUR_CAPS, replica
from helpers.tune_loop import SweepHost, a_sweep_host, request, sglang_knowing_every_flag

from deploy_cli.present import jsonable
from deploy_lib.commands.deploy import Options
from deploy_lib.commands.tune import show
from deploy_lib.commands.tune_request import Request
from deploy_lib.errors import Interrupted
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.multinode import plan_nodes
from deploy_lib.ops.multinode_deploy import deploy_nodes
from deploy_lib.ops.scope import Reach, Scope, select
from deploy_lib.ops.tune_group import GroupTune, deal, tune_group
from deploy_lib.profile.overrides import with_overrides
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.tune import TuneReport

CAP = "memory.max_running_requests="


def group(hosts: dict[str, SweepHost]) -> tuple[Scope, Reach]:
    scope = Scope(PROJECT.inventory(None), tuple(replica(name) for name in hosts), group="pair")
    reach = Reach(lambda t, prefixed: nullcontext(hosts[t.host.name]), lambda name: RecordingProgress(),
                  lambda question: None)
    return scope, reach


def serving_cap(host: SweepHost) -> int:
    return host.current_metadata()["profile"]["memory"]["max_running_requests"]


def test_candidates_are_dealt_round_robin_over_the_hosts() -> None:
    assert deal(["c1", "c2", "c3", "c4", "c5"], ["a", "b"]) == {"a": ("c1", "c3", "c5"), "b": ("c2", "c4")}
    assert deal(["c1"], ["a", "b", "c"]) == {"a": ("c1",), "b": (), "c": ()}, "a host without a share serves on"


def test_two_replicas_share_four_candidates_and_the_winner_is_rolled_out_to_both() -> None:
    hosts = {"a": a_sweep_host(*FOUR_CAPS), "b": a_sweep_host(*FOUR_CAPS)}
    scope, reach = group(hosts)
    result = tune_group(scope, BASE, request(*FOUR_CAPS), reach)
    assert isinstance(result, GroupTune)
    assert result.shares == {"a": (f"{CAP}64", f"{CAP}1024"), "b": (f"{CAP}256", f"{CAP}512")}
    ran = {name: [line["tune"].get("candidate") for line in host.tune_lines() if line["tune"]["role"] == "candidate"]
           for name, host in hosts.items()}
    assert ran == {"a": [f"{CAP}64", f"{CAP}1024"], "b": [f"{CAP}256", f"{CAP}512"]}, "each ran its share only"
    report = result.report
    assert sorted(row.label for row in report.rows) == sorted(f"{CAP}{n}" for n in (64, 256, 512, 1024))
    assert report.base is not None and len(report.base.values) == 2, "the base's runs on both hosts give the noise"
    assert {name: [line["tune"]["role"] for line in host.tune_lines()].count("base") for name, host in hosts.items()} \
        == {"a": 1, "b": 1}, "the base's two runs split over the two hosts, at once"
    assert report.winner == f"{CAP}1024" and "kept" in report.reason and report.reason.startswith("group pair")
    assert serving_cap(hosts["a"]) == serving_cap(hosts["b"]) == 1024, "the winner serves on every host"
    assert result.rollout is not None and result.rollout.batches == (("a",), ("b",)), "one host at a time"
    assert [run.result.action for run in result.rollout.runs if run.result] == ["unchanged", "deployed"], \
        "a measured the winner and keeps it; b gets it by the rolling deploy"
    assert result.exit_code == 0 and set(result.serving or {}) == {"a", "b"}
    for name, host in hosts.items():
        ends = [line for line in host.tune_lines() if line["tune"]["role"] == "end"]
        assert ends[-1]["cause"].startswith("group pair:"), f"{name} records the group's decision last"
    assert show(hosts["b"], replica("b"), "sglang", report.tune_id).winner == f"{CAP}1024"
    as_json = json.loads(json.dumps(jsonable(result)))  # --json
    assert as_json["report"]["winner"] == f"{CAP}1024" and as_json["shares"]["b"] == [f"{CAP}256", f"{CAP}512"]
    assert as_json["rolled_out"] == {"a": "unchanged", "b": "deployed"} and as_json["failed"] == {}


def switches_after_share(host: SweepHost) -> list[str]:
    """What changed the serving release on the host after its last candidate's run: deploy or rollback lines."""
    events = [json.loads(line) for line in host.lines]
    last = max(n for n, e in enumerate(events) if e["event"] == "tune" and e["tune"]["role"] == "candidate")
    return [e["event"] for e in events[last + 1:] if e["event"] in ("deploy", "rollback")]


def test_the_group_decides_once_so_no_host_switches_twice_at_the_end() -> None:
    """Input tried: caps 64, 512, 1024, 256 (b's share 512 then 256: its own best is not its last), keep: winner; a
    host that decided alone would go back to its own best (512) before the group's winner (1024) reached it."""
    vary = ("memory.max_running_requests=64,512,1024,256",)
    hosts = {"a": a_sweep_host(*vary), "b": a_sweep_host(*vary)}
    scope, reach = group(hosts)
    result = tune_group(scope, BASE, request(*vary), reach)
    assert isinstance(result, GroupTune) and result.report.winner == f"{CAP}1024"
    assert {name: switches_after_share(host) for name, host in hosts.items()} == {"a": [], "b": ["deploy"]}, \
        "a measured the winner and serves on; b gets the winner, once"
    assert serving_cap(hosts["a"]) == serving_cap(hosts["b"]) == 1024
    ends = {name: [line["cause"] for line in host.tune_lines() if line["tune"]["role"] == "end"]
            for name, host in hosts.items()}
    assert all(len(causes) == 1 and causes[0].startswith("group pair:") for causes in ends.values()), \
        f"one end per host, the group's: {ends}"
    assert not [line for host in hosts.values() for line in host.tune_lines() if line["tune"]["role"] == "rerun"]


def test_no_winner_beyond_the_noise_puts_each_host_back_on_its_own_release() -> None:
    """Input tried: caps 64 and 64 again (as the pre-sweep release) and 32, with keep: winner."""
    vary = ("memory.max_running_requests=64,32",)
    hosts = {"a": a_sweep_host(*vary), "b": a_sweep_host(*vary)}
    before = {name: host.current for name, host in hosts.items()}
    scope, reach = group(hosts)
    result = tune_group(scope, BASE, request(*vary), reach)
    assert isinstance(result, GroupTune) and result.rollout is None
    assert "not beyond the noise" in result.report.reason
    assert {name: host.current for name, host in hosts.items()} == before
    assert switches_after_share(hosts["b"]) == ["rollback"], "b leaves its candidate (32) once, for its original"


def test_ctrl_c_on_one_replica_leaves_each_on_its_best_and_resume_finishes_the_sweep() -> None:
    hosts = {"a": a_sweep_host(*FOUR_CAPS), "b": a_sweep_host(*FOUR_CAPS)}
    hosts["a"].interrupt_at = (1024, 1024)
    scope, reach = group(hosts)
    with pytest.raises(Interrupted, match="interrupted on group pair") as caught:
        tune_group(scope, BASE, request(*FOUR_CAPS), reach)
    assert serving_cap(hosts["a"]) == 64, "a serves its best verified candidate"
    tune_id = caught.value.hint.split("--resume ")[1].split("`")[0]  # type: ignore[union-attr]
    result = tune_group(scope, BASE, Request(None, {}, resume=tune_id, grace_s=0), reach)
    assert isinstance(result, GroupTune) and result.report.tune_id == tune_id
    ran = [line["tune"].get("candidate") for line in hosts["a"].tune_lines() if line["tune"]["role"] == "candidate"]
    assert ran == [f"{CAP}64", f"{CAP}1024"], "the resume ran a's cut candidate, not its finished one"
    assert result.report.winner == f"{CAP}1024" and serving_cap(hosts["b"]) == 1024


def test_a_signal_to_the_group_leaves_every_host_on_its_best_so_far() -> None:
    """Input tried: caps 1024, 256, 512, 128 (a: 1024 then 512; b: 256 then 128); SIGINT to this process while b
    benchmarks 256: b starts no further candidate, a ends its share on 512 or stops before it, and either way each
    serves its own best, as the interrupted message says."""
    vary = ("memory.max_running_requests=1024,256,512,128",)
    hosts = {"a": a_sweep_host(*vary), "b": a_sweep_host(*vary)}
    b, run = hosts["b"], hosts["b"].run
    told, noted = RecordingProgress(), threading.Event()
    told.note = lambda text: noted.set()  # type: ignore[method-assign]

    def signalling(batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        if not noted.is_set() and serving_cap(b) == 256 and any(
                isinstance(step, Step) and step.name.startswith("bench: concurrency") for step in batch):
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)  # as Ctrl-C, to the handler
            noted.wait(10)  # the main thread has noted it before b's benchmark goes on
        return run(batch, on_output)
    b.run = signalling  # type: ignore[method-assign]
    scope, _ = group(hosts)
    reach = Reach(lambda t, prefixed: nullcontext(hosts[t.host.name]),
                  lambda name: told if name == "" else RecordingProgress(), lambda question: None)
    with pytest.raises(Interrupted, match="each host serves its best so far") as caught:
        tune_group(scope, BASE, request(*vary), reach)
    assert caught.value.exit_code == 130
    assert {name: serving_cap(host) for name, host in hosts.items()} == {"a": 1024, "b": 256}
    ran = [line["tune"].get("candidate") for line in b.tune_lines() if line["tune"]["role"] == "candidate"]
    assert ran == [f"{CAP}256"], "b finished the candidate it ran and started no other"


def test_a_multi_node_group_is_tuned_as_one_unit_each_candidate_on_every_node() -> None:
    """Input tried: glm5-nvfp4-3nodes over three hosts, caps 256 and 1024, after the group deployed it with 64."""
    multi = PROJECT.profile("glm5-nvfp4-3nodes")
    vary = ("memory.max_running_requests=256,1024",)
    hosts = {name: a_sweep_host(*vary) for name in ("n1", "n2", "n3")}
    scope, reach = group(hosts)
    capped = {cap: with_overrides(multi, {"memory.max_running_requests": cap}, "test") for cap in (64, 256, 1024)}
    profiles = [node.loaded for loaded in capped.values() for node in plan_nodes(loaded, scope.targets, "pair")]
    for host in hosts.values():
        sglang_knowing_every_flag(host, *profiles)
    remotes = dict(hosts)
    deploy_nodes(plan_nodes(capped[64], scope.targets, "pair"), remotes, lambda name: RecordingProgress(),
                 Options(grace_s=0))
    before = {name: host.current for name, host in hosts.items()}
    assert len(set(before.values())) == 1, "one release id on every node"
    report = tune_group(scope, multi, request(*vary), reach)
    assert isinstance(report, TuneReport) and report.finished, "one table: the group is one server"
    assert [row.outcome for row in report.rows] == ["measured", "measured"]
    assert report.winner == f"{CAP}1024"
    serving = {name: host.current for name, host in hosts.items()}
    assert len(set(serving.values())) == 1 and serving["n1"] == report.serving != before["n1"], \
        "every node serves the winner, one release"
    assert all(serving_cap(host) == 1024 for host in hosts.values())
    assert hosts["n1"].tune_lines() and not hosts["n2"].tune_lines(), "node 0 benchmarks and records the sweep"
    for name, host in hosts.items():
        deployed = [json.loads(line)["release"] for line in host.lines if json.loads(line)["event"] == "deploy"]
        assert {row.release_id for row in report.rows} <= set(deployed), f"each candidate a release on {name}"


def test_a_multi_node_sweep_prunes_none_of_its_candidates_on_any_node() -> None:
    """Input tried: service.keep_releases 2 (the least), three candidates: each node keeps every one of them, so the
    best so far can serve again (a group deploy pruned to keep_releases alone)."""
    multi = with_overrides(PROJECT.profile("glm5-nvfp4-3nodes"), {"service.keep_releases": 2}, "test")
    vary = ("memory.max_running_requests=128,256,1024",)
    hosts = {name: a_sweep_host(*vary) for name in ("n1", "n2", "n3")}
    scope, reach = group(hosts)
    capped = {cap: with_overrides(multi, {"memory.max_running_requests": cap}, "test") for cap in (64, 128, 256, 1024)}
    for host in hosts.values():
        sglang_knowing_every_flag(host, *(node.loaded for loaded in capped.values()
                                          for node in plan_nodes(loaded, scope.targets, "pair")))
    deploy_nodes(plan_nodes(capped[64], scope.targets, "pair"), dict(hosts), lambda name: RecordingProgress(),
                 Options(grace_s=0))
    report = tune_group(scope, multi, request(*vary), reach)
    assert isinstance(report, TuneReport) and report.finished
    candidates = {row.release_id for row in report.rows}
    for name, host in hosts.items():
        pruned = " ".join(json.loads(line)["cause"] for line in host.lines if json.loads(line)["event"] == "prune")
        assert not [release for release in candidates if release and release in pruned], f"{name} pruned {pruned}"


def test_resuming_a_group_sweep_leaves_the_hosts_without_a_share_serving() -> None:
    """Input tried: one candidate over three hosts, Ctrl-C in its benchmark on the first, then --resume."""
    vary = ("memory.max_running_requests=1024",)
    hosts = {name: a_sweep_host(*vary) for name in ("a", "b", "c")}
    hosts["a"].interrupt_at = (1024, 1024)
    scope, reach = group(hosts)
    with pytest.raises(Interrupted) as caught:
        tune_group(scope, BASE, request(*vary), reach)
    tune_id = caught.value.hint.split("--resume ")[1].split("`")[0]  # type: ignore[union-attr]
    result = tune_group(scope, BASE, Request(None, {}, resume=tune_id, grace_s=0), reach)
    assert isinstance(result, GroupTune) and not result.parts.failed and result.report.winner == f"{CAP}1024"
    assert [run.host for run in result.parts.runs] == ["a"], "b and c ran no share: nothing to resume there"
    assert [line["tune"]["role"] for line in hosts["a"].tune_lines()].count("base") == 2, \
        "the one host with a share benchmarks the base twice: its spread is the noise"
    assert {serving_cap(host) for host in hosts.values()} == {1024}, "the winner rolled out to all three"


A_URL, B_URL = "http://192.0.2.2:8000", "http://192.0.2.3:8000"


def behind_a_router(tmp_path: Path, *vary: str) -> tuple[GroupTune | TuneReport | Any, list[tuple[str, str]]]:
    """The sweep over group replicas (a, b) whose vars name router edge; what it returned, the router's calls."""
    hosts: dict[str, Any] = {"a": a_sweep_host(*vary), "b": a_sweep_host(*vary)}
    router = answering(remove={"was_listed": True}, add={"elapsed_s": 0.1})
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    scope = select(load_inventory(tmp_path / "hosts.yaml"), None, "replicas")
    reach = Reach(lambda t, prefixed: nullcontext({**hosts, "edge": router}[t.host.name]),
                  lambda name: RecordingProgress(), lambda question: None)
    result = tune_group(scope, BASE, request(*vary), reach)
    return result, [(c["action"], c["worker"]) for c in config_of(router)]


def test_behind_a_router_each_replica_is_out_for_its_whole_share_and_back_once_it_serves(tmp_path: Path) -> None:
    """Input tried: two candidates, one each."""
    result, calls = behind_a_router(tmp_path, "memory.max_running_requests=256,1024")
    assert isinstance(result, GroupTune) and result.report.winner == f"{CAP}1024"
    a_url, b_url = A_URL, B_URL
    assert calls[:4] in ([("remove", a_url), ("remove", b_url), ("add", a_url), ("add", b_url)],
                         [("remove", a_url), ("remove", b_url), ("add", b_url), ("add", a_url)],
                         [("remove", b_url), ("remove", a_url), ("add", a_url), ("add", b_url)],
                         [("remove", b_url), ("remove", a_url), ("add", b_url), ("add", a_url)]), \
        "each replica out once for its share (both at once), back after it"
    assert calls[4:] == [("remove", a_url), ("add", a_url)], "the rollout: only a (b measured 1024) restarts"


def test_behind_a_router_a_replica_goes_back_to_its_original_out_of_the_router(tmp_path: Path) -> None:
    """Input tried: caps 64 (the pre-sweep release's figure, a release of its own) on a and 32 on b, keep: winner:
    no winner beyond the noise, so both switch back at once."""
    result, calls = behind_a_router(tmp_path, "memory.max_running_requests=64,32")
    assert isinstance(result, GroupTune) and result.rollout is None and "not beyond the noise" in result.report.reason
    for url in (A_URL, B_URL):
        assert [action for action, worker in calls[4:] if worker == url] == ["remove", "add"], \
            f"{url} is out of the router while it switches back to its original"


def test_a_host_lost_in_its_share_ends_the_group_sweep_unfinished_with_its_code_and_rolls_nothing_out() -> None:
    """Input tried: host b's connection refused from the start; a ran its share, 1024 then 128 (its best first)."""
    from helpers.fake_remote import FakeRemote

    from deploy_lib.errors import ConnectFailed

    vary = ("memory.max_running_requests=1024,256,128,512",)
    hosts: dict[str, Any] = {"a": a_sweep_host(*vary),
                             "b": FakeRemote().reply(lambda step: True, raises=ConnectFailed("b: refused"))}
    scope, reach = group(hosts)
    before = serving_cap(hosts["a"])
    result = tune_group(scope, BASE, request(*vary), reach)
    assert isinstance(result, GroupTune) and not result.report.finished and result.rollout is None
    assert result.failed == {"b": "b: refused"} and result.exit_code == ConnectFailed.exit_code
    assert "b failed, so no winner is rolled out" in result.report.reason
    assert serving_cap(hosts["a"]) == 1024 != before, "a serves its own share's winner, verified"
