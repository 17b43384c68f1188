"""Multi-node SGLang as one release (pure): node ranks from the group, node 0's --dist-init-addr on every node,
the flags each node renders (checked against the real SGLang parsers), one release id for the whole group."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from pydantic import ValidationError

from deploy_lib.errors import ConfigError
from deploy_lib.inventory import load_inventory
from deploy_lib.multinode import dist_init_addr, group_release_id, plan_nodes, refuse_single_host
from deploy_lib.profile import LoadedProfile, Profile, load_profile
from deploy_lib.project import Target, resolve_group
from deploy_lib.release import build_release
from deploy_lib.server_args import sglang_args
from deploy_lib.sglang_options import build_parser, check_argv, find_option
from deploy_lib.store import StoreLayout

pytest_plugins = ("wheelcache",)  # real_options
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
    assert all(f"release {shared}" in release.unit_text for release in releases)
    moved = plan_nodes(two_nodes(dist_init_port=5858), group(tmp_path, "pair"), "pair")
    assert group_release_id([own[0], build_release(moved[1].loaded, layout, "0.5.23", {}).id]) != shared
    assert group_release_id(list(reversed(own))) != shared  # ranks swapped: another release


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
