"""The watch on a multi-node release (issue 42): not run, and the deploy says so on node 0. Its nodes stop and
start together and only node 0 serves HTTP; the watch is built around one host's switch (docs/watch.md). Scripted
nodes as the multi-node tuning tests use them."""

from __future__ import annotations

from helpers.deploy_plan import PROJECT
from helpers.recording_progress import RecordingProgress
from helpers.tune_group import replica
from helpers.tune_loop import a_sweep_host, sglang_knowing_every_flag

from deploy_lib.commands.deploy import Options
from deploy_lib.ops.multinode import plan_nodes
from deploy_lib.ops.multinode_deploy import deploy_nodes
from deploy_lib.ops.scope import Scope
from deploy_lib.profile.overrides import with_overrides


def test_a_multi_node_release_with_a_watch_is_deployed_unwatched_and_node_0_says_so() -> None:
    """Input tried: glm5-nvfp4-3nodes with features.metrics on and a watch: of 60 s, over three scripted hosts."""
    watched = with_overrides(PROJECT.profile("glm5-nvfp4-3nodes"), {"features.metrics": True, "watch.window_s": 60},
                             "test")
    hosts = {name: a_sweep_host("memory.max_running_requests=256") for name in ("n1", "n2", "n3")}
    scope = Scope(PROJECT.inventory(None), tuple(replica(name) for name in hosts), group="pair")
    nodes = plan_nodes(watched, scope.targets, "pair")
    for host in hosts.values():
        sglang_knowing_every_flag(host, *(node.loaded for node in nodes))
    progress = {name: RecordingProgress() for name in hosts}
    outcomes = deploy_nodes(nodes, dict(hosts), progress.__getitem__, Options(grace_s=0))
    assert [outcome.action for outcome in outcomes] == ["deployed"] * 3
    assert "watch: not run for a multi-node release (the watch judges one host's switch); it is deployed " \
           "unwatched" in progress["n1"].of_kind("note")
    assert not [note for name in ("n2", "n3") for note in progress[name].of_kind("note")
                if str(note).startswith("watch:")], "said once, on node 0"
    assert not [name for host in hosts.values() for name in host.ran_names() if name == "read /metrics"]
