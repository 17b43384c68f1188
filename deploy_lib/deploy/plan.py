"""What a deploy would do, decided without changing anything: the plan of a release from the profile and the host
facts, its batches (stage, switch and restart, once verified), drift, and the hand-run server of an adopted release."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.deploy.project import Target
from deploy_lib.digests import sha256_text
from deploy_lib.errors import DriftDetected, PreflightError
from deploy_lib.facts.diagnose import journal_cursor_step
from deploy_lib.facts.host import HostFacts
from deploy_lib.health import StartPrediction, predict_start
from deploy_lib.inventory.model import RouterPolicy
from deploy_lib.models import HubModel, ModelFacts, ReleaseModel, Weights, size_text
from deploy_lib.profile import (
    FeatureSpec,
    LoadedProfile,
    ParallelSpec,
    RestartPolicy,
    ServiceSpec,
    read_stored_profile,
)
from deploy_lib.release.model import (
    SECRET_NOT_AVAILABLE,
    SECRET_VALUES,
    Change,
    Release,
    build_release,
    diff_releases,
    placeholder_secrets,
    renders_as,
)
from deploy_lib.remote import Put, Step, StepResult, describe
from deploy_lib.remote.readings import ABSENT_OK, Readings
from deploy_lib.store import (
    ENV_FILE,
    FAILED,
    HEALTHY,
    LAUNCHER_FILE,
    UNIT_FILE,
    DamagedRelease,
    StoreFacts,
    StoreLayout,
    Tags,
    operator_name,
    release_json,
    repair_release,
    stage_release,
    switch_current,
)
from deploy_lib.versions import GET_LOAD_REMOVED, reached

FACT_HAND_RUN = "adopted server: still running"
RESTART = "systemd: restart"
HAND_RUN_STOP = "adopted server: stop pid"  # the SIGTERM to an adopted release 0's server, then its pid


Steps = tuple[Step | Put, ...]


class BatchKind(StrEnum):
    """A plan's batches; each value names its phase and heads its steps in a dry run."""

    model = "model"
    stage = "stage"
    gpu_check = "gpu check"
    activate = "switch and restart"
    verified = "once verified"


@dataclass(frozen=True)
class Batch:
    kind: BatchKind
    steps: Steps


@dataclass(frozen=True)
class SwitchBatches:
    """What `Transition.activate` runs: before the ladder (with the stage, in one round trip), and with the healthy
    record once the release is verified."""

    activate: Steps
    verified: Steps

    def repeatable(self) -> SwitchBatches:
        """The same steps, each marked safe to send again on a new connection after a drop (a restore's)."""
        def again(steps: Steps) -> Steps:
            return tuple(replace(step, repeatable=True) if isinstance(step, Step) else step for step in steps)
        return SwitchBatches(again(self.activate), again(self.verified))


@dataclass(frozen=True)
class PlanBatches:
    """A deploy's batches: the weights (a hub model's), the release's files, the NCCL check, the switch."""

    switch: SwitchBatches
    model: Steps = ()
    stage: Steps = ()
    gpu_check: Steps = ()

    def in_order(self) -> tuple[Batch, ...]:
        """The batches a deploy runs, in its order, the empty ones left out (a dry run lists them so)."""
        batches = (Batch(BatchKind.model, self.model), Batch(BatchKind.stage, self.stage),
                   Batch(BatchKind.gpu_check, self.gpu_check), Batch(BatchKind.activate, self.switch.activate),
                   Batch(BatchKind.verified, self.switch.verified))
        return tuple(batch for batch in batches if batch.steps)


def hand_run_check(metadata: Mapping[str, Any] | None) -> list[Step]:
    """For a current release adopted from a hand-run process (release 0): is that very process still running?"""
    adopted = dict((metadata or {}).get("adopted") or {})
    if not adopted.get("pid"):
        return []
    return [Step(FACT_HAND_RUN, ("sha256sum", "--", f"/proc/{int(adopted['pid'])}/cmdline"), sudo=True,
                 ok=ABSENT_OK)]


def hand_run_pid(metadata: Mapping[str, Any] | None, results: Sequence[StepResult] | Readings) -> int | None:
    """The adopted process's pid when /proc still shows its command line (same checksum: not a reused pid)."""
    adopted = dict((metadata or {}).get("adopted") or {})
    found = Readings.of(results).get(FACT_HAND_RUN)
    if found is None or found.exit_code != 0 or found.stdout.split()[:1] != [adopted.get("cmdline_sha256")]:
        return None
    return int(adopted["pid"])


