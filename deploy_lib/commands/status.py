"""A host's status: its current release, the unit, readiness, GPUs, venv, crashes and drift, in one read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.commands.releases import downtime_by_release, startup_by_release
from deploy_lib.deploy.plan import detect_drift
from deploy_lib.deploy.project import Target
from deploy_lib.errors import PreflightError
from deploy_lib.facts.crashes import CrashReport, crash_loop_advice
from deploy_lib.facts.host import FactRequest, Gpu
from deploy_lib.gpu_check import parse_topology_results, topology_steps
from deploy_lib.gpu_check.p2p.verdict import P2pVerdict, p2p_verdict
from deploy_lib.health import Rung, Snapshot, http_url, parse_snapshot, probe_step, reachable_host
from deploy_lib.health.downtime import Downtime
from deploy_lib.host import p2p_reading
from deploy_lib.host.facts import read_crashes, read_host_facts, record_crashes
from deploy_lib.host.p2p_reading import NodeReader
from deploy_lib.host.switch import probe_target
from deploy_lib.host.venv_lifecycle import STATUS_DISTRIBUTIONS
from deploy_lib.metrics.live import LiveLoad, metrics_step, parse_metrics_result
from deploy_lib.models.page_cache import measure_step, parse_residency, residency_line, weights_root
from deploy_lib.profile import read_stored_profile
from deploy_lib.remote import Remote, StepResult
from deploy_lib.remote.readings import Fact, Readings, read
from deploy_lib.store import ACTIVATIONS, FAILED, StoreFacts
from deploy_lib.venvs import InstalledFacts, installed_fact


@dataclass(frozen=True)
class StatusReport:
    host: str
    service: str
    current: str | None
    current_age_s: float | None
    metadata: Mapping[str, Any]
    unit_state: str
    readiness: str
    gpus: tuple[Gpu, ...] | None
    gpu_error: str | None
    lock_holder: str | None
    venv_versions: Mapping[str, str]  # STATUS_DISTRIBUTIONS installed in the release's venv, in that order
    restarts: int = 0                   # systemd's NRestarts: automatic restarts since the deploy's start
    crashes: CrashReport | None = None  # the current release's crashes since its deploy; None: none
    advice: str | None = None           # what to do about a release left down by crashes
    venv_sources: Mapping[str, str] = field(default_factory=dict)  # distribution -> "editable: DIR" / "copy of DIR"
    current_problem: str | None = None  # "current release X is damaged: ..." / "... is missing: ..."
    endpoint: str | None = None         # where clients reach the current release
    drift: tuple[str, ...] = ()         # hand edits since the last deploy (a deploy refuses them without --force)
    topology: str | None = None         # the GPUs' links and P2P support in one line (gpu-check's reading)
    venv_problem: str | None = None     # why the release's venv's packages could not be read (its python is gone)
    last_start: str = ""                # the current release's newest start's phases (health.startup)
    last_downtime: Downtime | None = None  # the newest switch to the current release that stopped a running server
    verified: bool = True               # history records the current release's last start healthy
    peer_to_peer: P2pVerdict | None = None  # which GPU pairs have P2P, the cause and fix for the others
    recorded_crashes: int = 0           # history lines this read added for crashes it found first
    live_load: LiveLoad | None = None   # running / queued requests, KV usage, generation rate, from /metrics
    live_load_problem: str | None = None  # why there is none: features.metrics off, /metrics not served or not read
    weights_cache: str | None = None    # how much of the current release's weights the page cache holds


def serving_endpoint(metadata: Mapping[str, Any], host_address: str) -> str | None:
    """The URL clients use for a release: its --host, or the inventory's address when it listens on all of them."""
    server = dict(dict(metadata.get("profile") or {}).get("server") or {})
    if "port" not in server:
        return None
    return http_url(reachable_host(str(server.get("host", "")), host_address), server["port"])


def _age_s(iso: str, now: datetime) -> float | None:
    try:
        return (now - datetime.fromisoformat(iso)).total_seconds()
    except ValueError:
        return None


def _readiness(snapshot: Snapshot) -> str:
    if not snapshot.port_open:
        return "port closed"
    if snapshot.health_status == 200:
        return "ready (health 200)"
    return f"not ready (health {snapshot.health_status or snapshot.health_error})"


