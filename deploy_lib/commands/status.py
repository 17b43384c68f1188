"""Read-only views of a host: status, the releases on it, the server's log."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from deploy_lib.deploy.plan import detect_drift
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts.crashes import CrashReport, crash_loop_advice, read_crashes, record_crashes
from deploy_lib.facts.diagnose import journal_argv, journal_step
from deploy_lib.facts.host import FactRequest, Gpu
from deploy_lib.gpu_check import parse_topology_results, topology_steps
from deploy_lib.gpu_check.p2p.verdict import P2pVerdict, p2p_verdict
from deploy_lib.health import Rung, Snapshot, http_url, parse_snapshot, probe_step, reachable_host
from deploy_lib.health.startup import startup_line
from deploy_lib.host import p2p_reading
from deploy_lib.host.benchmark import bench_on_demand
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.models_stored import StoredModel, read_stored
from deploy_lib.host.p2p_reading import NodeReader
from deploy_lib.host.store import host_lock, read_store_facts
from deploy_lib.host.switch import probe_target
from deploy_lib.host.venv_lifecycle import STATUS_DISTRIBUTIONS, VenvRecord, list_venvs
from deploy_lib.profile import LoadedProfile, Profile, format_validation_error, read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote, Step
from deploy_lib.remote.readings import Fact, Readings, read
from deploy_lib.store import ACTIVATIONS, FAILED, RELEASE_FILE, HistoryEntry, StoreFacts, Tags
from deploy_lib.throughput import BenchResult, ComparisonRow, compare_releases, power_by_release, throughput_by_release
from deploy_lib.venvs import InstalledFacts, installed_fact, release_venv_hash


@dataclass(frozen=True)
class ReleaseRow:
    id: str
    staged_at: str
    profile: str
    sglang_version: str
    outcome: str
    is_current: bool
    throughput: str  # the newest benchmark's output tok/s per concurrency level
    gpu_power: str = ""  # the GPUs' power draw during that benchmark
    last_start: str = ""  # the newest start's phases: "weights 2m10s, cuda graphs 1m05s, first generation 0.2 s"


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
    verified: bool = True               # history records the current release's last start healthy
    peer_to_peer: P2pVerdict | None = None  # which GPU pairs have P2P, the cause and fix for the others
    recorded_crashes: int = 0           # history lines this read added for crashes it found first


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


def startup_by_release(history: Sequence[HistoryEntry]) -> dict[str, str]:
    """Each release's newest start (any activation) that recorded its phases, as `startup_line` says it."""
    lines: dict[str, str] = {}
    for entry in history:
        if entry.event in ACTIVATIONS and (line := startup_line(entry.timings)):
            lines[entry.tags.release] = line
    return lines


def release_rows(store: StoreFacts) -> list[ReleaseRow]:
    outcomes = store.outcomes()
    throughput = throughput_by_release(store.history)
    power = power_by_release(store.history)
    starts = startup_by_release(store.history)
    rows = [ReleaseRow(id=r.id, staged_at=r.staged_at, profile=str(r.metadata.get("profile_name", "?")),
                       sglang_version=str(r.metadata.get("sglang_version", "?")),
                       outcome=outcomes.get(r.id, "never started"), is_current=r.id == store.current,
                       throughput=throughput.get(r.id, ""), gpu_power=power.get(r.id, ""),
                       last_start=starts.get(r.id, ""))
            for r in store.releases]
    return rows + [ReleaseRow(id=d.id, staged_at="", profile="?", sglang_version="?", outcome=f"damaged ({d.reason})",
                              is_current=d.id == store.current, throughput="") for d in store.damaged]


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
    parallel = read_stored_profile(metadata.get("profile")).parallel if record else None
    if parallel is not None and parallel.node_rank > 0:  # SGLang serves HTTP on node rank 0 only
        readiness = f"node rank {parallel.node_rank} of {parallel.nnodes}: no HTTP here (node rank 0 serves it); " \
                    f"unit {facts.unit.active_state}"
    elif record is not None:
        probe = probe_target(layout, metadata, environ={}, generation=False)  # /ready or /health: no API key
        [result] = remote.run([probe_step(probe, Rung.HEALTH)])
        readiness = _readiness(parse_snapshot(result, Rung.HEALTH))
    lock = facts.store.lock
    crashes, recorded = None, 0
    if record is not None:  # a deploy holding the lock owns the unit's restarts (its ladder reports them)
        crashes = read_crashes(remote, layout, facts.unit)
        recorded = record_crashes(remote, layout, facts.store, crashes) if lock is None else 0
    venv = PurePosixPath(str(metadata["venv"])) if metadata.get("venv") else None
    topology = topology_steps()
    packages = installed_fact(venv, STATUS_DISTRIBUTIONS, ()) if venv else None
    p2p_reads = p2p_reading.vm_steps() if peer_to_peer is not None else []
    readings = read(remote, [*topology, *([packages] if packages else []), *p2p_reads])
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
        last_start=startup_by_release(facts.store.history).get(facts.store.current or "", ""))


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


