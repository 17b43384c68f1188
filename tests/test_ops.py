"""The operations of deploy_lib/ops driven as the CLI drives them, with fake hosts (no subprocess, no SSH): one host,
a group, a group behind a router, a multi-node release; which path each takes, the consent asked, the one result."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from helpers.fake_remote import FakeRemote
from helpers.ops import HOSTS, Hosts, installed, release, scope
from helpers.router import answering, config_of

from deploy_lib.commands.deploy import Options
from deploy_lib.deploy.project import Project
from deploy_lib.errors import ConfigError, ConnectFailed
from deploy_lib.facts import host as host_facts
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops import dispatch
from deploy_lib.ops.fleet import Rollout
from deploy_lib.ops.scope import Reach, select

REPO = Path(__file__).resolve().parent.parent


def changed(remote: FakeRemote) -> list[str]:
    """The steps that change the host: anything past reading its store and taking or releasing its lock."""
    return [name for name in remote.ran_names() if not name.startswith(("store facts", "lock", "host facts"))
            and not name.endswith("/lock/owner.json") and not name.startswith(("readiness probe", "live probe"))
            and name not in (host_facts.FACT_UNIT, "router: serving release")]


@pytest.mark.parametrize(("act", "says"), [
    (lambda s, reach: dispatch.stop(s, "sglang", reach), "n1 alone is not stopped"),
    (lambda s, reach: dispatch.start(s, "sglang", True, reach), "n1 alone is not restarted"),
    (lambda s, reach: dispatch.rollback(s, "sglang", "r0", reach), "n1 alone is not rolled back"),
    (lambda s, reach: dispatch.uninstall(s, "sglang", s.inventory.path.parent / "state", reach),
     "n1 alone is not uninstalled"),
])
def test_one_node_of_a_multi_node_release_is_refused_alone_and_nothing_changes(tmp_path: Path, act: Any,
                                                                               says: str) -> None:
    """Input tried: `stop`, `restart`, `rollback --to r0`, `uninstall` with --host n1, whose current release r1 is
    node 0 of a two-node release (failed before: the node was stopped, restarted, switched or removed alone, the
    other node left waiting at the rendezvous)."""
    node = installed(release("r0"), release("r1", nnodes=2))
    hosts = Hosts(n1=node)
    with pytest.raises(ConfigError, match=says) as refused:
        act(scope(tmp_path, host="n1"), hosts.reach())
    assert "release r1 is node 0 of a 2-node release" in refused.value.message and refused.value.exit_code == 2
    assert "--group G" in (refused.value.hint or "")
    assert changed(node) == []


def test_a_group_stops_every_node_of_its_multi_node_release(tmp_path: Path) -> None:
    nodes = {name: installed(release("r1", nnodes=2, node_rank=rank)) for rank, name in enumerate(("n1", "n2"))}
    hosts = Hosts(**nodes)
    fleet = dispatch.stop(scope(tmp_path, group="pair"), "sglang", hosts.reach())
    assert fleet.exit_code == 0 and [run.result.action for run in fleet.runs] == ["stopped", "stopped"]
    assert hosts.asked == ["stop sglang on 2 hosts of group pair (n1, n2)?"]
    assert all("systemd: stop" in remote.ran_names() for remote in nodes.values())


READY = {"unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainPID": "7"},
         "port_open": True, "health_status": 200, "generation": {"status": 200, "text": " Paris"}}


def serving_node(rank: int) -> FakeRemote:
    """Node `rank` of the two-node release r1 (r0 before it, healthy), whose probes find it serving."""
    node = installed(release("r0", nnodes=2, node_rank=rank), release("r1", nnodes=2, node_rank=rank))
    return (node.reply(lambda step: getattr(step, "name", "").startswith("readiness probe"), stdout=json.dumps(READY))
            .reply(lambda step: getattr(step, "name", "").startswith("read sglang.service journal"),
                   stdout='{"__CURSOR": "c1"}\n'))


def test_a_group_restarts_its_multi_node_release_as_one(tmp_path: Path) -> None:
    """Input tried: `restart --group pair`, both hosts on the two-node release r1 (failed before: each node was
    refused alone, so a multi-node release could not be restarted at all)."""
    nodes = {"n1": serving_node(0), "n2": serving_node(1)}
    hosts = Hosts(**nodes)
    fleet = dispatch.start(scope(tmp_path, group="pair"), "sglang", True, hosts.reach())
    assert fleet.exit_code == 0 and [run.result.action for run in fleet.runs] == ["restarted", "restarted"]
    assert [run.result.release_id for run in fleet.runs] == ["r1", "r1"] and fleet.batches == (("n1", "n2"),)
    assert hosts.asked == ["restart sglang on 2 hosts of group pair (n1, n2)?"]
    for remote in nodes.values():
        names = remote.ran_names()
        assert names.index("systemd: stop") < names.index("systemd: restart") < names.index("history: append")
    assert "readiness probe (generate)" in nodes["n1"].ran_names()  # node 0 serves HTTP; n2's unit is watched
    assert "readiness probe (generate)" not in nodes["n2"].ran_names()


def test_a_group_start_of_a_multi_node_release_already_running_changes_nothing(tmp_path: Path) -> None:
    nodes = {"n1": serving_node(0), "n2": serving_node(1)}
    fleet = dispatch.start(scope(tmp_path, group="pair"), "sglang", False, Hosts(**nodes).reach())
    assert [run.result.action for run in fleet.runs] == ["already running", "already running"]
    assert all(changed(remote) == [] for remote in nodes.values())


def test_a_group_uninstalls_every_node_of_its_multi_node_release(tmp_path: Path) -> None:
    nodes = {name: installed(release("r1", nnodes=2, node_rank=rank)) for rank, name in enumerate(("n1", "n2"))}
    hosts = Hosts(**nodes)
    fleet = dispatch.uninstall(scope(tmp_path, group="pair"), "sglang", tmp_path / "state", hosts.reach())
    assert fleet.exit_code == 0 and [run.result.host for run in fleet.runs] == ["n1", "n2"]
    assert hosts.asked[0].startswith("remove service sglang from 2 hosts of group pair (n1, n2)")
    assert all("uninstall: release store" in remote.ran_names() for remote in nodes.values())
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "state" / "uninstalled").iterdir()) == ["n1", "n2"]


def test_a_group_behind_a_router_restarts_one_replica_at_a_time_each_taken_out_first(tmp_path: Path) -> None:
    router = answering(remove={"was_listed": True}, add={"was_listed": False})
    replicas = {name: installed(release("r1")).reply(lambda step: getattr(step, "name", "").startswith(
        "readiness probe"), stdout=json.dumps(READY)) for name in ("a", "b")}
    fleet = dispatch.start(scope(tmp_path, group="replicas"), "sglang", True, Hosts(**replicas, edge=router).reach())
    assert fleet.exit_code == 0 and fleet.batches == (("a",), ("b",))
    assert [(c["action"], c["worker"]) for c in config_of(router)] == [
        ("remove", "http://192.0.2.2:8000"), ("add", "http://192.0.2.2:8000"),
        ("remove", "http://192.0.2.3:8000"), ("add", "http://192.0.2.3:8000")]


def test_a_refused_consent_connects_to_no_host(tmp_path: Path) -> None:
    hosts = Hosts(n1=installed(release("r1")))
    with pytest.raises(ConfigError, match="cancelled"):
        dispatch.stop(scope(tmp_path, host="n1"), "sglang", hosts.reach(agree=False))
    assert hosts.asked == ["stop sglang on n1?"] and hosts.connected == []


def _asking_in_the_library(tmp_path: Path) -> dict[str, tuple[Callable[[Reach], object], str]]:
    """Each command whose question the CLI asked itself before (issue 38): how it is called, the question it asks."""
    from deploy_lib import tune as tuning
    from deploy_lib.commands import tune_request
    from deploy_lib.deploy.project import load_for_target
    from deploy_lib.ops.router import router_site
    one, group = scope(tmp_path, host="n1"), scope(tmp_path, group="replicas")
    loaded = load_for_target(Project(REPO), "glm5-nvfp4", one.inventory, one.targets[0])
    spec, sources = tuning.sweep_spec(None, ["memory.max_running_requests=64,128"], {})
    request = tune_request.Request(spec, sources, ())
    site = router_site(group.inventory, [target.host for target in group.targets])
    assert site is not None
    edge = select(group.inventory, "edge", None)
    return {
        "tune": (lambda reach: dispatch.tune(one, loaded, request, reach),
                 "tune glm5-nvfp4 on n1: each candidate restarts the server?"),
        "tune --group": (lambda reach: dispatch.tune(group, loaded, request, reach),
                         "tune glm5-nvfp4 on the 2 hosts of group replicas: each candidate restarts the server it "
                         "runs on?"),
        "router.deploy": (lambda reach: dispatch.router_deploy(edge, site, ["http://192.0.2.2:8000"], "replicas",
                                                               reach),
                          "deploy the router for group replicas (http://192.0.2.2:8000) to edge:31000?"),
        "venv.adopt": (lambda reach: dispatch.venv_adopt(one, "sglang", PurePosixPath("/root/ml-env"), reach),
                       "adopt /root/ml-env as a managed venv on n1?"),
        "venv.remove": (lambda reach: dispatch.venv_remove(one, "sglang", "0123456789ab", reach),
                        "remove venv 0123456789ab of sglang on n1?"),
        "adopt --pid": (lambda reach: dispatch.adopt(one, "sglang", "by-hand", 4242, None, reach),
                        "adopt pid 4242 on n1 as release 0 of service sglang?"),
        "adopt --unit": (lambda reach: dispatch.adopt(one, "sglang", "by-hand", None, "llm.service", reach),
                         "adopt unit llm.service on n1 as release 0 of service llm?"),
        "unlock": (lambda reach: dispatch.unlock(one, "sglang", False, reach), "remove the lock of sglang on n1?"),
    }


@pytest.mark.parametrize("command", ["tune", "tune --group", "router.deploy", "venv.adopt", "venv.remove",
                                     "adopt --pid", "adopt --unit", "unlock"])
def test_every_command_that_changes_a_host_asks_through_reach_before_connecting(tmp_path: Path, command: str) -> None:
    """Consent is asked one way: the library asks through `Reach.consent` (the CLI's terminal or --yes), so a
    refusal there connects to no host. Input tried: each command whose task asked the terminal itself before."""
    hosts = Hosts()
    call, question = _asking_in_the_library(tmp_path)[command]
    with pytest.raises(ConfigError, match="cancelled"):
        call(hosts.reach(agree=False))
    assert hosts.asked == [question] and hosts.connected == []


def test_a_venv_build_of_a_profile_without_one_is_refused_before_the_question(tmp_path: Path) -> None:
    from deploy_lib.deploy.project import load_for_target
    one, hosts = scope(tmp_path, host="n1"), Hosts()
    loaded = load_for_target(Project(REPO), "glm5-nvfp4", one.inventory, one.targets[0])
    with pytest.raises(ConfigError, match=r"profile glm5-nvfp4 has no service\.venv_build"):
        dispatch.venv_build(one, loaded, hosts.reach())
    assert hosts.asked == [] and hosts.connected == []


def test_a_group_behind_a_router_stops_one_replica_at_a_time_each_taken_out_first(tmp_path: Path) -> None:
    router = answering(remove={"was_listed": True})
    hosts = Hosts(a=installed(release("r1")), b=installed(release("r1")), edge=router)
    fleet = dispatch.stop(scope(tmp_path, group="replicas"), "sglang", hosts.reach())
    assert fleet.exit_code == 0 and fleet.batches == (("a",), ("b",))
    assert [(c["action"], c["worker"]) for c in config_of(router)] == [("remove", "http://192.0.2.2:8000"),
                                                                         ("remove", "http://192.0.2.3:8000")]


def test_a_read_only_command_on_a_group_gives_each_hosts_result_and_the_worst_exit_code(tmp_path: Path) -> None:
    lost = FakeRemote().reply(lambda step: True, raises=ConnectFailed("n2: connection refused"))
    hosts = Hosts(n1=installed(release("r1")), n2=lost)
    fleet = dispatch.releases(scope(tmp_path, group="pair"), "sglang", hosts.reach())
    assert [run.host for run in fleet.runs] == ["n1", "n2"] and fleet.failed == ["n2"]
    assert [row.id for row in fleet.runs[0].result] == ["r1"]
    assert fleet.exit_code == ConnectFailed.exit_code


def test_a_one_host_command_raises_its_hosts_error(tmp_path: Path) -> None:
    lost = FakeRemote().reply(lambda step: True, raises=ConnectFailed("n2: connection refused"))
    with pytest.raises(ConnectFailed):
        dispatch.status(scope(tmp_path, host="n2"), "sglang", Hosts(n2=lost).reach())


@pytest.mark.parametrize(("host", "group", "rollout", "says"), [
    (None, None, Rollout.parse(["1"]), "--serial and --max-fail roll out over a group"),
    ("n1", "pair", None, "--host and --group are exclusive"),
])
def test_hosts_named_two_ways_or_a_rollout_without_a_group_are_refused(tmp_path: Path, host: str | None,
                                                                       group: str | None, rollout: Rollout | None,
                                                                       says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        scope(tmp_path, host, group, rollout)


def test_a_multi_node_deploy_refuses_one_host_and_a_rolling_rollout_before_asking_or_connecting(tmp_path: Path) -> None:
    project = Project(REPO)
    hosts = Hosts()
    with pytest.raises(ConfigError, match="is not deployed to n1 alone"):
        dispatch.deploy(project, scope(tmp_path, host="n1"), "glm5-nvfp4-3nodes", Options(), hosts.reach())
    with pytest.raises(ConfigError, match="group pair has 2 host"):
        dispatch.deploy(project, scope(tmp_path, group="pair"), "glm5-nvfp4-3nodes", Options(), hosts.reach())
    with pytest.raises(ConfigError, match="--serial and --max-fail do not apply"):
        dispatch.deploy(project, scope(tmp_path, group="pair", rollout=Rollout.parse(["1"])), "glm5-nvfp4-3nodes",
                        Options(), hosts.reach())
    assert hosts.connected == []


def test_the_project_is_the_nearest_directory_upwards_holding_inventory_or_the_one_named(tmp_path: Path) -> None:
    """Never the tool's install location (failed before: the tasks read the checkout's inventory wherever they ran)."""
    (tmp_path / "mine" / "inventory").mkdir(parents=True)
    (tmp_path / "mine" / "deep" / "er").mkdir(parents=True)
    assert Project.find(tmp_path / "mine" / "deep" / "er", {}).root == (tmp_path / "mine").resolve()
    assert Project.find(tmp_path, {}).root == tmp_path.resolve()  # none upwards: the working directory's own
    assert Project.find(tmp_path, {"SGLANG_DEPLOY_PROJECT": str(tmp_path / "mine")}).root == tmp_path / "mine"
    with pytest.raises(ConfigError, match="does not exist"):
        Project.find(tmp_path, {"SGLANG_DEPLOY_PROJECT": str(tmp_path / "nowhere")})


def test_init_writes_a_starter_project_and_overwrites_nothing(tmp_path: Path) -> None:
    """Input tried: init twice in one directory; the second refuses, naming the files, and writes nothing."""
    from deploy_lib.deploy.starter import for_example, write_project
    written = write_project(tmp_path, for_example("glm5-nvfp4"))
    assert [path.relative_to(tmp_path).as_posix() for path in written] == [
        "inventory/hosts.yaml", "inventory/profiles/glm5-nvfp4.yaml", ".gitignore"]
    project = Project(tmp_path)
    assert project.profile("glm5-nvfp4").profile.parallel.tp == 8
    assert list(project.inventory(None).hosts) == ["pve-gpu1"]
    (tmp_path / ".gitignore").write_text("mine\n")
    (tmp_path / "inventory" / "hosts.yaml").unlink()
    with pytest.raises(ConfigError, match=r"\.gitignore.*overwrites nothing") as refused:
        write_project(tmp_path, for_example("glm5-nvfp4"))
    assert refused.value.exit_code == 2 and "hosts.yaml" not in refused.value.message
    assert not (tmp_path / "inventory" / "hosts.yaml").exists() and (tmp_path / ".gitignore").read_text() == "mine\n"


def test_a_rolling_rollback_of_a_group_to_its_multi_node_release_is_refused_on_every_node(tmp_path: Path) -> None:
    """Input tried: `rollback --group pair --to r0 --serial 1`, r0 a two-node release on both hosts (failed before:
    with --serial the multi-node check was skipped and each node was rolled back alone, batch by batch)."""
    nodes = {name: installed(release("r0", nnodes=2, node_rank=rank), release("r1"))
             for rank, name in enumerate(("n1", "n2"))}
    fleet = dispatch.rollback(scope(tmp_path, group="pair", rollout=Rollout.parse(["1"])), "sglang", "r0",
                              Hosts(**nodes).reach())
    assert fleet.failed == ["n1", "n2"] and fleet.exit_code == 2
    assert all("--serial and --max-fail do not apply" in run.error.message for run in fleet.runs if run.error)
    assert all(changed(remote) == [] for remote in nodes.values())


def test_a_gpu_check_that_would_stop_one_node_of_a_multi_node_release_is_refused_and_leaves_it_serving(
        tmp_path: Path) -> None:
    """Input tried: `gpu-check --stop-server --host n1`, n1 a node of a running two-node release (failed before: its
    server was stopped for the check, the other node left alone at the rendezvous)."""
    node = installed(release("r1", nnodes=2))
    with pytest.raises(ConfigError, match="n1 alone is not stopped"):
        dispatch.gpu_check(scope(tmp_path, host="n1"), "sglang", None, True, [1024], Hosts(n1=node).reach())
    assert "systemd: stop" not in node.ran_names() and changed(node) == []


def test_a_deploy_to_one_node_of_a_multi_node_release_is_refused_before_any_change(tmp_path: Path) -> None:
    """Input tried: `deploy --profile glm5-nvfp4 --host n1`, n1 running node 0 of a two-node release (failed
    before: n1 was switched to the single-node release, the other node left at the rendezvous)."""
    node = installed(release("r1", nnodes=2))
    with pytest.raises(ConfigError, match="n1 alone is not deployed to"):
        dispatch.deploy(Project(REPO), scope(tmp_path, host="n1"), "glm5-nvfp4", Options(environ={"HF_TOKEN": "x"}),
                        Hosts(n1=node).reach())
    assert changed(node) == [] and "systemd: stop" not in node.ran_names()


@pytest.mark.parametrize(("act", "says"), [
    (lambda s, reach: dispatch.stop(s, "sglang", reach), "n1 alone is not stopped"),
    (lambda s, reach: dispatch.uninstall(s, "sglang", s.inventory.path.parent / "state", reach),
     "n1 alone is not uninstalled"),
    (lambda s, reach: dispatch.rollback(s, "sglang", "r0", reach), "is not a multi-node release of these 1 hosts"),
    (lambda s, reach: dispatch.start(s, "sglang", True, reach), "is not a multi-node release of these 1 hosts"),
])
def test_a_limit_that_leaves_one_node_of_a_multi_node_release_in_a_group_is_refused_and_nothing_changes(
        tmp_path: Path, act: Any, says: str) -> None:
    """Input tried: `stop --group pair --limit n1` (and uninstall, rollback, restart), r1 a two-node release on n1
    and n2 (failed before the fix: a group scope acts on its hosts as whole, so n1 was stopped or removed without
    n2)."""
    nodes = {name: installed(release("r0", nnodes=2, node_rank=rank), release("r1", nnodes=2, node_rank=rank))
             for rank, name in enumerate(("n1", "n2"))}
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS)
    limited = select(load_inventory(path), None, "pair", limit="n1")
    assert (limited.names, limited.left_out) == (["n1"], ("n2",))
    fleet_or_error: Any
    try:
        fleet_or_error = act(limited, Hosts(**nodes).reach())
    except ConfigError as refused:
        fleet_or_error = refused
    errors = [fleet_or_error] if isinstance(fleet_or_error, ConfigError) else \
        [run.error for run in fleet_or_error.runs if run.error]
    assert errors and all(says in str(error) for error in errors), errors
    assert all(changed(remote) == [] for remote in nodes.values())
