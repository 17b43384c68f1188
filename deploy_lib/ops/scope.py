"""Which hosts a command acts on and how it reaches them: one host, or a group's hosts run through the one
multi-host runner (fleet.run_hosts); every command's result is a FleetRun (per-host results or errors, the worst
exit code, an interruption noted), a one-host command's with its one host."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from deploy_lib.deploy.project import Target, resolve_group, resolve_target
from deploy_lib.errors import ConfigError
from deploy_lib.inventory.model import Inventory
from deploy_lib.inventory.patterns import match_hosts
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote

if TYPE_CHECKING:
    from tenacity import Retrying

    from deploy_lib.ops.fleet import FleetRun, Rollout
    from deploy_lib.ops.router_deploy import LeftOut, RouterFront

T = TypeVar("T")


@dataclass(frozen=True)
class Scope:
    """The hosts a command acts on, as the user named them: one host (`group` None) or every host of a group."""

    inventory: Inventory
    targets: tuple[Target, ...]
    group: str | None = None
    rollout: Rollout | None = None   # --serial / --max-fail; None: every host at once
    accept_new_host_key: bool = False
    limit: str | None = None         # --limit PATTERN that narrowed the group
    left_out: tuple[str, ...] = ()   # the group's hosts the limit left out

    @property
    def one_host(self) -> bool:
        return self.group is None

    @property
    def alone(self) -> bool:
        """Its hosts are acted on as single hosts, never as the nodes of one multi-node release: one host, or a group
        --limit left hosts of (the nodes left in it would switch, stop or go without the others)."""
        return self.one_host or bool(self.left_out)

    @property
    def names(self) -> list[str]:
        return [target.host.name for target in self.targets]


def select(inventory: Inventory, host: str | None, group: str | None, accept_new_host_key: bool = False,
           rollout: Rollout | None = None, limit: str | None = None) -> Scope:
    """--host (default: the only host) or --group; --serial and --max-fail need a group. `limit` (--limit PATTERN,
    inventory/patterns.py) narrows either: a host it does not name is refused, a group keeps the hosts it names;
    alone, it narrows every host (`--group all`), as Ansible's --limit does."""
    if group is None and host is None and limit is not None:
        group = ALL
    if group is None:
        if rollout is not None:
            raise ConfigError("--serial and --max-fail roll out over a group: give --group G")
        target = resolve_target(inventory, host, accept_new_host_key)
        host_within(inventory, target.host.name, limit)
        return Scope(inventory, (target,), accept_new_host_key=accept_new_host_key, limit=limit)
    if host is not None:
        raise ConfigError("--host and --group are exclusive: give one host (--host) or one group (--group)")
    if limit is None:
        return Scope(inventory, tuple(resolve_group(inventory, group, accept_new_host_key)), group, rollout,
                     accept_new_host_key)
    members = [member.name for member in inventory.group(group)]
    named = set(_limited(inventory, limit))
    kept = [name for name in members if name in named]
    if not kept:
        raise ConfigError(f"--limit {limit} leaves no host of group {group} ({', '.join(members)})",
                          f"the pattern names {', '.join(sorted(named))}: give a pattern that names hosts of the "
                          "group")
    return Scope(inventory, tuple(resolve_target(inventory, name, accept_new_host_key) for name in kept), group,
                 rollout, accept_new_host_key, limit, tuple(name for name in members if name not in named))


ALL = "all"  # Ansible's group of every host, which --limit alone narrows


def host_within(inventory: Inventory, host: str | None, limit: str | None) -> str | None:
    """The host a one-host command acts on under --limit: --host when the limit names it (else ConfigError), or,
    without --host, the one host the limit names (a limit naming several is refused: the command acts on one)."""
    if limit is None:
        return host
    named = _limited(inventory, limit)
    if host is None:
        if len(named) != 1:
            raise ConfigError(f"--limit {limit} names {len(named)} hosts ({', '.join(named)}), and this acts on one "
                              "host", "give --host NAME, a pattern that names one host, or --group G")
        return named[0]
    if host not in named:
        raise ConfigError(f"--limit {limit} does not name host {host} (--host): nothing to act on",
                          "drop --limit, or give a --group for it to narrow")
    return host