def list_releases(target: Target, service: str, remote: Remote) -> list[ReleaseRow]:
    layout = target.layout(service)
    return release_rows(read_store_facts(remote, layout))


def read_log(target: Target, service: str, remote: Remote, lines: int) -> list[str]:
    layout = target.layout(service)
    [result] = remote.run([journal_step(layout.unit_name, max_lines=lines)])
    return result.stdout.splitlines()


def follow_log(target: Target, service: str, remote: Remote, lines: int, poll_s: float = 1.0,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The last `lines` lines, then new ones as they come (polled over the open connection) until interrupted."""
    layout = target.layout(service)
    cursor: str | None = None
    count = lines
    while True:
        after = (f"--after-cursor={cursor}",) if cursor else ()
        argv = journal_argv(layout.unit_name, count, "--show-cursor", *after)
        [result] = remote.run([Step("follow journal", argv, sudo=True, timeout_s=30)])
        for line in result.stdout.splitlines():
            if line.startswith("-- cursor: "):
                cursor = line.removeprefix("-- cursor: ")
            else:
                yield line
        count = 10_000
        sleep(poll_s)


def list_managed_venvs(target: Target, service: str, remote: Remote) -> list[VenvRecord]:
    """The host's managed venvs with the releases that use them."""
    layout = target.layout(service)
    store = read_store_facts(remote, layout)
    return list_venvs(remote, layout, {r.id: release_venv_hash(layout, str(r.metadata.get("venv", "")))
                                       for r in store.releases})


def current_profile(target: Target, service: str, remote: Remote) -> LoadedProfile:
    """The profile the host's current release was deployed from (its release.json keeps it whole)."""
    layout = target.layout(service)
    store = read_store_facts(remote, layout)
    record = store.release(store.current) if store.current else None
    if record is None:
        raise ConfigError(f"{target.host.name}: no release of {service} is deployed, so no profile is in use",
                          "give --profile NAME (or a path), or --service for another service")
    name = str(record.metadata.get("profile_name") or record.id)
    source = f"{target.host.name}: {layout.release(record.id) / RELEASE_FILE}: profile"
    try:
        profile = Profile.model_validate(record.metadata.get("profile") or {})
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err), "give --profile NAME (or a path)") from None
    return LoadedProfile(name=name, path=Path(str(layout.release(record.id) / RELEASE_FILE)), chain=(name,),
                         profile=profile)


def list_models(target: Target, service: str, remote: Remote) -> list[StoredModel]:
    """Model revisions and pushed versions in the places the host's releases keep weights, with their users."""
    store = read_store_facts(remote, target.layout(service))
    return read_stored(remote, store.releases)


def bench_current(target: Target, loaded: LoadedProfile, remote: Remote, environ: Mapping[str, str],
                  progress: Progress) -> BenchResult:
    """`invoke bench`: SGLang's serving benchmark against the current release, recorded in history.

    Under the host's lock: no deploy restarts the server under the benchmark, and its files and history line are
    written like any other change."""
    layout = target.layout(loaded.profile.service.name)
    with host_lock(remote, layout, "benchmark", target.host.name):
        store = read_store_facts(remote, layout)
        record = store.release(store.current) if store.current else None
        if record is None:
            raise ConfigError(f"{target.host.name}: {store.current_problem() or 'no release is deployed'}",
                              "`invoke deploy` first")
        probe = probe_target(layout, record.metadata, environ)
        return bench_on_demand(remote, layout, record.metadata, Tags.from_dict(record.metadata["tags"]),
                               loaded.profile.bench, progress, probe.api_key)


def compare_benchmarks(target: Target, service: str, remote: Remote, releases: Sequence[str]
                       ) -> tuple[list[BenchResult], list[ComparisonRow]]:
    layout = target.layout(service)
    return compare_releases(read_store_facts(remote, layout).history, releases)
