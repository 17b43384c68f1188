"""Removing what the tool put on a host: `invoke uninstall` (unit link, release store, managed venvs, caches, after
keeping a copy of the history and release records on the machine running the tool) and `invoke venv.remove`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from deploy_lib.deploy.preflight import refuse_one_node
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError
from deploy_lib.facts.host import FactRequest, HostFacts
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.store import host_lock, read_store_facts, release_quietly, take_lock
from deploy_lib.host.venv_lifecycle import PrunePlan, prune_steps, removal_plan
from deploy_lib.host.venv_store import parse_store_facts as parse_venv_store_facts
from deploy_lib.host.venv_store import store_fact_steps as venv_store_fact_steps
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.remote.readings import ABSENT_OK
from deploy_lib.store import RELEASE_FILE, UNIT_FILE, LockContext, StoreLayout, this_process_owner
from deploy_lib.venvs import release_venv_hash

HISTORY_COPY = "history.jsonl"


@dataclass(frozen=True)
class Uninstalled:
    host: str
    service: str
    removed: tuple[str, ...]     # what went, as a person reads it
    kept_on_host: tuple[str, ...]  # what was left because the tool did not make it
    copy: Path                   # the local copy of history and release records


def ours(layout: StoreLayout, facts: HostFacts) -> bool:
    """The unit file in /etc/systemd/system is the tool's link to the current release (not a hand-made unit)."""
    return facts.unit_link == str(layout.current / UNIT_FILE)


def removal_steps(layout: StoreLayout, remove_unit: bool) -> list[Step | Put]:
    """Stop and disable our unit and drop its link (a unit the tool did not make is left alone), then the whole
    store: releases, venvs, caches, history and the lock."""
    unit = layout.unit_name
    steps: list[Step | Put] = [
        Step("uninstall: stop", ("systemctl", "stop", "--", unit), sudo=True, ok=frozenset({0, 5}), timeout_s=300),
        Step("uninstall: disable", ("systemctl", "disable", "--", unit), sudo=True, ok=frozenset({0, 1})),
        Step("uninstall: unit link", ("rm", "-f", "--", str(layout.unit_link)), sudo=True),
        Step("uninstall: daemon-reload", ("systemctl", "daemon-reload"), sudo=True),
        Step("uninstall: reset-failed", ("systemctl", "reset-failed", "--", unit), sudo=True, ok=frozenset({0, 1})),
    ] if remove_unit else []
    return [*steps, Step("uninstall: release store", ("rm", "-rf", "--", str(layout.base)), sudo=True, timeout_s=600)]


def local_state_dir(environ: Mapping[str, str]) -> Path:
    """Where the tool keeps things on the machine running it: $XDG_STATE_HOME/sglang-deploy (~/.local/state)."""
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "sglang-deploy"


def local_copy_dir(state_dir: Path, host: str, service: str, now: datetime) -> Path:
    return state_dir / "uninstalled" / f"{host}-{service}-{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def uninstall(target: Target, service: str, remote: Remote, state_dir: Path, now: datetime | None = None,
              before_stop: Callable[[], None] | None = None, alone: bool = True) -> Uninstalled:
    """Copy history and release records to `state_dir`, then remove the service's store and unit under the lock.
    `before_stop` runs under the lock just before the tool's unit stops (a router takes the replica out); a unit
    the tool did not make is left running, so it is not called then. A host `alone` (not one of a group removed
    together) is refused, with nothing changed, when its current release is one node of a multi-node release."""
    layout = target.layout(service)
    facts = read_host_facts(remote, FactRequest(layout, venv=None, port=None))
    if facts.store.current is None and not facts.store.releases and not facts.store.history:
        raise ConfigError(f"{target.host.name}: nothing of service {service} is installed under {layout.base}",
                          "`invoke status` shows what the host runs")
    if alone:
        refuse_one_node(facts.store, (facts.store.current,), target.host.name, "uninstalled",
                        "`invoke uninstall --group G` removes every node of the release together")
    [history] = remote.run([Step("uninstall: read history", ("cat", "--", str(layout.history)), sudo=True,
                                 ok=ABSENT_OK)])
    copy = local_copy_dir(state_dir, target.host.name, service, now or datetime.now(UTC))
    copy.mkdir(parents=True, exist_ok=False)
    (copy / HISTORY_COPY).write_text(history.stdout)
    for record in facts.store.releases:
        (copy / f"{record.id}.{RELEASE_FILE}").write_text(json.dumps(record.metadata, indent=2) + "\n")
    foreign_unit = not ours(layout, facts) and (facts.unit_link is not None or facts.unit.load_state == "loaded")
    owner = this_process_owner("uninstall", now or datetime.now(UTC))
    take_lock(remote, layout, owner, LockContext(where=target.host.name))
    if before_stop is not None and not foreign_unit:
        try:
            before_stop()
        except BaseException:  # nothing was removed: the lock goes, as any command's does
            release_quietly(remote, layout, owner)
            raise
    remote.run(removal_steps(layout, remove_unit=not foreign_unit))  # removing the store removes the lock too
    store = f"{layout.base} ({len(facts.store.releases)} releases, managed venvs, caches, history)"
    return Uninstalled(host=target.host.name, service=service,
                       removed=(store,) if foreign_unit else (f"unit {layout.unit_name} (stopped, disabled)", store),
                       kept_on_host=(f"{layout.unit_link}: not made by the tool, left as it is",) if foreign_unit
                       else (), copy=copy)


def remove_venv(target: Target, service: str, remote: Remote, venv_hash: str) -> PrunePlan:
    """Remove one managed venv (an adopted one too: ordinary deploys never prune those) and its caches, unless a
    release on the host or a derived venv still needs it; what was removed."""
    layout = target.layout(service)
    with host_lock(remote, layout, f"venv.remove {venv_hash}", target.host.name):
        releases = {r.id: release_venv_hash(layout, str(r.metadata.get("venv", "")))
                    for r in read_store_facts(remote, layout).releases}
        venv_store = parse_venv_store_facts(layout, remote.run(venv_store_fact_steps(layout)))
        plan = removal_plan(venv_store, venv_hash, releases)
        remote.run(prune_steps(layout, plan))
    return plan