def stop_hand_run(pid: int, timeout_s: float) -> list[Step | Put]:
    """SIGTERM, as Ctrl-C or `systemctl stop` would send (SGLang shuts its workers down), then wait for its exit."""
    return [Step(f"{HAND_RUN_STOP} {pid}", ("kill", "-TERM", "--", str(pid)), sudo=True, ok=frozenset({0, 1})),
            Step(f"adopted server: wait for pid {pid} to exit", ("tail", f"--pid={pid}", "-s", "0.2", "-f",
                                                                 "/dev/null"), timeout_s=timeout_s)]


@dataclass(frozen=True)
class Plan:
    """What a deploy would do, computed from the profile and the host facts without changing anything."""

    release: Release
    current_id: str | None
    changes: tuple[Change, ...]
    drift: tuple[str, ...]
    unchanged: bool
    batches: PlanBatches
    notes: tuple[str, ...] = ()
    secrets_not_available: Mapping[str, str] = field(default_factory=dict)  # name -> why (a plan needs no value)
    gpu_check_reasons: tuple[str, ...] = ()  # preflight.gpu_check runs (batch "gpu check") because of these

    @property
    def release_id(self) -> str | None:
        """The id the deploy would make; unknown while a secret's value (part of the content) is not available."""
        return None if self.secrets_not_available else self.release.id

    def dry_run_lines(self) -> list[str]:
        shown_id = self.release_id or "id not known here (it depends on secret values)"
        overridden = "".join(f" --set {text}" for text in self.release.overrides)
        lines = [f"release {shown_id} (profile {self.release.profile_name}{overridden}, SGLang "
                 f"{self.release.sglang_version}); current: {self.current_id or 'none'}"]
        if self.unchanged:
            lines.append("no changes")
        elif self.secrets_not_available and not self.changes and not self.drift:
            lines.append("no changes, unless a secret's value changed")
        lines += [f"  {change}" for change in self.changes]
        lines += [f"  secret {name}: {SECRET_NOT_AVAILABLE} ({why}); its value is not compared"
                  for name, why in self.secrets_not_available.items()]
        lines += [f"  drift: {item}" for item in self.drift]
        lines += [f"  note: {note}" for note in self.notes]
        for batch in () if self.unchanged else self.batches.in_order():
            lines.append(f"{batch.kind}:")
            lines += [f"  {line}" for line in describe(batch.steps)]
        return lines


@dataclass(frozen=True)
class VenvChoice:
    """The venv a release runs from: built from the profile's lock (managed), else the host's or the profile's."""

    path: str
    environment: Mapping[str, str] = field(default_factory=dict)  # a managed venv's own cache directories
    build_note: str | None = None       # dry run: what a deploy would build
    sglang_version: str | None = None   # from the lock, when the venv is not built yet (dry run)


HAND_UNIT_LINES = 40  # of a hand-made unit, shown in the refusal


def hand_made_unit(layout: StoreLayout, facts: HostFacts) -> str | None:
    """A unit of the service's name that the tool did not write (a hand-written file, a link elsewhere, a packaged
    unit), with its text as `systemctl cat` shows it; None when there is none or it is the tool's link."""
    if facts.unit_link == str(layout.current / UNIT_FILE):
        return None
    if facts.unit_link is None and facts.unit.load_state != "loaded" and facts.unit_file is None:
        return None
    where = f"{layout.unit_link} -> {facts.unit_link}" if facts.unit_link else str(layout.unit_link)
    lines = (facts.unit_file or "(not readable)").rstrip("\n").splitlines()
    shown = "\n    ".join(lines[:HAND_UNIT_LINES] + ([f"... ({len(lines) - HAND_UNIT_LINES} more lines)"]
                                                     if len(lines) > HAND_UNIT_LINES else []))
    return f"{where} is a unit the tool did not write (unit {facts.unit.active_state}):\n    {shown}"


def detect_drift(layout: StoreLayout, facts: HostFacts) -> tuple[str, ...]:
    """Files of the current release changed on the host since they were written, or a unit the tool did not write
    where its link to the current release belongs (also before the first deploy)."""
    record = facts.store.release(facts.store.current) if facts.store.current else None
    drift = []
    recorded = dict(record.metadata.get("files") or {}) if record else {}
    for name in (UNIT_FILE, ENV_FILE, LAUNCHER_FILE):
        if record and name in recorded and facts.file_sums.get(name) != recorded[name]:
            drift.append(f"{layout.current / name} was edited on the host since release {record.id} was written")
    foreign = hand_made_unit(layout, facts)
    return (*drift, foreign) if foreign else tuple(drift)


