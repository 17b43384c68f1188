"""The router's own release on its host: build its venv from the lock, stage, then the server's own path
(deploy/switch.Transition): switch, restart, the readiness ladder with the router's probe, history; a router that
does not come up is restored to its last healthy release and verified the same way.

The store is the server's layout under another service name (`sglang-router`): releases/, current, history.jsonl,
lock/ and /etc/systemd/system/sglang-router.service, so `invoke releases -s sglang-router`, `logs` and `status`
read it as they read the server's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, cast

from deploy_lib.commands.deploy import Outcome
from deploy_lib.deploy.plan import SwitchBatches, start_prediction, switch_batches
from deploy_lib.deploy.project import Target, resolve_target
from deploy_lib.errors import DeployError, LockHeld, ReadinessFailed, RouterFailed
from deploy_lib.health import ProbeTarget, Ready, Rung
from deploy_lib.host.restore import restore
from deploy_lib.host.store import host_lock, read_store_facts
from deploy_lib.host.switch import GRACE_S, Readiness, Transition, failure_line, interruption
from deploy_lib.host.venv_build import ensure_venv
from deploy_lib.interrupts import signals_raise
from deploy_lib.inventory.model import Inventory
from deploy_lib.metrics.router_counters import ClientsSaw
from deploy_lib.ops.fleet import Rollout, Size
from deploy_lib.ops.router import (
    READY_DEADLINE_S,
    ROUTER_STOP_TIMEOUT_S,
    SERVICE,
    RouterMembership,
    RouterRelease,
    RouterSite,
    admit_workers,
    build_router_release,
    router_probe,
    router_site,
    serving_step,
    serving_url,
)
from deploy_lib.outcomes import Action
from deploy_lib.profile.settings import VenvSpec
from deploy_lib.progress import Progress
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.store import (
    FAILED,
    HEALTHY,
    StoreFacts,
    StoreLayout,
    Tags,
    append_history,
    history_entry,
    operator_name,
    release_json,
    stage_release,
)

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
    action: Action            # deployed | unchanged
    release_id: str
    previous_id: str | None
    workers: tuple[str, ...]
    not_serving: tuple[str, ...]  # workers that did not answer their /health: the router lists them once they serve


class RouterReleaseKind:
    """The router's release as a Transition switches it: verified by the router's probe (`router_probe`: unit,
    port, /health) within READY_DEADLINE_S; switched back to with the plain switch and restart (its venv is the
    store's own, built from the lock; no GPU or port preflight applies)."""

    def readiness(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]) -> Readiness:
        return Readiness(router_probe(layout, metadata), Rung.HEALTH, READY_DEADLINE_S)

    def live_target(self, layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str]
                    ) -> ProbeTarget:
        return router_probe(layout, metadata)

    def switch_batches(self, run: Transition, release_id: str, metadata: Mapping[str, Any]) -> SwitchBatches:
        return switch_batches(run.layout, release_id, held=False, stop_timeout_s=ROUTER_STOP_TIMEOUT_S)


ROUTER_RELEASE = RouterReleaseKind()


def deploy_router(site: RouterSite, target: Target, remote: Remote, workers: Sequence[str], group: str,
                  progress: Progress, grace_s: float = GRACE_S) -> RouterOutcome:
    """Take the router's host to the router release serving `workers`, through the same switch, readiness ladder
    and restore as a server's (deploy/switch.Transition): a router that does not come up (or a signal meanwhile)
    is switched back to its last healthy release and verified the same way; RouterFailed saying what serves now
    (RollbackFailed when that fails too: its unit is stopped). Whether deployed or unchanged, it ends with every
    serving worker listed healthy by the router (`admit_workers`)."""
    layout = target.layout(SERVICE)
    where = target.host.name
    run = Transition(remote, layout, target, progress, {}, grace_s=grace_s, kind=ROUTER_RELEASE)
    with signals_raise(), host_lock(remote, layout, f"router deploy for {group}", where):
        try:
            spec = VenvSpec(lock=site.lock, wheelhouse=site.wheelhouse, index=site.index)
            venv = ensure_venv(remote, layout, spec, progress=progress, where=where)
            store = read_store_facts(remote, layout)
            run.previous = store.current
            release = build_router_release(site, venv.path, venv.hash, workers, layout.env_file, group)
            tags = Tags(operator_name(), where, release.id, SERVICE, venv.hash,
                        {name: venv.distributions[name] for name in ("sglang-router",) if name in venv.distributions})
            if store.current == release.id and isinstance(run.live_verdict(release.metadata), Ready):
                not_serving = admit_workers(remote, site, workers, progress)
                return RouterOutcome(Action.unchanged, release.id, store.current, tuple(workers), not_serving)
            staged = [] if store.release(release.id) else stage_release(
                layout, release.id, release.unit_text, release.env_text,
                release_json(release.metadata, tags, datetime.now(UTC)))
            activate_router(run, store, release, tags, staged)
        except KeyboardInterrupt as stop:
            raise run.interrupted_outside(stop) from None
        run.record("deploy", HEALTHY, tags)
        not_serving = admit_workers(remote, site, workers, progress)
    return RouterOutcome(Action.deployed, release.id, store.current, tuple(workers), not_serving)


