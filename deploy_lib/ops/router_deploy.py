"""The router's own release on its host: build its venv from the lock, stage, switch, restart, wait until it
answers, record it in its store's history; a router that does not answer is switched back to the release before.

The store is the server's layout under another service name (`sglang-router`): releases/, current, history.jsonl,
lock/ and /etc/systemd/system/sglang-router.service, so `invoke releases -s sglang-router`, `logs` and `status`
read it as they read the server's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, TypeVar

from deploy_lib.deploy import restart_steps
from deploy_lib.errors import DeployError, LockHeld, RouterFailed
from deploy_lib.inventory import Inventory
from deploy_lib.ops.fleet import Rollout, Size
from deploy_lib.ops.router import (
    READY_DEADLINE_S,
    SERVICE,
    RouterMembership,
    RouterRelease,
    RouterSite,
    build_router_release,
    parse_answer,
    router_site,
    router_step,
    serving_step,
    serving_url,
)
from deploy_lib.profile.settings import VenvSpec
from deploy_lib.progress import Progress
from deploy_lib.project import Target, resolve_target
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.store import (
    FAILED,
    HEALTHY,
    StoreLayout,
    Tags,
    append_history,
    history_entry,
    host_lock,
    operator_name,
    read_store_facts,
    release_json,
    stage_release,
    switch_current,
)
from deploy_lib.venvs import ensure_venv

T = TypeVar("T")
LeftOut = Literal["stopped", "uninstalled"]
# what a note says of a replica a transition leaves out of the router ({router}: the router's host)
LEFT_OUT: dict[LeftOut, str] = {
    "stopped": "stays out of the router on {router} until `invoke start` serves it again",
    "uninstalled": "is removed from the router on {router}: its server is uninstalled; the router's own release "
                   "still names it in --worker-urls until the host leaves the router's group in the inventory and "
                   "`invoke router.deploy` renders the router again",
}


@dataclass(frozen=True)
class RouterOutcome:
    action: str               # deployed | unchanged
    release_id: str
    previous_id: str | None
    workers: tuple[str, ...]


def deploy_router(site: RouterSite, target: Target, remote: Remote, workers: Sequence[str], group: str,
                  progress: Progress) -> RouterOutcome:
    """Take the router's host to the router release serving `workers`; RouterFailed when it does not answer."""
    layout = target.layout(SERVICE)
    where = target.host.name
    with host_lock(remote, layout, f"router deploy for {group}", where):
        spec = VenvSpec(lock=site.lock, wheelhouse=site.wheelhouse, index=site.index)
        venv = ensure_venv(remote, layout, spec, progress=progress, where=where)
        store = read_store_facts(remote, layout)
        release = build_router_release(site, venv.path, venv.hash, workers, layout.env_file, group)
        tags = Tags(operator_name(), where, release.id, SERVICE, venv.hash,
                    {name: venv.distributions[name] for name in ("sglang-router",) if name in venv.distributions})
        if store.current == release.id and _answers(remote, site, deadline_s=5):
            return RouterOutcome("unchanged", release.id, store.current, tuple(workers))
        staged = [] if store.release(release.id) else stage_release(
            layout, release.id, release.unit_text, release.env_text,
            release_json(release.metadata, tags, datetime.now(UTC)))
        _activate(remote, layout, release, staged, progress)
        if _answers(remote, site, READY_DEADLINE_S):
            remote.run(append_history(layout, history_entry("deploy", HEALTHY, tags, datetime.now(UTC))))
            return RouterOutcome("deployed", release.id, store.current, tuple(workers))
        remote.run(append_history(layout, history_entry("deploy", FAILED, tags, datetime.now(UTC),
                                                        "the router did not answer /health")))
        back = ""
        if store.current and store.current != release.id:
            progress.note(f"router: switching back to release {store.current}")
            remote.run([*switch_current(layout, store.current), *restart_steps(layout)])
            back = f"; switched back to release {store.current}" + \
                ("" if _answers(remote, site, READY_DEADLINE_S) else ", which does not answer either")
        raise RouterFailed(f"{where}: router release {release.id} did not answer /health on port {site.port} within "
                           f"{READY_DEADLINE_S:.0f} s{back}",
                           hint=f"its journal: `invoke logs -H {where} -s {SERVICE}`")