def keep_replaced_unit(layout: StoreLayout, now: datetime) -> tuple[list[Step | Put], PurePosixPath]:
    """Copy the unit file a forced deploy replaces into the store (nothing is copied when there is no file)."""
    copy = layout.base / "replaced" / f"{layout.unit_name}.{now.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    return [Step("keep the replaced unit: directory", ("mkdir", "-p", "--", str(copy.parent)), sudo=True),
            Step("keep the replaced unit: copy", ("cp", "-P", "--preserve=all", "--", str(layout.unit_link),
                                                    str(copy)), sudo=True, ok=frozenset({0, 1}))], copy


# How the old server stops. SGLang's SIGTERM handler marks the server as exiting, so /health and /health_generate
# answer 503 from then on, and a watchdog waits for every in-flight request to finish, looking every 5 s, with no
# bound of its own; once none is left it exits (sglang 0.5.23: srt/managers/tokenizer_manager.py,
# SignalHandler.sigterm_handler at line 4066 and TokenizerManager.sigterm_watchdog at 3508-3571, which then gives its
# schedulers _SCHEDULER_EXIT_TIMEOUT_SECS = 15 s (line 456) to free GPU memory before killing them;
# srt/entrypoints/http_server.py line 731. sglang 0.5.9: the same handler and watchdog in tokenizer_manager.py at
# 2500 and 2113-2149, http_server.py line 474). The bound on that drain is the profile's service.stop_timeout_s,
# rendered as the unit's TimeoutStopSec=: `systemctl stop`/`restart` sends SIGTERM, waits that long, then SIGKILLs
# the whole control group (KillMode=control-group) and waits up to as long again (systemd.service(5)
# TimeoutStopSec=, systemd.kill(5)). The tool waits for systemd, never a fixed time of its own shorter than that.
STOP_SLACK_S = 30


def stop_wait_s(stop_timeout_s: int) -> float:
    """How long a step that stops a unit with TimeoutStopSec=`stop_timeout_s` may run: the drain's bound, SIGKILL's
    own wait (as long again), and slack for the round trip."""
    return 2 * stop_timeout_s + STOP_SLACK_S


def recorded_stop_timeout_s(metadata: Mapping[str, Any] | None) -> int:
    """The TimeoutStopSec= of a recorded release: its unit's settings, else its recorded profile's (or the default)."""
    unit = dict((metadata or {}).get("unit") or {})
    if str(unit.get("TimeoutStopSec", "")).isdigit():
        return int(unit["TimeoutStopSec"])
    return read_stored_profile((metadata or {}).get("profile")).service.stop_timeout_s


def stop_bound_s(*metadata: Mapping[str, Any] | None) -> int:
    """The longest TimeoutStopSec= of these releases (the loaded unit's, the one a switch loads): what a stop or
    restart between them may take systemd to finish."""
    known = [recorded_stop_timeout_s(data) for data in metadata if data is not None]
    return max(known, default=recorded_stop_timeout_s(None))


def store_stop_bound_s(store: StoreFacts, *metadata: Mapping[str, Any] | None) -> int:
    """`stop_bound_s` over every release the store holds and these: a stop after a failure, whichever unit is
    loaded."""
    return stop_bound_s(*(record.metadata for record in store.releases), *metadata)


def stop_step(layout: StoreLayout, stop_timeout_s: int) -> Step:
    """Stop the unit (SGLang drains in-flight requests first, bounded by TimeoutStopSec=`stop_timeout_s`); exit 5: no
    such unit yet, nothing to stop."""
    return Step("systemd: stop", ("systemctl", "stop", "--", layout.unit_name), sudo=True, ok=frozenset({0, 5}),
                timeout_s=stop_wait_s(stop_timeout_s))


def reset_failed_step(layout: StoreLayout) -> Step:
    """Forget the unit's failed state, restart count and start-limit window (exit 1: nothing to reset)."""
    return Step("systemd: reset-failed", ("systemctl", "reset-failed", "--", layout.unit_name), sudo=True,
                ok=frozenset({0, 1}))