def read_status(target: Target, service: str, remote: Remote, now: datetime | None = None,
                peer_to_peer: NodeReader | None = None) -> StatusReport:
    """The host's status; with `peer_to_peer` (the reader of the host's Proxmox node) also the peer-to-peer verdict,
    its VM-side reads in the round trip of the topology."""
    layout = target.layout(service)
    facts = read_host_facts(remote, FactRequest(layout, venv=None, port=None))
    record = facts.store.release(facts.store.current) if facts.store.current else None
    metadata = record.metadata if record else {}
    readiness = "no release deployed" if facts.store.current is None else "not probed: the release is unreadable"
    live_load: LiveLoad | None = None
    live_load_problem: str | None = None
    parallel = read_stored_profile(metadata.get("profile")).parallel if record else None
    if parallel is not None and parallel.node_rank > 0:  # SGLang serves HTTP on node rank 0 only
        readiness = f"node rank {parallel.node_rank} of {parallel.nnodes}: no HTTP here (node rank 0 serves it); " \
                    f"unit {facts.unit.active_state}"
    elif record is not None:
        probe = probe_target(layout, metadata, environ={}, generation=False)  # /ready or /health: no API key
        metrics_on = read_stored_profile(metadata.get("profile")).features.metrics
        results = remote.run([probe_step(probe, Rung.HEALTH), *([metrics_step(probe)] if metrics_on else [])])
        readiness = _readiness(parse_snapshot(results[0], Rung.HEALTH))
        live_load, live_load_problem = _live_load(results[1:], metrics_on)
    lock = facts.store.lock
    crashes, recorded = None, 0
    if record is not None:  # a deploy holding the lock owns the unit's restarts (its ladder reports them)
        crashes = read_crashes(remote, layout, facts.unit)
        recorded = record_crashes(remote, layout, facts.store, crashes) if lock is None else 0
    venv = PurePosixPath(str(metadata["venv"])) if metadata.get("venv") else None
    topology = topology_steps()
    packages = installed_fact(venv, STATUS_DISTRIBUTIONS, ()) if venv else None
    p2p_reads = p2p_reading.vm_steps() if peer_to_peer is not None else []
    root = weights_root(dict(metadata.get("model") or {}))
    page_cache = [measure_step(root)] if root else []
    readings = read(remote, [*topology, *([packages] if packages else []), *p2p_reads, *page_cache])
    links, links_error = parse_topology_results([readings[step.name] for step in topology])
    verdict = None
    if peer_to_peer is not None:
        side, unread = p2p_reading.parse_vm_side(readings, links, tuple(gpu.name for gpu in facts.gpus or ()), {})
        verdict = p2p_reading.with_unread(p2p_verdict(side, peer_to_peer(target), metadata.get("environment") or {}),
                                          unread)
    installed, venv_problem = _installed(readings, packages)
    verified = record is None or facts.store.verified_since_switch(record.id)
    unverified = not_verified(facts.store, record.id) if record is not None and not verified else None
    advice = [crash_loop_advice(crashes, facts.store), unverified]
    return StatusReport(
        verified=verified, advice="; ".join(filter(None, advice)) or None,
        restarts=facts.unit.n_restarts, crashes=crashes, recorded_crashes=recorded,
        venv_versions={name: installed.versions[name] for name in STATUS_DISTRIBUTIONS
                       if name in installed.versions} if installed else {},
        venv_sources={name: installed.origins[name].describe() for name in STATUS_DISTRIBUTIONS
                      if name in installed.origins} if installed else {},
        venv_problem=venv_problem,
        host=target.host.name, service=service, current=facts.store.current,
        current_age_s=_age_s(record.staged_at, now or datetime.now(UTC)) if record else None,
        metadata=metadata, unit_state=f"{facts.unit.active_state}/{facts.unit.sub_state}", readiness=readiness,
        endpoint=serving_endpoint(metadata, target.host.address), drift=detect_drift(layout, facts),
        gpus=facts.gpus, gpu_error=facts.gpu_error,
        lock_holder=(str(lock.owner) if lock.owner else "unknown owner") if lock else None,
        current_problem=facts.store.current_problem(),
        topology=links.one_line() if links else links_error, peer_to_peer=verdict,
        last_start=startup_by_release(facts.store.history).get(facts.store.current or "", ""),
        last_downtime=downtime_by_release(facts.store.history).get(facts.store.current or ""),
        live_load=live_load, live_load_problem=live_load_problem,
        weights_cache=residency_line(f"release {record.id}", parse_residency(readings[page_cache[0].name]))
        if record is not None and page_cache else None)


def _live_load(results: Sequence[StepResult], metrics_on: bool) -> tuple[LiveLoad | None, str | None]:
    """The load /metrics shows now, or why it is not shown."""
    if not metrics_on:
        return None, "not served: the release has features.metrics off (set it true to see the live load)"
    read = parse_metrics_result(results[0], at_s=0.0)
    return (None, read) if isinstance(read, str) else (LiveLoad.of(read), None)


def not_verified(store: StoreFacts, current: str) -> str:
    """Why history holds no healthy start of the current release since it became current: a failed verification
    whose rollback did not finish (the connection lost, or the command killed), or a switch never verified."""
    latest = next((entry for entry in reversed(store.history) if entry.event in ACTIVATIONS), None)
    if latest is None or latest.outcome != FAILED:
        return (f"release {current} was switched to but never verified (the command that switched it did not "
                "finish: killed, or the host went down); systemd starts it at boot all the same. `invoke deploy` of "
                "its profile verifies it, or rolls back if it does not come up")
    failed, back = latest.tags.release, store.last_healthy(exclude=latest.tags.release)
    said = f"release {failed} failed its verification ({latest.event}, {latest.when}: {latest.cause or 'no cause'})"
    if failed != current:  # the switch back happened, its verification was never recorded
        return (f"{said}; release {current} is current again, but the rollback that switched back to it did not "
                f"finish (the connection lost, or the command killed): it was not verified since. `invoke rollback "
                f"--to {current}` verifies it")
    if back is None or latest.event == "rollback":  # nothing to go back to, or the rollback itself failed
        return f"{said}, and nothing was verified since: release {current} is current" + (
            f"; `invoke rollback --to {back}` goes back to release {back}, the last healthy one" if back else
            "; no other healthy release is on the host to go back to: fix the profile and deploy it again")
    return (f"{said}; release {current} is still current: the rollback to release {back} after it did not finish (the "
            f"connection lost, or the command killed). `invoke rollback --to {back}` finishes it")


def _installed(readings: Readings, packages: Fact[InstalledFacts] | None) -> tuple[InstalledFacts | None, str | None]:
    """The release's venv's packages, or why they cannot be read: status reports a venv whose python is gone."""
    if packages is None:
        return None, None
    try:
        return readings.value(packages), None
    except PreflightError as unreadable:
        return None, unreadable.message


