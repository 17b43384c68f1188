"""Multi-node SGLang (`parallel.nnodes` > 1) as one release over an inventory group: which host is which node rank,
the `--dist-init-addr` every node dials (node 0's address), and the one release id all nodes share. Pure: the
coordinated deploy that acts on these decisions is deploy_lib/multinode_deploy.py.

SGLang's flags (sglang 0.5.9 server_args.py; 0.5.23 srt/arg_groups/fields/parallel.py): `--nnodes`, `--node-rank`,
`--dist-init-addr` (alias `--nccl-init-addr`). Node 0 serves HTTP; the other ranks run their schedulers only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError
from deploy_lib.profile import LoadedProfile


@dataclass(frozen=True)
class Node:
    """One host of a multi-node release: its rank, and the profile it runs (its rank and node 0's address set)."""

    rank: int
    target: Target
    loaded: LoadedProfile

    @property
    def name(self) -> str:
        return self.target.host.name


def is_multi_node(loaded: LoadedProfile) -> bool:
    return loaded.profile.parallel.nnodes > 1


def refuse_single_host(loaded: LoadedProfile, host: str) -> None:
    """A multi-node profile runs on all its nodes at once or not at all: never deployed to one host alone."""
    if is_multi_node(loaded):
        raise ConfigError(f"profile {loaded.name} has parallel.nnodes {loaded.profile.parallel.nnodes}: its nodes "
                          f"start, verify and roll back together, so it is not deployed to {host} alone",
                          "deploy it to the group of its nodes: `invoke deploy --profile "
                          f"{loaded.name} --group G`")


def assign_ranks(targets: Sequence[Target], nnodes: int, group: str) -> list[tuple[int, Target]]:
    """Node ranks: every host's `node_rank` var when the group sets them, else the group's inventory order.
    The group must have exactly `nnodes` hosts and the ranks must be 0..nnodes-1, each once."""
    names = ", ".join(target.host.name for target in targets)
    if len(targets) != nnodes:
        raise ConfigError(f"group {group} has {len(targets)} host(s) ({names}); the profile's parallel.nnodes is "
                          f"{nnodes}", f"deploy to a group of exactly {nnodes} hosts, one per node")
    given = {target.host.name: target.host.vars.node_rank for target in targets}
    if all(rank is None for rank in given.values()):
        return list(enumerate(targets))
    unset = [name for name, rank in given.items() if rank is None]
    if unset:
        raise ConfigError(f"group {group}: node_rank is set for some hosts but not for {', '.join(unset)}",
                          "set node_rank on every host of the group, or on none (ranks then follow the group's order)")
    by_rank: dict[int, list[str]] = {}
    for name, rank in given.items():
        by_rank.setdefault(int(rank or 0), []).append(name)
    wrong = [f"node_rank {rank} on {', '.join(hosts)}" for rank, hosts in sorted(by_rank.items())
             if len(hosts) > 1 or rank >= nnodes]
    if wrong:
        raise ConfigError(f"group {group}: the node ranks must be 0..{nnodes - 1}, each on one host: "
                          f"{'; '.join(wrong)}", "give each host of the group its own node_rank")
    return sorted(((int(given[t.host.name] or 0), t) for t in targets), key=lambda pair: pair[0])


def dist_init_addr(address: str, port: int) -> str:
    """host:port as SGLang's NetworkAddress.parse reads it: an IPv6 address in brackets."""
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{port}"


def plan_nodes(loaded: LoadedProfile, targets: Sequence[Target], group: str) -> list[Node]:
    """Each node's profile: the group's rank and node 0's `--dist-init-addr` (the profile's own address when it
    gives one, else node 0's inventory address with `parallel.dist_init_port`). Fusion is single-node (refused by
    the profile already); a profile's own node_rank would contradict the group's and is refused."""
    parallel = loaded.profile.parallel
    if not is_multi_node(loaded):
        raise ConfigError(f"profile {loaded.name} is single-node (parallel.nnodes 1)", "set parallel.nnodes")
    if parallel.node_rank != 0:
        raise ConfigError(f"profile {loaded.name}: parallel.node_rank {parallel.node_rank}: a group deploy gives "
                          "each node its rank (the group's order, or the hosts' node_rank var)",
                          "remove parallel.node_rank from the profile")
    ranked = assign_ranks(targets, parallel.nnodes, group)
    head = ranked[0][1]
    address = parallel.dist_init_addr or dist_init_addr(head.host.address, int(parallel.dist_init_port or 0))
    nodes = []
    for rank, target in ranked:
        node_parallel = parallel.model_copy(update={"node_rank": rank, "dist_init_addr": address,
                                                    "dist_init_port": None})
        profile = loaded.profile.model_copy(update={"parallel": node_parallel})
        nodes.append(Node(rank, target, loaded.model_copy(update={"profile": profile})))
    return nodes


def group_release_id(node_release_ids: Sequence[str]) -> str:
    """The one id of a multi-node release: a digest of every node's own release id in rank order (each one the
    digest of what that node runs, host settings included), so a change on any node is a new release on all."""
    return hashlib.sha256(json.dumps(["multi-node", *node_release_ids]).encode()).hexdigest()[:12]


def group_release_id_over(node_release_ids: Sequence[str], current_ids: Sequence[str | None]) -> str:
    """The group's id over what the nodes run now (`current_ids`, in rank order): when every node's plan took its
    current release's id (it renders what that one holds, whatever id it was written under) and that is one release
    on every node, that release's id, so nothing restarts; else `group_release_id` of the nodes' own ids."""
    if len(set(current_ids)) == 1 and list(node_release_ids) == list(current_ids):
        return node_release_ids[0]
    return group_release_id(node_release_ids)


__all__ = ["Node", "assign_ranks", "dist_init_addr", "group_release_id", "group_release_id_over",
           "is_multi_node", "plan_nodes",
           "refuse_single_host"]