def activation_steps(layout: StoreLayout, release_id: str, stop_timeout_s: int,
                     before_restart: Sequence[Step | Put] = (), reload: bool = True) -> list[Step | Put]:
    """Switch `current` to a release and restart it, after reading the journal's position (the ladder shows and
    diagnoses only this start) and running `before_restart` (stopping an adopted hand-run server)."""
    return [journal_cursor_step(layout.unit_name), *switch_current(layout, release_id), *before_restart,
            *restart_steps(layout, stop_timeout_s, reload)]


def restart_steps(layout: StoreLayout, stop_timeout_s: int, reload: bool = True) -> list[Step | Put]:
    """`reload` False: systemd holds the unit text of the release being started already (`unit_held`);
    `stop_timeout_s`: the TimeoutStopSec= the restart's stop of the old server is bounded by (`stop_wait_s`)."""
    unit = layout.unit_name
    # enable without its own daemon-reload (systemctl enable reloads by default): the one reload below loads both
    return [
        Step("systemd: enable", ("systemctl", "enable", "--no-reload", "--", unit), sudo=True),
        *([Step("systemd: daemon-reload", ("systemctl", "daemon-reload"), sudo=True)] if reload else []),
        reset_failed_step(layout),
        Step(RESTART, ("systemctl", "restart", "--", unit), sudo=True, timeout_s=stop_wait_s(stop_timeout_s)),
    ]


def seconds_from_stop(results: Sequence[StepResult]) -> float:
    """How long a switch's round trip ran, by the host's step durations, from its first step that stops the old
    server (the restart, or the stop of an adopted hand-run server) to its end; counted from the end, as a wrapper
    (the lock's) may leave its own steps before it out of the results."""
    stops = [i for i, result in enumerate(results)
             if result.step.name == RESTART or result.step.name.startswith(HAND_RUN_STOP)]
    return sum(result.duration_s for result in results[stops[0]:]) if stops else 0.0


def recorded_unit_digest(facts: HostFacts, release_id: str) -> str | None:
    """The unit digest release.json records for a release on the host (None: not there, or written without one)."""
    record = facts.store.release(release_id)
    digest = record.metadata.get("unit_digest") if record else None
    return digest if isinstance(digest, str) else None


def unit_held(layout: StoreLayout, facts: HostFacts, release_id: str, unit_digest: str | None,
              linked: bool = False) -> bool:
    """systemd holds the unit text of `release_id` already, and will still see it as loaded once `current` points at
    it, so its start needs no daemon-reload: the unit link is the tool's, the unit is loaded and systemd does not ask
    for a reload (NeedDaemonReload=no: current's unit file is not newer than what it loaded), the digest in the loaded
    Description= is the release's (`unit_digest`), and the release's unit file is not newer than current's (it is
    current's, a hard link of it: `linked`, or older by mtime), so NeedDaemonReload stays "no" after the switch.

    The digest decides because NeedDaemonReload alone compares mtimes (systemd src/core/unit.c
    fragment_mtime_newer) and would miss a switch to an older file of another text; drift (a hand edit) reloads. The
    caller adds what the facts cannot say here: no unit file rewritten by this deploy (a repair, a damaged release
    staged again)."""
    current = facts.store.current
    times = facts.unit_times
    not_newer = linked or release_id == current or (
        current is not None and release_id in times and current in times and times[release_id] <= times[current])
    return (current is not None and unit_digest is not None and facts.unit.unit_digest == unit_digest
            and facts.unit_link == str(layout.current / UNIT_FILE) and facts.unit.load_state == "loaded"
            and not facts.unit.need_daemon_reload and not_newer and not detect_drift(layout, facts))


def switch_batches(layout: StoreLayout, release_id: str, held: bool, stop_timeout_s: int,
                   before_restart: Sequence[Step | Put] = ()) -> SwitchBatches:
    """The switch to a release and its restart (a daemon-reload unless systemd holds its unit already: `held`; the
    old server's stop bounded by `stop_timeout_s`), and the reset sent with the healthy record."""
    return SwitchBatches(tuple(activation_steps(layout, release_id, stop_timeout_s, before_restart, reload=not held)),
                         (reset_failed_step(layout),))


def recorded_switch(layout: StoreLayout, facts: HostFacts, release_id: str) -> SwitchBatches:
    """The switch to a recorded release (rollback, a restore) or a restart of current, from the host's facts."""
    record, current = facts.store.release(release_id), facts.store.release(facts.store.current or "")
    return switch_batches(layout, release_id, unit_held(layout, facts, release_id, recorded_unit_digest(facts,
                                                                                                     release_id)),
                          stop_bound_s(record.metadata if record else None, current.metadata if current else None))