def _activate(remote: Remote, layout: StoreLayout, release: RouterRelease, staged: Sequence[Step | Put],
              progress: Progress) -> None:
    name = "router: stage, switch and restart" if staged else "router: switch and restart"
    progress.phase_started(name)
    started = time.monotonic()
    remote.run([*staged, *switch_current(layout, release.id), *restart_steps(layout)])
    progress.step_done(name, round(time.monotonic() - started, 3))


def _answers(remote: Remote, site: RouterSite, deadline_s: float) -> bool:
    try:
        parse_answer(remote.run([router_step(site, "ready", deadline_s=deadline_s)])[0], site, "waiting for /health")
    except RouterFailed:
        return False
    return True


@dataclass(frozen=True)
class RouterFront:
    """The router in front of some replicas, its host, and how to open a connection to that host."""

    site: RouterSite
    target: Target
    connect: Callable[[Target], AbstractContextManager[Remote]]


def router_in_front(inventory: Inventory, targets: Sequence[Target], accept_new_host_key: bool,
                    connect: Callable[[Target], AbstractContextManager[Remote]]) -> RouterFront | None:
    """The router the hosts' `router` var names (one router for all of them), or None when none names one."""
    site = router_site(inventory, [target.host for target in targets])
    if site is None:
        return None
    return RouterFront(site, resolve_target(inventory, site.host.name, accept_new_host_key), connect)


def one_at_a_time(front: RouterFront | None, rollout: Rollout, progress: Progress) -> Rollout:
    """A group behind a router without --serial goes one replica at a time: all at once would leave the router no
    worker while they restart. A --serial given is kept (--serial 100% takes every replica out at once)."""
    if front is None or rollout.serial:
        return rollout
    progress.note(f"router: the replicas behind {front.site.host.name}:{front.site.port} restart one at a time "
                  "(--serial 1), so the others serve meanwhile; --serial N or N% restarts more at once")
    return replace(rollout, serial=(Size(1),))


def behind_router(front: RouterFront | None, target: Target, service: str, remote: Remote, progress: Progress,
                  transition: Callable[[Callable[[], None] | None], T], leaves_out: LeftOut | None = None) -> T:
    """A replica's deploy, rollback, start, restart or gpu-check (`transition(before_restart)`) with the router around
    it: the replica is taken out of the router just before its server stops, and once the host serves a verified
    release again (the new one, or the one a failed start went back to) it is added back; `leaves_out` keeps it out
    after a transition that ends with no server (a stop: until a start; an uninstall: for good), and a note says so.
    A replica left stopped stays out, and the error says so. The router's host is connected to only when the server
    stops; without a router, or for the router's own service (`rollback -s sglang-router` on its host), the
    transition runs as it is."""
    if front is None or service == SERVICE:
        return transition(None)
    layout = target.layout(service)
    with ExitStack() as connections:
        opened: list[Remote] = []

        def router_remote() -> Remote:
            if not opened:
                opened.append(connections.enter_context(front.connect(front.target)))
            return opened[0]
        membership = RouterMembership(front.site, router_remote,
                                      lambda: serving_url(target.host, remote.run([serving_step(layout)])[0]),
                                      progress)
        try:
            outcome = transition(membership.before_restart)
        except DeployError as failed:
            # LockHeld after the drain: a lock taken with the first change found the store changed; nothing was
            if failed.serving_id is not None or isinstance(failed, LockHeld):
                membership.readmit()
            elif membership.taken_out is not None:
                failed.message += f"; {membership.taken_out} is left out of the router on {front.site.host.name} " \
                                  "(not serving)"
            raise
        if leaves_out is not None:
            if membership.taken_out is not None:
                said = LEFT_OUT[leaves_out].format(router=front.site.host.name)
                progress.note(f"router: {membership.taken_out} {said}")
            return outcome
        try:
            membership.readmit()
        except DeployError as failed:  # the host serves its new release, outside the router
            failed.serving_id = getattr(outcome, "release_id", None)
            raise
        return outcome


__all__ = ["LEFT_OUT", "LeftOut", "RouterFront", "RouterOutcome", "behind_router", "deploy_router", "one_at_a_time",
           "router_in_front"]
