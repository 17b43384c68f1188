"""The router's own release on its host: build its venv from the lock, stage, switch, restart, wait until it
answers, record it in its store's history; a router that does not answer is switched back to the release before.

The store is the server's layout under another service name (`sglang-router`): releases/, current, history.jsonl,
lock/ and /etc/systemd/system/sglang-router.service, so `invoke releases -s sglang-router`, `logs` and `status`
read it as they read the server's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from deploy_lib.deploy import restart_steps
from deploy_lib.deploy.preflight import rollback_record
from deploy_lib.errors import DeployError, RouterFailed
from deploy_lib.profile import read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.project import Target
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.router import (
    READY_DEADLINE_S,
    SERVICE,
    RouterMembership,
    RouterRelease,
    RouterSite,
    build_router_release,
    parse_answer,
    router_step,
)
from deploy_lib.settings import VenvSpec
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


def behind_router(site: RouterSite, router_target: Target, connect: Callable[[Target], AbstractContextManager[Remote]],
                  worker: str, progress: Progress, deploy_one: Callable[[Callable[[], None]], T]) -> T:
    """A replica's deploy with the router around it: `deploy_one(before_restart)` takes the replica out of the
    router just before its server stops; once the host serves a verified release again (the new one, or the one a
    failed deploy rolled back to) it is added back. A replica left stopped stays out, and the error says so."""
    with connect(router_target) as router_remote:
        membership = RouterMembership(site, router_remote, worker, progress)
        try:
            outcome = deploy_one(membership.before_restart)
        except DeployError as failed:
            if membership.removed and failed.serving_id is not None:
                membership.readmit()
            elif membership.removed:
                failed.message += f"; {worker} is left out of the router on {site.host.name} (not serving)"
            raise
        try:
            membership.readmit()
        except RouterFailed as failed:  # the host serves its new release, outside the router
            failed.serving_id = getattr(outcome, "release_id", None)
            raise
        return outcome


def rollback_port(target: Target, service: str, remote: Remote, to: str | None) -> int:
    """The server port of the release a rollback of this replica switches to (its stored profile's), for the
    replica's URL in the router; the rollback's own refusals (no such release, a damaged one) come from here first."""
    layout = target.layout(service)
    record = rollback_record(read_store_facts(remote, layout), to, target.host.name, layout)
    return read_stored_profile(record.metadata.get("profile")).server.port


__all__ = ["RouterOutcome", "behind_router", "deploy_router", "rollback_port"]