def plan_deploy(loaded: LoadedProfile, target: Target, facts: HostFacts, secrets: Mapping[str, str],
                force: bool, now: datetime, venv: VenvChoice | None = None, patches: tuple[str, ...] = (),
                secrets_not_available: Mapping[str, str] | None = None, hand_pid: int | None = None,
                model: Weights | None = None, model_facts: ModelFacts | None = None,
                release_id: str | None = None) -> Plan:
    """What a deploy would do. A dry run passes the secrets it could not read in `secrets_not_available`: the
    plan then stands in a placeholder for their values and does not claim how they compare. `hand_pid`: the
    hand-run server of an adopted release 0, stopped before the restart. `model`: where the weights come from, and
    `model_facts` what the host holds of them (check_model has passed). `release_id`: a multi-node release's one
    id for all its nodes, instead of this host's content id."""
    not_available = dict(secrets_not_available or {})
    venv = venv or VenvChoice(target.venv_of(loaded.profile))
    layout = target.layout(loaded.profile.service.name)
    placeheld = {**secrets, **dict.fromkeys(not_available, SECRET_NOT_AVAILABLE)}
    release = _release(loaded, target, layout, facts, venv, placeheld, patches,
                       model.release_model(model_facts) if model and model_facts else None, release_id)
    if release_id is None:  # a group's id is the group's to decide (ops/multinode_deploy.py)
        release = as_current(facts, release)
    _router_can_read_load(target, release.sglang_version)
    drift = _drift_unless_forced(layout, facts, target.host.name, force)
    host = _HostAgainstRelease.of(layout, facts, release, drift, model_facts)
    check_reasons = _gpu_check_reasons(loaded, host.current_metadata, release)
    hand_stop = stop_hand_run(hand_pid, loaded.profile.service.stop_timeout_s) if hand_pid else []
    # the old server stops under the loaded unit's TimeoutStopSec= or, after the switch's daemon-reload, this one's
    stop_s = stop_bound_s(release.metadata(), host.current_metadata)
    # a unit the tool did not write is copied into the store with the stage; the switch then replaces it
    keep_unit, kept_at = keep_replaced_unit(layout, now) if hand_made_unit(layout, facts) and not host.unchanged \
        else ([], None)
    batches = PlanBatches(
        switch=switch_batches(layout, release.id, _switch_held(layout, facts, release, host), stop_s,
                              [] if check_reasons else hand_stop),  # the check stops the old server itself
        model=_model_batch(model, model_facts, venv),
        stage=(*_stage_batch(layout, facts, release, release_tags(target, release), now, host), *keep_unit),
        gpu_check=_gpu_check_batch(layout, release, check_reasons, hand_stop, stop_s))
    notes = (venv.build_note, _past_failure(facts, release.id),
             start_limit_note(loaded.profile.service, _median_start_s(facts.store, loaded.name)),
             host.damaged and f"release {release.id} on the host is damaged ({host.damaged.reason}); it is staged "
                              "again",
             host.not_verified, _model_note(model, model_facts), _idle_gpus_note(loaded.profile.parallel, facts),
             _metrics_note(loaded.profile.features),
             _gpu_check_note(loaded, host.current_id, release, check_reasons),
             _hand_stop_note(hand_pid, host, check_reasons),
             kept_at and f"a copy of the replaced unit is kept at {kept_at}")
    return Plan(release=release, current_id=host.current_id,
                changes=_changes(host.current_metadata, release, not_available), drift=drift,
                unchanged=host.unchanged, batches=batches, secrets_not_available=not_available,
                notes=tuple(note for note in notes if note), gpu_check_reasons=check_reasons)


def plan_against(old: LoadedProfile, new: LoadedProfile, target: Target, sglang_version: str) -> tuple[Change, ...]:
    """What taking this host from profile `old` to `new` would change, from the profiles alone: no host is read, so
    secrets are placeholders and the SGLang version is the one given (`plan --against`)."""
    def rendered(loaded: LoadedProfile) -> Release:
        return build_release(loaded, target.layout(loaded.profile.service.name), sglang_version,
                             placeholder_secrets(loaded.profile))
    return tuple(diff_releases(rendered(old).metadata(), rendered(new).metadata()))