def _limited(inventory: Inventory, limit: str) -> list[str]:
    return match_hosts(limit, list(inventory.hosts), inventory.groups)


def refuse_split(scope: Scope, what: str) -> None:
    """ConfigError when --limit left out hosts of a group whose hosts run `what` (a multi-node release) as one."""
    if scope.left_out and scope.group != ALL:
        raise ConfigError(f"--limit {scope.limit} splits group {scope.group}: {what}, one server over all its "
                          f"nodes, but {', '.join(scope.left_out)} would be left out",
                          "act on the whole group (drop --limit), or limit to hosts outside it")


@dataclass(frozen=True)
class Reach:
    """How an operation reaches its hosts and asks: the caller's connection (`prefixed`: the host's name shown on
    each step, for a group), progress (`""`: the whole command's, else a host's), and consent (raises when the user
    does not agree; the library never asks a terminal itself); the project whose hooks run, the webhook's
    retries."""

    connect: Callable[[Target, bool], AbstractContextManager[Remote]]
    progress: Callable[[str], Progress]
    consent: Callable[[str], None]
    environ: Mapping[str, str] = field(default_factory=dict)
    project_root: Path | None = None  # whose hooks/ run around a deploy or rollback (ops/notices.py); None: none
    notify_retry: Retrying | None = None  # the webhook's retries (None: remote.webhook.NOTIFY_RETRY)


def run_each(scope: Scope, reach: Reach, act: Callable[[Target, Remote, Progress], T],
             rollout: Rollout | None = None) -> FleetRun[T]:
    """`act` on every host of the scope: one host in this thread, its error raised as a one-host command's; a
    group's hosts through fleet.run_hosts (batch by batch, one connection each, progress prefixed by the host)."""
    from deploy_lib.ops.fleet import ALL_AT_ONCE, FleetRun, HostRun, run_hosts
    if scope.one_host:
        [target] = scope.targets
        with reach.connect(target, False) as remote:
            result = act(target, remote, reach.progress(""))
        return FleetRun((HostRun(target.host.name, result=result),), ((target.host.name,),))

    def on_host(target: Target) -> T:
        with reach.connect(target, True) as remote:
            return act(target, remote, reach.progress(target.host.name))
    return run_hosts(scope.targets, on_host, reach.progress(""), rollout or ALL_AT_ONCE)


def router_in_front(scope: Scope, reach: Reach) -> RouterFront | None:
    """The router the hosts' `router` var names; nothing of the router is imported when none names one."""
    if not any(target.host.vars.router for target in scope.targets):
        return None
    from deploy_lib.ops.router_deploy import router_in_front as find
    return find(scope.inventory, scope.targets, scope.accept_new_host_key, lambda target: reach.connect(target, True))


def behind(front: RouterFront | None, service: str | Callable[[Target], str],
           transition: Callable[[Target, Remote, Progress, Callable[[], None] | None], T],
           leaves_out: LeftOut | None = None) -> Callable[[Target, Remote, Progress], T]:
    """A per-host transition (`transition(target, remote, progress, before_restart)`) of `service` (or each host's)
    with the router around it (router_deploy.behind_router): the replica out before its server stops, back once
    it serves."""
    def act(target: Target, remote: Remote, progress: Progress) -> T:
        if front is None:
            return transition(target, remote, progress, None)
        from deploy_lib.ops.router_deploy import behind_router
        name = service if isinstance(service, str) else service(target)
        return behind_router(front, target, name, remote, progress,
                             lambda drain: transition(target, remote, progress, drain), leaves_out)
    return act


def rolled_out(front: RouterFront | None, scope: Scope, reach: Reach) -> Rollout | None:
    """The scope's rollout; behind a router, one replica at a time unless --serial says otherwise."""
    if front is None or scope.one_host:
        return scope.rollout
    from deploy_lib.ops.fleet import ALL_AT_ONCE
    from deploy_lib.ops.router_deploy import one_at_a_time
    return one_at_a_time(front, scope.rollout or ALL_AT_ONCE, reach.progress(""))


__all__ = ["ALL", "Reach", "Scope", "behind", "host_within", "refuse_split", "rolled_out", "router_in_front",
           "run_each", "select"]