def activate_router(run: Transition, store: StoreFacts, release: RouterRelease, tags: Tags,
                    staged: Sequence[Step | Put]) -> None:
    """The switch to the router's release and its verification (`run.kind` is ROUTER_RELEASE); on failure or a
    signal, history records it and the restore takes the router back to its last healthy release (`store` is its
    store as read before), or stops its unit when it has none."""
    restore_id = store.last_healthy(exclude=release.id)
    try:
        run.activate(release.id, release.metadata, start_prediction(store, SERVICE), run.grace_s,
                     ROUTER_RELEASE.switch_batches(run, release.id, release.metadata), staged)
        return
    except ReadinessFailed as failure:
        diagnosis = run.journal_diagnosis(run.cursor, SERVICE)
        run.record("deploy", FAILED, tags, failure_line(failure, diagnosis))
        first: DeployError = failure
    except KeyboardInterrupt as stop:
        first, diagnosis = interruption(stop)
        run.record("deploy", FAILED, tags, diagnosis.cause)
    try:
        restore(run, store, release.id, first, diagnosis, restore_id, store.current)
    except ReadinessFailed as ended:  # the router's own failure: exit 10, as when it cannot take a replica out
        failed = RouterFailed(f"{ended.message} (the router's own release, service {SERVICE})",
                              hint=f"its journal: `invoke logs -H {run.where} -s {SERVICE}`")
        failed.about(ended.release_id, ended.previous_id, ended.timings)
        failed.serving_id = ended.serving_id
        raise failed from None


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
        read: list[StepResult] = []  # the replica's current release.json, as last read

        def router_remote() -> Remote:
            if not opened:
                opened.append(connections.enter_context(front.connect(front.target)))
            return opened[0]

        def serving() -> str | None:
            read[:] = remote.run([serving_step(layout)])
            return serving_url(target.host, read[0])

        def readmit() -> None:
            membership.readmit()
            if membership.clients is not None:
                _record_clients(remote, layout, read[0], membership.clients, progress)
        membership = RouterMembership(front.site, router_remote, serving, progress)
        try:
            outcome = transition(membership.before_restart)
        except DeployError as failed:
            # LockHeld after the drain: a lock taken with the first change found the store changed; nothing was
            if failed.serving_id is not None or isinstance(failed, LockHeld):
                readmit()
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
            readmit()
        except DeployError as failed:  # the host serves its new release, outside the router
            failed.serving_id = getattr(outcome, "release_id", None)
            raise
        if isinstance(outcome, Outcome) and membership.clients is not None:
            return cast(T, replace(outcome, clients=membership.clients))
        return outcome


def _record_clients(remote: Remote, layout: StoreLayout, release: StepResult, clients: ClientsSaw,
                   progress: Progress) -> None:
    """A `router` line in the replica's history, tagged with the release it serves now (its release.json, read for
    the add back): what the router's clients saw while it was out and back; failed when any request failed."""
    try:
        tags = Tags.from_dict(json.loads(release.stdout)["tags"])
    except (ValueError, KeyError, TypeError) as unreadable:
        progress.note(f"router: what its clients saw is not kept in history: {release.step.name} is unreadable "
                      f"({unreadable})")
        return
    entry = history_entry("router", FAILED if clients.failed else HEALTHY, tags, datetime.now(UTC),
                          clients.line(tags.host), figures=clients.figures())
    remote.run(append_history(layout, entry))


__all__ = ["LEFT_OUT", "ROUTER_RELEASE", "LeftOut", "RouterFront", "RouterOutcome", "RouterReleaseKind",
           "activate_router", "behind_router", "deploy_router", "one_at_a_time", "router_in_front"]