def _release(loaded: LoadedProfile, target: Target, layout: StoreLayout, facts: HostFacts, venv: VenvChoice,
             secrets: Mapping[str, str], patches: tuple[str, ...], model: ReleaseModel | None,
             release_id: str | None) -> Release:
    """The release the profile makes on this host's venv; PreflightError when no SGLang is known to be there."""
    version = facts.sglang.sglang_version or venv.sglang_version
    if version is None:
        raise _no_sglang(loaded, target, venv.path, facts.sglang.error)
    return build_release(loaded, layout, version, secrets, venv=venv.path, patches=patches,
                         flashinfer_version=facts.sglang.flashinfer_version, extra_environment=venv.environment,
                         model=model, torch_version=facts.sglang.torch_version,
                         nccl_version=facts.sglang.nccl_version, release_id=release_id)


def _no_sglang(loaded: LoadedProfile, target: Target, venv: str, error: str | None) -> PreflightError:
    """The host lacks SGLang where the profile says it is: the key that says so, and the ways to fix it."""
    where = f"{target.host.name}: no SGLang found in {venv}"
    if venv != target.venv_of(loaded.profile):  # a managed venv (built, adopted or patched): not the user's key
        return PreflightError(f"{where}: {error}", "the venv the release runs from is incomplete: "
                                                   "`invoke venv.list` shows the host's venvs")
    key = ("the host's `venv` var in the inventory" if target.venv_override
           else f"service.venv of {loaded.path}" + ("" if "venv" in loaded.profile.service.model_fields_set
                                                     else ", its default"))
    return PreflightError(f"{where} ({key}): {error}",
                          f"install SGLang in a venv there (`python3 -m venv {venv} && {venv}/bin/pip install "
                          "sglang`), or set service.venv to the venv that has it, or give service.venv_build a "
                          "lock the deploy builds the venv from (`invoke docs venvs`)")


def as_current(facts: HostFacts, release: Release) -> Release:
    """The release under the current release's id when the current one holds exactly what it renders (release.json's
    files, venv, SGLang, patches and weights: `renders_as`), whatever id that one was written under: an earlier
    version of the tool hashed the whole profile, so its ids differ from today's for the same files, and a deploy
    that renders what the host runs must restart nothing."""
    current_id = facts.store.current
    current = facts.store.release(current_id) if current_id else None
    if current is None or current_id == release.id or not renders_as(current.metadata, release):
        return release
    return replace(release, id=current.id)


def _router_can_read_load(target: Target, sglang_version: str) -> None:
    """PreflightError when the host sits behind a router whose policy needs what this SGLang no longer serves:
    power_of_two asks each worker for /get_load, gone from SGLang 0.5.21 (versions.GET_LOAD_REMOVED)."""
    vars_ = target.host.vars
    if vars_.router is None or vars_.router_policy != RouterPolicy.power_of_two \
            or not reached(sglang_version, GET_LOAD_REMOVED):
        return
    where = target.host.var_files.get("router_policy", "the inventory")
    raise PreflightError(
        f"{where}: host {target.host.name}: router_policy: power_of_two: the router asks each worker for /get_load, "
        f"which SGLang {sglang_version} does not serve (removed in {GET_LOAD_REMOVED}): the router could not read "
        f"the replicas' load",
        "use router_policy: cache_aware (the default), round_robin or random")


def _drift_unless_forced(layout: StoreLayout, facts: HostFacts, where: str, force: bool) -> tuple[str, ...]:
    """The drift, which only --force may replace (DriftDetected without it)."""
    drift = detect_drift(layout, facts)
    if drift and not force:
        raise DriftDetected(f"{where}: the deployed files were changed by hand:\n  " + "\n  ".join(drift),
                            "deploy with --force to replace them (a replaced unit file is copied into the store), "
                            "copy the edits into the profile, or `invoke adopt` the server that runs by hand")
    return drift


@dataclass(frozen=True)
class _HostAgainstRelease:
    """What the host holds of the release: whether it is current, on disk (damaged?), verified, its weights."""

    current_id: str | None
    current_metadata: Mapping[str, Any] | None
    is_current: bool
    drift: tuple[str, ...]
    have_release: bool
    damaged: DamagedRelease | None
    not_verified: str | None       # why the current release, this one, is restarted all the same
    weights_missing: bool
    linked: bool                   # a new release whose unit text is current's: its unit file hard-linked

    @property
    def unchanged(self) -> bool:
        return self.is_current and not self.drift and not self.not_verified and not self.weights_missing

    @classmethod
    def of(cls, layout: StoreLayout, facts: HostFacts, release: Release, drift: tuple[str, ...],
           model_facts: ModelFacts | None) -> _HostAgainstRelease:
        current_id = facts.store.current
        current = facts.store.release(current_id) if current_id else None
        is_current = current_id == release.id
        have_release = facts.store.release(release.id) is not None
        return cls(current_id=current_id, current_metadata=current.metadata if current else None,
                   is_current=is_current, drift=drift, have_release=have_release,
                   damaged=facts.store.damaged_release(release.id),
                   not_verified=_why_not_verified(facts, release.id) if is_current and not drift else None,
                   weights_missing=model_facts is not None and not model_facts.complete,
                   linked=not have_release and not drift and current_id is not None
                   and facts.file_sums.get(UNIT_FILE) == sha256_text(release.unit_text))


