"""The releases on a host, one row each (outcome, throughput, power, last start), and the profile the
current one was deployed from, read back from its release.json."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError
from deploy_lib.health.downtime import Downtime
from deploy_lib.health.startup import startup_line
from deploy_lib.host.store import read_store_facts
from deploy_lib.profile import LoadedProfile, Profile, format_validation_error
from deploy_lib.remote import Remote
from deploy_lib.store import ACTIVATIONS, RELEASE_FILE, HistoryEntry, StoreFacts
from deploy_lib.throughput import power_by_release, throughput_by_release


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
    last_downtime: Downtime | None = None  # the newest switch to it that stopped a running server


def startup_by_release(history: Sequence[HistoryEntry]) -> dict[str, str]:
    """Each release's newest start (any activation) that recorded its phases, as `startup_line` says it."""
    lines: dict[str, str] = {}
    for entry in history:
        if entry.event in ACTIVATIONS and (line := startup_line(entry.timings)):
            lines[entry.tags.release] = line
    return lines


def downtime_by_release(history: Sequence[HistoryEntry]) -> dict[str, Downtime]:
    """Each release's newest start that recorded a downtime (a history line written before downtimes were has none)."""
    downtimes: dict[str, Downtime] = {}
    for entry in history:
        if entry.event in ACTIVATIONS and (downtime := Downtime.from_timings(entry.timings)) is not None:
            downtimes[entry.tags.release] = downtime
    return downtimes


def release_rows(store: StoreFacts, workload_names: Sequence[str] = ()) -> list[ReleaseRow]:
    """Every release on the host; `workload_names` (the project's recorded workloads) name what a benchmark replayed."""
    outcomes = store.outcomes()
    throughput = throughput_by_release(store.history, workload_names)
    power = power_by_release(store.history)
    starts = startup_by_release(store.history)
    downtimes = downtime_by_release(store.history)
    rows = [ReleaseRow(id=r.id, staged_at=r.staged_at, profile=str(r.metadata.get("profile_name", "?")),
                       sglang_version=str(r.metadata.get("sglang_version", "?")),
                       outcome=outcomes.get(r.id, "never started"), is_current=r.id == store.current,
                       throughput=throughput.get(r.id, ""), gpu_power=power.get(r.id, ""),
                       last_start=starts.get(r.id, ""), last_downtime=downtimes.get(r.id))
            for r in store.releases]
    return rows + [ReleaseRow(id=d.id, staged_at="", profile="?", sglang_version="?", outcome=f"damaged ({d.reason})",
                              is_current=d.id == store.current, throughput="") for d in store.damaged]


def list_releases(target: Target, service: str, remote: Remote, workload_names: Sequence[str] = ()
                  ) -> list[ReleaseRow]:
    layout = target.layout(service)
    return release_rows(read_store_facts(remote, layout), workload_names)


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