def _gpu_check_reasons(loaded: LoadedProfile, current_metadata: Mapping[str, Any] | None, release: Release
                       ) -> tuple[str, ...]:
    """Why preflight.gpu_check runs the NCCL check before this release starts; () when it does not."""
    if not loaded.profile.preflight.gpu_check:
        return ()
    from deploy_lib import gpu_check  # loads only for a profile that asks for the check
    return gpu_check.check_reasons(current_metadata, release.metadata())


def _switch_held(layout: StoreLayout, facts: HostFacts, release: Release, host: _HostAgainstRelease) -> bool:
    """systemd holds this release's unit text, and no unit file is rewritten (drift repaired, damage restaged)."""
    digest = recorded_unit_digest(facts, release.id) if host.have_release else release.unit_digest
    return unit_held(layout, facts, release.id, digest, host.linked) and host.damaged is None


def _model_batch(model: Weights | None, model_facts: ModelFacts | None, venv: VenvChoice) -> Steps:
    """A hub model's missing files staged on the host (pushed weights travel from here, not in a batch)."""
    if isinstance(model, HubModel) and model_facts is not None and not model_facts.complete:
        return (model.step(venv.path, "stage", model_facts.commit),)
    return ()


def _stage_batch(layout: StoreLayout, facts: HostFacts, release: Release, tags: Tags, now: datetime,
                 host: _HostAgainstRelease) -> Steps:
    """A release not on the host written to it; the current one's drifted files rewritten."""
    if not host.have_release:
        unit_from = layout.release(host.current_id) / UNIT_FILE if host.linked and host.current_id else None
        return tuple(stage_release(layout, release.id, release.unit_text, release.env_text,
                                   release_json(release.record(), tags, now), replace_damaged=host.damaged is not None,
                                   launcher_text=release.launcher_text, unit_from=unit_from))
    if host.drift and host.is_current:
        return tuple(repair_release(layout, release.id, release.unit_text, release.env_text, release.launcher_text))
    return ()


def _gpu_check_batch(layout: StoreLayout, release: Release, check_reasons: tuple[str, ...],
                     hand_stop: Sequence[Step | Put], stop_timeout_s: int) -> Steps:
    """The old server (and a hand-run one) stopped, then NCCL's all-reduce verified: the check needs the GPUs."""
    if not check_reasons:
        return ()
    from deploy_lib import gpu_check
    return (*hand_stop, stop_step(layout, stop_timeout_s),
            *gpu_check.check_batch(gpu_check.subject_of_release(release.id, release.metadata())))


def _idle_gpus_note(parallel: ParallelSpec, facts: HostFacts) -> str | None:
    """A layout that takes fewer GPUs than nvidia-smi shows leaves the others idle: said, not refused (a host may
    keep GPUs for something else)."""
    shown, used = len(facts.gpus or ()), parallel.gpus_per_node
    if shown <= used:
        return None
    return (f"parallel: {parallel.shape} takes {used} of the host's {shown} GPUs; {shown - used} stay idle "
            f"(tp x dp x pp per node may be up to {shown})")


def _metrics_note(features: FeatureSpec) -> str | None:
    """A release without SGLang's /metrics cannot be watched nor have its workload read (issue 42): said, not
    refused."""
    if features.metrics:
        return None
    return ("features.metrics is off: the server will serve no /metrics, which the live-traffic watch and `workload` "
            "read (set features.metrics: true)")


def _model_note(model: Weights | None, model_facts: ModelFacts | None) -> str | None:
    if model is None or model_facts is None or model_facts.complete:
        return None
    return (f"{model.label} ({model_facts.commit}): {len(model_facts.missing)} of {len(model_facts.files)} files to "
            f"stage, {size_text(model_facts.missing_bytes)} to {model.verb} into {model_facts.hf_home}")


def _gpu_check_note(loaded: LoadedProfile, current_id: str | None, release: Release,
                    check_reasons: tuple[str, ...]) -> str | None:
    if check_reasons:
        from deploy_lib import gpu_check
        subject = gpu_check.subject_of_release(release.id, release.metadata())
        return (f"gpu check (preflight.gpu_check): {'; '.join(check_reasons)}: the old server stops and NCCL's "
                f"all-reduce is verified on {subject.world_size} GPUs with this release's venv and environment "
                "before SGLang starts")
    if loaded.profile.preflight.gpu_check:
        return ("gpu check (preflight.gpu_check) not needed: TP size, NCCL environment and the venv's "
                f"torch/NCCL are those of release {current_id}")
    return None


def _hand_stop_note(hand_pid: int | None, host: _HostAgainstRelease, check_reasons: tuple[str, ...]) -> str | None:
    if not hand_pid or host.unchanged:
        return None
    return (f"the hand-run server (pid {hand_pid}, adopted as release {host.current_id}) is stopped before the "
            f"{'gpu check' if check_reasons else 'restart'}")


def _changes(current_metadata: Mapping[str, Any] | None, release: Release, not_available: Mapping[str, str]
             ) -> tuple[Change, ...]:
    """The release against the current one; with secrets not available here, their values are not compared."""
    # the unit file's digest, for a current release whose release.json does not record the unit's settings
    rendered = release.record() if current_metadata and "unit" not in current_metadata else release.metadata()
    return tuple(change for change in diff_releases(current_metadata, rendered)
                 if not (not_available and change.kind == "secret" and change.name == SECRET_VALUES))


def _why_not_verified(facts: HostFacts, release_id: str) -> str | None:
    """Why the current release, the one being deployed, cannot be taken as serving without a restart, if it can't.

    "No changes" needs the release on disk, its unit active, and history's last word on it "healthy"; the live
    probe (the last condition) is asked by `deploy`."""
    again = "it is restarted and verified"
    if facts.store.release(release_id) is None:
        return f"release {release_id} is current but missing or damaged on the host: it is staged again and restarted"
    if facts.unit.active_state != "active" or facts.unit.load_state != "loaded":
        return f"release {release_id} is current but its unit is {facts.unit.active_state} " \
               f"({facts.unit.load_state}): {again}"
    if not facts.store.recorded_healthy(release_id):
        return f"release {release_id} is current but history does not record it as verified (an interrupted or " \
               f"killed deploy?): {again}"
    return None


def _past_failure(facts: HostFacts, release_id: str) -> str | None:
    """This very release failed on the host before: say when and why, so a dry run shows it."""
    failures = [e for e in facts.store.history if e.tags.release == release_id and e.outcome == FAILED]
    return f"this release failed on {failures[-1].when}: {failures[-1].cause}" if failures else None


def release_tags(target: Target, release: Release) -> Tags:
    versions = {"sglang": release.sglang_version}
    if release.flashinfer_version:
        versions["flashinfer"] = release.flashinfer_version
    return Tags(who=operator_name(), host=target.host.name, release=release.id, profile=release.profile_name,
                profile_hash=release.profile_hash, versions=versions)


def start_prediction(store: StoreFacts, profile_name: str) -> StartPrediction | None:
    durations = [entry.timings["ready"] for entry in store.history
                 if entry.outcome == HEALTHY and entry.tags.profile == profile_name and "ready" in entry.timings]
    return predict_start(durations)


def _median_start_s(store: StoreFacts, profile_name: str) -> float | None:
    prediction = start_prediction(store, profile_name)
    return prediction.median_s if prediction else None


def start_limit_note(service: ServiceSpec, median_start_s: float | None) -> str | None:
    """A server that crashes while loading restarts every load time + restart_sec; when start_limit_burst of those
    do not fit in the start-limit interval, systemd never gives up (its window is fixed, not sliding)."""
    if service.restart is RestartPolicy.no or median_start_s is None:
        return None
    period_s = median_start_s + service.restart_sec
    if service.start_limit_burst * period_s < service.start_limit_interval_s:
        return None
    return (f"starts of this profile take {median_start_s:.0f} s (median): a server that crashes while loading "
            f"would restart every ~{period_s:.0f} s, and {service.start_limit_burst} restarts do not fit in "
            f"service.start_limit_interval_s ({service.start_limit_interval_s} s), so systemd would never give up; "
            f"raise it above {math.ceil(service.start_limit_burst * period_s)} s")
