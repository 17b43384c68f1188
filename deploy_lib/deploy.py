"""The orchestration: plan -> preflight -> stage -> switch -> restart -> verify -> commit, or roll back.

Planning and preflight are pure functions of the profile and the host facts; `activate` is the one path that
switches a host to a release and verifies it, used by deploy, by the automatic rollback and by `invoke rollback`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, NoReturn

from deploy_lib import gpu_check
from deploy_lib.crashes import record_new_crashes, start_limit_note
from deploy_lib.cuda_toolkit import FIX_HINT, cuda_home, sm12x_problem
from deploy_lib.diagnose import (
    JOURNAL_SYNC,
    Diagnosis,
    diagnose,
    journal_cursor_step,
    journal_step,
    parse_journal_cursor,
)
from deploy_lib.errors import (
    ConfigError,
    ConnectFailed,
    DeployError,
    DriftDetected,
    GateFailed,
    GpuCheckFailed,
    Interrupted,
    PreflightError,
    ReadinessFailed,
    RemoteError,
    RollbackFailed,
)
from deploy_lib.facts import HostFacts, parse_systemctl_show, read_host_facts, require_gpus
from deploy_lib.health import (
    GenerationProbe,
    NotReady,
    ProbeTarget,
    Ready,
    ReadyReport,
    Rung,
    StartPrediction,
    Verdict,
    assess,
    parse_snapshot,
    predict_start,
    probe_step,
    wait_ready,
)
from deploy_lib.interrupts import interrupted, signal_name, signals_raise
from deploy_lib.models import (
    HubModel,
    ModelFacts,
    PushedModel,
    Weights,
    check_model,
    doomed_models,
    listing_steps,
    model_locations,
    parse_stored,
    prune_models,
    push_model,
    size_text,
    stage_model,
    weights,
)
from deploy_lib.profile import LoadedProfile, Profile, read_stored_profile
from deploy_lib.progress import NullProgress, Progress
from deploy_lib.project import Target
from deploy_lib.readings import ABSENT_OK, Readings
from deploy_lib.release import (
    SECRET_NOT_AVAILABLE,
    SECRET_VALUES,
    Change,
    RecordedRelease,
    Release,
    available_secrets,
    build_release,
    diff_releases,
    read_secret,
    resolve_secrets,
)
from deploy_lib.remote import Put, Remote, Step, StepResult, describe
from deploy_lib.server_args import API_KEY_ENV, launch_environment
from deploy_lib.settings import GateSettings
from deploy_lib.sglang_options import check_argv
from deploy_lib.store import (
    ENV_FILE,
    FAILED,
    HEALTHY,
    STOPPED,
    UNIT_FILE,
    ReleaseRecord,
    StoreFacts,
    StoreLayout,
    Tags,
    append_history,
    describe_pruned_releases,
    history_entry,
    host_lock,
    operator_name,
    parse_current,
    parse_store_facts,
    prune_releases,
    read_store_facts,
    release_fact_steps,
    release_json,
    releases_to_prune,
    repair_release,
    stage_release,
    switch_current,
)
from deploy_lib.venvs import (
    cache_dir_steps,
    cache_environment,
    describe_prune,
    ensure_venv,
    load_lock,
    plan_build,
    plan_prune,
    prune_steps,
    release_venv_hash,
)
from deploy_lib.venvs import parse_store_facts as parse_venv_store_facts
from deploy_lib.venvs import read_facts as read_venv_facts
from deploy_lib.venvs import store_fact_steps as venv_store_fact_steps
from deploy_lib.versions import health_path_for

FACT_HAND_RUN = "adopted server: still running"
MIN_FREE_BYTES = 64 * 1024 * 1024  # a release is a few KB, but a full disk breaks journald and pip alike
GRACE_S = 2.0  # healthy, then dead within this window, is a failed start
# The plan's batches that `_Run.activate` runs: before the ladder (with the stage, in one round trip), and after it.
ACTIVATE = "switch and restart"
VERIFIED = "once verified"


def hand_run_check(metadata: Mapping[str, Any] | None) -> list[Step | Put]:
    """For a current release adopted from a hand-run process (release 0): is that very process still running?"""
    adopted = dict((metadata or {}).get("adopted") or {})
    if not adopted.get("pid"):
        return []
    return [Step(FACT_HAND_RUN, ("sha256sum", "--", f"/proc/{int(adopted['pid'])}/cmdline"), sudo=True,
                 ok=ABSENT_OK)]


def hand_run_pid(metadata: Mapping[str, Any] | None, results: list[StepResult]) -> int | None:
    """The adopted process's pid when /proc still shows its command line (same checksum: not a reused pid)."""
    adopted = dict((metadata or {}).get("adopted") or {})
    found = Readings(results).get(FACT_HAND_RUN)
    if found is None or found.exit_code != 0 or found.stdout.split()[:1] != [adopted.get("cmdline_sha256")]:
        return None
    return int(adopted["pid"])


def stop_hand_run(pid: int, timeout_s: float) -> list[Step | Put]:
    """SIGTERM, as Ctrl-C or `systemctl stop` would send (SGLang shuts its workers down), then wait for its exit."""
    return [Step(f"adopted server: stop pid {pid}", ("kill", "-TERM", "--", str(pid)), sudo=True, ok=frozenset({0, 1})),
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
    batches: Mapping[str, list[Step | Put]]
    notes: tuple[str, ...] = ()
    secrets_not_available: Mapping[str, str] = field(default_factory=dict)  # name -> why (a plan needs no value)
    gpu_check_reasons: tuple[str, ...] = ()  # preflight.gpu_check runs (batch "gpu check") because of these

    @property
    def release_id(self) -> str | None:
        """The id the deploy would make; unknown while a secret's value (part of the content) is not available."""
        return None if self.secrets_not_available else self.release.id

    def dry_run_lines(self) -> list[str]:
        shown_id = self.release_id or "id not known here (it depends on secret values)"
        lines = [f"release {shown_id} (profile {self.release.profile_name}, SGLang "
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
        for phase, batch in ({} if self.unchanged else self.batches).items():
            lines.append(f"{phase}:")
            lines += [f"  {line}" for line in describe(batch)]
        return lines


@dataclass(frozen=True)
class Outcome:
    """The end of a deploy or rollback that did not raise."""

    action: str                       # deployed | unchanged | planned | rolled back
    release_id: str | None            # None: a plan whose release id depends on secrets not available here
    previous_id: str | None
    plan: Plan | None = None
    ready: ReadyReport | None = None
    timings: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class VenvChoice:
    """The venv a release runs from: built from the profile's lock (managed), else the host's or the profile's."""

    path: str
    environment: Mapping[str, str] = field(default_factory=dict)  # a managed venv's own cache directories
    build_note: str | None = None       # dry run: what a deploy would build
    sglang_version: str | None = None   # from the lock, when the venv is not built yet (dry run)


@dataclass(frozen=True)
class Options:
    dry_run: bool = False
    force: bool = False
    grace_s: float = GRACE_S
    environ: Mapping[str, str] = field(default_factory=dict)
    venv: VenvChoice | None = None      # a venv decided by the caller (a patched venv), instead of the profile's
    patches: tuple[str, ...] = ()       # patch sets applied in that venv, recorded in the release
    gate: bool = False                  # run the throughput gate even when the profile has no `gate:`
    before_restart: Callable[[], None] | None = None  # runs before the server stops (a router takes it out)


def choose_venv(remote: Remote, layout: StoreLayout, target: Target, profile: Profile, dry_run: bool,
                progress: Progress) -> VenvChoice:
    """Build (or reuse) the profile's locked venv; it is immutable, so building it changes nothing that runs."""
    spec = profile.service.venv_build
    if spec is None:
        return VenvChoice(target.venv_override or profile.service.venv)
    lock = load_lock(spec.lock)
    if dry_run:
        plan = plan_build(spec, lock, layout, read_venv_facts(remote, layout, spec.python), datetime.now(UTC))
        note = None if plan.reuse else (f"would build venv {plan.hash} ({len(plan.transfers)} wheels, "
                                        f"{plan.bytes_to_send} bytes to send)")
        return VenvChoice(str(plan.path), cache_environment(layout, plan.hash), note,
                          lock.distributions().get("sglang"))
    built = ensure_venv(remote, layout, spec, progress=progress, lock=lock)
    for warning in built.warnings:
        progress.note(warning)
    remote.run(cache_dir_steps(layout, built.hash, profile.service.user))
    return VenvChoice(str(built.path), cache_environment(layout, built.hash))


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
    for name in (UNIT_FILE, ENV_FILE):
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


def stop_step(layout: StoreLayout) -> Step:
    """Stop the unit (SGLang drains in-flight requests first); exit 5: no such unit yet, nothing to stop."""
    return Step("systemd: stop", ("systemctl", "stop", "--", layout.unit_name), sudo=True, ok=frozenset({0, 5}))


def reset_failed_step(layout: StoreLayout) -> Step:
    """Forget the unit's failed state, restart count and start-limit window (exit 1: nothing to reset)."""
    return Step("systemd: reset-failed", ("systemctl", "reset-failed", "--", layout.unit_name), sudo=True,
                ok=frozenset({0, 1}))


def activation_steps(layout: StoreLayout, release_id: str, before_restart: Sequence[Step | Put] = ()
                     ) -> list[Step | Put]:
    """Switch `current` to a release and restart it, after reading the journal's position (the ladder shows and
    diagnoses only this start) and running `before_restart` (stopping an adopted hand-run server)."""
    return [journal_cursor_step(layout.unit_name), *switch_current(layout, release_id), *before_restart,
            *restart_steps(layout)]


def restart_steps(layout: StoreLayout) -> list[Step | Put]:
    unit = layout.unit_name
    # enable without its own daemon-reload (systemctl enable reloads by default): the one reload below loads both
    return [
        Step("systemd: enable", ("systemctl", "enable", "--no-reload", "--", unit), sudo=True),
        Step("systemd: daemon-reload", ("systemctl", "daemon-reload"), sudo=True),
        reset_failed_step(layout),
        Step("systemd: restart", ("systemctl", "restart", "--", unit), sudo=True),
    ]


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
    secrets = {**secrets, **{name: SECRET_NOT_AVAILABLE for name in not_available}}
    venv = venv or VenvChoice(target.venv_override or loaded.profile.service.venv)
    layout = target.layout(loaded.profile.service.name)
    version = facts.sglang.sglang_version or venv.sglang_version
    if version is None:
        raise PreflightError(f"{target.host.name}: no SGLang found in {venv.path}: {facts.sglang.error}",
                             "create the venv on the host (or point service.venv / the host's `venv` var at it)")
    release = build_release(loaded, layout, version, secrets, venv=venv.path, patches=patches,
                            flashinfer_version=facts.sglang.flashinfer_version, extra_environment=venv.environment,
                            model=model.release_model(model_facts) if model and model_facts else None,
                            torch_version=facts.sglang.torch_version, nccl_version=facts.sglang.nccl_version,
                            release_id=release_id)
    current_id = facts.store.current
    current = facts.store.release(current_id) if current_id else None
    current_metadata = current.metadata if current else None
    drift = detect_drift(layout, facts)
    if drift and not force:
        raise DriftDetected(f"{target.host.name}: the deployed files were changed by hand:\n  " + "\n  ".join(drift),
                            "deploy with --force to replace them (a replaced unit file is copied into the store), "
                            "copy the edits into the profile, or `invoke adopt` the server that runs by hand")
    hand_stop = stop_hand_run(hand_pid, loaded.profile.service.stop_timeout_s) if hand_pid else []
    check_reasons = gpu_check.check_reasons(current_metadata, release.metadata()) \
        if loaded.profile.preflight.gpu_check else ()
    # the check needs the GPUs: the old server (and a hand-run one) stops before it, not at the restart
    takeover = [] if check_reasons else hand_stop
    not_verified = _why_not_verified(facts, release.id) if current_id == release.id and not drift else None
    weights_missing = model_facts is not None and not model_facts.complete
    have_release = facts.store.release(release.id) is not None
    damaged = facts.store.damaged_release(release.id)
    unchanged = current_id == release.id and not drift and not not_verified and not weights_missing
    tags = release_tags(target, release)
    metadata = release_json(release.metadata(), tags, now)
    batches: dict[str, list[Step | Put]] = {}
    prediction = start_prediction(facts.store, loaded.name)
    notes = [venv.build_note, _past_failure(facts, release.id),
             start_limit_note(loaded.profile.service, prediction.median_s if prediction else None),
             damaged and f"release {release.id} on the host is damaged ({damaged.reason}); it is staged again",
             not_verified]
    if model is not None and model_facts is not None and weights_missing:
        if isinstance(model, HubModel):
            batches["model"] = [model.step(venv.path, "stage", model_facts.commit)]
        notes.append(f"{model.label} ({model_facts.commit}): {len(model_facts.missing)} of "
                     f"{len(model_facts.files)} files to stage, {size_text(model_facts.missing_bytes)} to "
                     f"{model.verb} into {model_facts.hf_home}")
    if not have_release:
        batches["stage"] = stage_release(layout, release.id, release.unit_text, release.env_text, metadata,
                                         replace_damaged=damaged is not None)
    elif drift and current_id == release.id:
        batches["stage"] = repair_release(layout, release.id, release.unit_text, release.env_text)
    if check_reasons:
        subject = gpu_check.subject_of_release(release.id, release.metadata())
        batches["gpu check"] = [*hand_stop, stop_step(layout), *gpu_check.check_batch(subject)]
        notes.append(f"gpu check (preflight.gpu_check): {'; '.join(check_reasons)}: the old server stops and NCCL's "
                     f"all-reduce is verified on {subject.world_size} GPUs with this release's venv and environment "
                     "before SGLang starts")
    elif loaded.profile.preflight.gpu_check:
        notes.append("gpu check (preflight.gpu_check) not needed: TP size, NCCL environment and the venv's "
                     f"torch/NCCL are those of release {current_id}")
    batches[ACTIVATE] = activation_steps(layout, release.id, takeover)
    batches[VERIFIED] = [reset_failed_step(layout)]
    replaced_note = None
    if hand_made_unit(layout, facts) and not unchanged:
        # with the staging: deploy runs this batch from the plan, and the switch (from activate) replaces the file
        keep, copy = keep_replaced_unit(layout, now)
        model_batch = {"model": batches.pop("model")} if "model" in batches else {}
        batches = {**model_batch, "stage": [*batches.pop("stage", []), *keep], **batches}
        replaced_note = f"a copy of the replaced unit is kept at {copy}"
    hand_note = f"the hand-run server (pid {hand_pid}, adopted as release {current_id}) is stopped before the " \
        f"{'gpu check' if check_reasons else 'restart'}" if hand_stop and not unchanged else None
    changes = [change for change in diff_releases(current_metadata, release.metadata())
               if not (not_available and change.kind == "secret" and change.name == SECRET_VALUES)]
    return Plan(release=release, current_id=current_id, changes=tuple(changes), drift=drift, unchanged=unchanged,
                batches=batches, secrets_not_available=not_available,
                notes=tuple(note for note in (*notes, hand_note, replaced_note) if note),
                gpu_check_reasons=check_reasons)


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


def _listener_pids(listeners: tuple[str, ...]) -> set[int]:
    return {int(pid) for line in listeners for pid in re.findall(r"\bpid=(\d+)", line)}


def preflight(plan: Plan, loaded: LoadedProfile, target: Target, facts: HostFacts, hand_pid: int | None = None
              ) -> None:
    """Read-only checks that the host can run the new release; PreflightError before anything changes."""
    check_release(RecordedRelease.of_release(plan.release), target, facts, hand_pid, recorded=False)
    if plan.gpu_check_reasons and facts.sglang.torch_version is None:
        raise PreflightError(f"{target.host.name}: preflight.gpu_check: the NCCL check must run "
                             f"({'; '.join(plan.gpu_check_reasons)}), but {plan.release.venv} has no torch; the "
                             "check runs torch.distributed with NCCL in the release's venv",
                             f"install torch with CUDA into {plan.release.venv}, or set preflight.gpu_check: false "
                             f"in profile {loaded.name}; nothing was changed")


def check_release(release: RecordedRelease, target: Target, facts: HostFacts, hand_pid: int | None = None,
                  recorded: bool = True) -> None:
    """The one preflight, for a new release and for a recorded one (rollback): GPUs, SGLang in the venv and every
    flag known to it, port (free, or held by our unit or the adopted hand-run server `hand_pid`), disk;
    PreflightError before anything changes."""
    where = target.host.name
    gpus = require_gpus(facts, release.profile.parallel.gpus_per_node, where)
    declared = target.host.vars.gpu_arch
    if declared and gpus and gpus[0].arch != declared:
        raise PreflightError(f"{where}: the inventory declares {declared}, nvidia-smi reports {gpus[0].arch} "
                             f"({gpus[0].name})", "correct gpu_arch in the inventory")
    toolkit_problem = sm12x_problem(facts.sglang.flashinfer_version, gpus[0].compute_cap, facts.cuda_toolkit,
                                    release.environment) if release.profile.features.allreduce_fusion and gpus else None
    if toolkit_problem:
        raise PreflightError(f"{where}: allreduce fusion cannot start: {toolkit_problem}", FIX_HINT)
    if facts.sglang.sglang_version is None and not facts.sglang.options:
        raise PreflightError(f"{where}: release {release.id}: no SGLang found in {release.venv}: {facts.sglang.error}",
                             "the release runs from that venv: recreate it there, or choose a release whose venv "
                             "exists (`invoke releases`, `invoke venv.list`)")
    if facts.import_shadow:
        raise PreflightError(
            f"{where}: the server would import SGLang from {facts.import_shadow}, not from what {release.venv} "
            f"has installed: `python -m` puts its working directory {release.profile.service.working_directory} "
            "first on sys.path (a checkout's parent directory there is imported as a namespace package before an "
            "editable install's finder, and SGLang's own __init__ never runs)",
            "set service.working_directory to a directory without an `sglang` entry (e.g. the checkout's own)")
    # a recorded release runs as it ran: an abbreviation this SGLang accepts (release 0's hand-written `--tp`) only
    # refuses a command the tool is about to write
    tolerated = {"abbreviation"} if recorded else set()
    problems = [problem for problem in check_argv(facts.sglang.options, list(release.args))
                if problem.severity == "error" and problem.kind not in tolerated]
    if problems:
        listed = "\n  ".join(problem.message for problem in problems)
        raise PreflightError(f"{where}: SGLang {facts.sglang.sglang_version or release.sglang_version} in "
                             f"{release.venv} does not accept the launch command of release {release.id}:\n  {listed}",
                             "fix the profile (extra_args, backends) or deploy a venv with a matching SGLang")
    port = release.profile.server.port
    ours = facts.unit.active_state in ("active", "activating", "deactivating", "reloading") or \
        (hand_pid is not None and hand_pid in _listener_pids(facts.port_listeners))
    if facts.port_listeners and not ours:
        raise PreflightError(f"{where}: port {port} is already in use by another process: "
                             f"{facts.port_listeners[0].strip()}", "stop that process or change server.port")
    if facts.free_bytes is not None and facts.free_bytes < MIN_FREE_BYTES:
        raise PreflightError(f"{where}: only {facts.free_bytes // (1024 * 1024)} MiB free under "
                             f"{target.deploy_root}", "free some disk space on the host")


def check_release_files(release: RecordedRelease, layout: StoreLayout, facts: HostFacts, where: str) -> None:
    """A recorded release's unit and env file are on the host and as they were written (`facts.release_sums`)."""
    for name in (UNIT_FILE, ENV_FILE):
        path = layout.release(release.id) / name
        found, recorded = facts.release_sums.get(name), release.files.get(name)
        if found is None:
            raise PreflightError(f"{where}: release {release.id} cannot run: {path} is missing",
                                 "deploy its profile again to write the release afresh, or choose another release")
        if recorded is not None and found != recorded:
            raise PreflightError(f"{where}: release {release.id}: {path} was changed since the release was written "
                                 f"(sha256 {found[:12]}..., recorded {recorded[:12]}...)",
                                 "deploy its profile again to write the release afresh, or choose another release")


def release_tags(target: Target, release: Release) -> Tags:
    versions = {"sglang": release.sglang_version}
    if release.flashinfer_version:
        versions["flashinfer"] = release.flashinfer_version
    return Tags(who=operator_name(), host=target.host.name, release=release.id, profile=release.profile_name,
                profile_hash=release.profile_hash, versions=versions)


def recorded_tags(target: Target, release_id: str, metadata: Mapping[str, Any]) -> Tags:
    """The tags a release.json records; for one written without them (an earlier version), what it does record."""
    try:
        return Tags.from_dict(metadata["tags"])
    except (KeyError, TypeError, ValueError, AttributeError):
        version = metadata.get("sglang_version")
        return Tags(who=operator_name(), host=target.host.name, release=release_id,
                    profile=str(metadata.get("profile_name") or "?"),
                    profile_hash=str(metadata.get("profile_hash") or ""),
                    versions={"sglang": str(version)} if version else {})


def probe_target(layout: StoreLayout, metadata: Mapping[str, Any], environ: Mapping[str, str],
                 generation: bool = True) -> ProbeTarget:
    """How to probe a release, from its own recorded profile (so a rollback probes the old release correctly).

    Only the generation rung sends the API key, so a probe without it needs none (and reads none)."""
    server = read_stored_profile(metadata.get("profile")).server
    version = metadata.get("sglang_version")
    with_key = generation and server.api_key is not None
    return ProbeTarget(unit=layout.unit_name, port=server.port, host=server.host,
                       health_path=health_path_for(str(version)) if version else "/health",
                       generation=GenerationProbe() if generation else None,
                       api_key=read_secret(API_KEY_ENV, server.api_key, environ) if with_key else None)


def start_prediction(store: StoreFacts, profile_name: str) -> StartPrediction | None:
    durations = [entry.timings["ready"] for entry in store.history
                 if entry.outcome == HEALTHY and entry.tags.profile == profile_name and "ready" in entry.timings]
    return predict_start(durations)


@dataclass
class _Run:
    """One command against one host: the remote, the clock, where timings go, and how far the transition got."""

    remote: Remote
    layout: StoreLayout
    target: Target
    progress: Progress
    environ: Mapping[str, str]
    clock: Callable[[], float] = time.monotonic
    grace_s: float = GRACE_S
    timings: dict[str, float] = field(default_factory=dict)
    cursor: str | None = None  # the unit's journal position just before the last restart
    previous: str | None = None  # the release `current` named when the command read the host
    switched_to: str | None = None  # the release `current` was last switched to
    verified: str | None = None  # the release the last ladder found ready
    before_restart: Callable[[], None] | None = None
    unsent: list[Step | Put] = field(default_factory=list)  # the verified batch, sent with the healthy record

    @property
    def where(self) -> str:
        return self.target.host.name

    def phase(self, name: str, batch: list[Step | Put]) -> list[StepResult]:
        if not batch:
            return []
        self.progress.phase_started(name)
        started = self.clock()
        results = self.remote.run(batch)
        self.timings[name] = round(self.clock() - started, 3)
        self.progress.step_done(name, self.timings[name])
        return results

    def record(self, event: str, outcome: str, tags: Tags, cause: str = "", then: Sequence[Step | Put] = ()
               ) -> list[StepResult]:
        """Append the history line, in one round trip with the verified batch of the start it records healthy
        (what `activate` left unsent) and with `then`."""
        verified, self.unsent = (self.unsent if outcome == HEALTHY else []), []
        entry = history_entry(event, outcome, tags, datetime.now(UTC), cause, self.timings)
        return self.remote.run([*verified, *append_history(self.layout, entry), *then])

    def journal_diagnosis(self, cursor: str | None, profile: str | None) -> Diagnosis:
        """Why the release of `profile` did not start, from the unit's journal since `cursor`."""
        result = self.remote.run([JOURNAL_SYNC, journal_step(self.layout.unit_name, cursor)])[-1]
        return diagnose(result.stdout.splitlines(), profile=profile)

    def check_target(self, release_id: str, metadata: Mapping[str, Any]) -> HostFacts:
        """Preflight for switching to a recorded release (rollback): what deploy checks, plus the release's files."""
        release = RecordedRelease.of(release_id, metadata)
        for note in release.profile.notes(release_id):
            self.progress.note(note)
        toolkit_home = cuda_home(release.environment) if release.profile.features.allreduce_fusion else None
        facts = read_host_facts(self.remote, self.layout, release.venv, release.profile.server.port, toolkit_home,
                                release.profile.service.working_directory, release_id=release_id)
        check_release(release, self.target, facts)
        check_release_files(release, self.layout, facts, self.where)
        return facts

    def live_verdict(self, metadata: Mapping[str, Any]) -> Verdict:
        """One probe of the running server up to the health endpoint (no generation): is it ready right now?"""
        target = probe_target(self.layout, metadata, self.environ, generation=False)
        try:
            [result] = self.remote.run([probe_step(target, Rung.HEALTH)])
            return assess(parse_snapshot(result, Rung.HEALTH), None, Rung.HEALTH)
        except ReadinessFailed as broken:
            return NotReady(broken.message, broken.rung, broken.evidence)

    def activate(self, release_id: str, metadata: Mapping[str, Any], prediction: StartPrediction | None,
                 grace_s: float, batches: Mapping[str, Sequence[Step | Put]] | None = None,
                 staged: Sequence[Step | Put] = ()) -> ReadyReport:
        """Switch `current` to a release on the host, restart, and climb the readiness ladder.

        A deploy gives its plan's batches (what its dry run listed), with the stage batch in `staged`; a switch
        back to a recorded release takes the same batches for that release. One round trip stages, reads the
        journal position, switches and restarts; from that position on, the ladder shows this start's log lines
        and a failure is diagnosed from them (`self.cursor`)."""
        batches = batches or {ACTIVATE: activation_steps(self.layout, release_id),
                              VERIFIED: [reset_failed_step(self.layout)]}
        if self.before_restart is not None:
            self.before_restart()
        restarted_at = self.clock()
        self.switched_to = release_id  # from here on a signal switches back: the switch may be under way
        results = self.phase(f"stage, {ACTIVATE}" if staged else ACTIVATE, [*staged, *batches[ACTIVATE]])
        cursor_step = journal_cursor_step(self.layout.unit_name)
        self.cursor = parse_journal_cursor(next(r.stdout for r in results if r.step == cursor_step))
        service = read_stored_profile(metadata.get("profile")).service
        self.progress.phase_started("readiness")
        report = wait_ready(self.remote, probe_target(self.layout, metadata, self.environ),
                            deadline_s=service.startup_timeout_s, progress=self.progress, rung=Rung.GENERATE,
                            baseline_restarts=0, after_cursor=self.cursor, prediction=prediction, grace_s=grace_s,
                            started_at=restarted_at, clock=self.clock)
        self.verified = release_id
        self.timings["ready"] = round(report.duration_s, 3)
        self.progress.step_done("readiness", report.duration_s)
        # The verified start leaves the start-limit window (reset-failed), so the restart policy allows the same number
        # of restarts whether a crash comes a minute or a day after the deploy; sent with the healthy record.
        self.unsent = list(batches[VERIFIED])
        return report

    def host_state(self) -> str:
        """Where `current` points and what the unit does, read once more (best effort: after an interrupt)."""
        steps = [Step("state: current", ("readlink", "--", str(self.layout.current)), ok=ABSENT_OK),
                 Step("state: unit", ("systemctl", "show", "-p", "ActiveState,SubState", "--", self.layout.unit_name))]
        try:
            try:
                current, unit = self.remote.run(steps)
            except ConnectFailed:  # the interrupt cut a round trip (a probe waiting on the host): read over a new one
                current, unit = self.remote.run(steps)
        except (DeployError, KeyboardInterrupt) as error:
            return f"unknown (it could not be read: {error or type(error).__name__})"
        props = parse_systemctl_show(unit.stdout)
        return (f"current: {parse_current(current.stdout) or 'none'}, unit {props.get('ActiveState', '?')}/"
                f"{props.get('SubState', '?')}")

    def interrupted_outside(self, stop: KeyboardInterrupt) -> Interrupted:
        """The error for a signal that came outside a switch and its verification."""
        name = signal_name(stop)
        if self.switched_to is None:
            serving = f": release {self.previous} is current" if self.previous else ""
            return interrupted(stop, f"{self.where}: interrupted ({name}) before the switch; nothing was switched or "
                                     f"restarted{serving}")
        if self.verified == self.switched_to:
            return interrupted(stop, f"{self.where}: interrupted ({name}) after release {self.verified} was verified; "
                                     f"release {self.verified} is serving")
        return interrupted(stop, f"{self.where}: interrupted ({name}) while release {self.switched_to} was not "
                                 f"verified; the host now: {self.host_state()}",
                           hint="`invoke status` shows whether it serves; a deploy or rollback verifies it")


def _stop_unit(remote: Remote, layout: StoreLayout) -> None:
    remote.run([stop_step(layout)])


def gate_diagnosis(failure: GateFailed) -> Diagnosis:
    """A release that started but benchmarked too slow: the verdict is the cause, the GPU telemetry the evidence."""
    return Diagnosis("throughput_gate", failure.message, failure.hint or "", failure.evidence)


def interruption(stop: KeyboardInterrupt) -> tuple[Interrupted, Diagnosis]:
    """A signal during a switch, as the failure of the release being verified."""
    cause = f"interrupted by {signal_name(stop)} before it was verified"
    return interrupted(stop, cause), Diagnosis("interrupted", cause, "", ())


def failure_line(failure: DeployError, diagnosis: Diagnosis) -> str:
    """One line: what the ladder saw, and the cause the journal shows when it matches a known signature."""
    if diagnosis.signature == "unknown":
        return f"{failure.message} (no known failure signature in the log)"
    if isinstance(failure, GateFailed | Interrupted):
        return diagnosis.cause
    return f"{diagnosis.one_line()}; {failure.message}"


def _same_kind(failure: DeployError, message: str, diagnosis: Diagnosis) -> DeployError:
    """The error to end with after the restore: of the first failure's kind, with the new message."""
    if isinstance(failure, Interrupted):
        return type(failure)(message, failure.hint)
    error = GateFailed if isinstance(failure, GateFailed) else ReadinessFailed
    evidence = diagnosis.evidence or getattr(failure, "evidence", ())
    return error(message, getattr(failure, "rung", ""), evidence, diagnosis.hint or failure.hint)


def _restore(run: _Run, store: StoreFacts, failed_id: str, failure: DeployError, diagnosis: Diagnosis,
             restore_id: str | None, previous_id: str | None) -> NoReturn:
    """Return the host to `restore_id` after `failed_id` failed or was interrupted; raise what the user must know
    (about `failed_id`, which replaced `previous_id`)."""
    try:
        _switch_back(run, store, failed_id, failure, diagnosis, restore_id)
    except DeployError as ended:
        ended.about(failed_id, previous_id, run.timings)
        raise


def _switch_back(run: _Run, store: StoreFacts, failed_id: str, failure: DeployError, diagnosis: Diagnosis,
                 restore_id: str | None) -> NoReturn:
    """The restore: the target passes the same preflight as any switch and the same ladder, grace window included."""
    where, first = run.where, failure_line(failure, diagnosis)
    if restore_id is None:
        _stop_unit(run.remote, run.layout)
        raise _same_kind(failure, f"{where}: release {failed_id} failed: {first}; there is no earlier healthy "
                                  "release to roll back to, so the unit is stopped", diagnosis)
    metadata = dict(record.metadata) if (record := store.release(restore_id)) else {}
    tags = recorded_tags(run.target, restore_id, metadata)
    try:
        run.check_target(restore_id, metadata)
    except PreflightError as refused:
        _stop_unit(run.remote, run.layout)
        run.record("rollback", FAILED, tags, refused.message)
        raise RollbackFailed(f"{where}: release {failed_id} failed ({first}) and the rollback target {restore_id} "
                             f"cannot run: {refused.message}; the unit is stopped", original=failure,
                             hint=refused.hint) from None
    run.progress.note(f"rolling back to release {restore_id}")
    run.timings = {}
    try:
        run.activate(restore_id, metadata, start_prediction(store, tags.profile), run.grace_s)
    except ReadinessFailed as second:
        second_diagnosis = run.journal_diagnosis(run.cursor, record.metadata.get("profile_name"))
        _stop_unit(run.remote, run.layout)
        run.record("rollback", FAILED, tags, failure_line(second, second_diagnosis))
        raise RollbackFailed(
            f"{where}: release {failed_id} failed ({first}) and the rollback to {restore_id} "
            f"failed too ({failure_line(second, second_diagnosis)}); the unit is stopped",
            original=failure,
            hint=f"first failure: {diagnosis.hint}\n  rollback failure: {second_diagnosis.hint}") from second
    except KeyboardInterrupt as again:
        state = run.host_state()
        cause = f"interrupted again ({signal_name(again)}) during the rollback to {restore_id}, before it was verified"
        try:
            run.record("rollback", FAILED, tags, cause)
        except (DeployError, KeyboardInterrupt):
            pass  # the host's state, said below, matters more than the history line
        raise interrupted(again, f"{where}: {cause}; the host now: {state}",
                          hint="`invoke status` shows whether it serves; `invoke rollback` or a deploy verifies it"
                          ) from None
    run.record("rollback", HEALTHY, tags, f"after {failed_id} failed: {first}")
    ended = _same_kind(failure, f"{where}: release {failed_id} failed: {first}; rolled back, release {restore_id} "
                                "is serving", diagnosis)
    ended.serving_id = restore_id
    raise ended


def deploy(loaded: LoadedProfile, target: Target, remote: Remote, progress: Progress, options: Options,
           clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Take the host to the profile's release, or back to its last healthy one; raise DeployError on failure.

    Everything but a dry run holds the host's lock from the first read on: the venv build, the decision, the
    switch and the prune see one consistent store that no other command changes meanwhile. SIGINT and SIGTERM
    after the switch finish the transition (back to the last healthy release) and end the command with
    Interrupted/Terminated."""
    profile = loaded.profile
    run = _Run(remote, target.layout(profile.service.name), target, progress, options.environ, clock,
               grace_s=options.grace_s, before_restart=options.before_restart)
    with signals_raise():
        try:
            if options.dry_run:  # a plan needs no secret value: it says which ones it could not read
                return _deploy(run, loaded, options, *available_secrets(profile, options.environ))
            secrets = resolve_secrets(profile, options.environ)  # ConfigError before any connection
            with host_lock(remote, run.layout, f"deploy {loaded.name}", target.host.name):
                return _deploy(run, loaded, options, secrets, {})
        except KeyboardInterrupt as stop:
            raise run.interrupted_outside(stop) from None


def _deploy(run: _Run, loaded: LoadedProfile, options: Options, secrets: Mapping[str, str],
            not_available: Mapping[str, str]) -> Outcome:
    profile, remote, layout, target, progress = loaded.profile, run.remote, run.layout, run.target, run.progress
    model = weights(profile, target.host.vars, secrets)
    venv = options.venv or choose_venv(remote, layout, target, profile, options.dry_run, progress)
    progress.phase_started("facts")
    started = run.clock()
    # the toolkit decides only whether FlashInfer can JIT-build the fusion's kernels (deploy_lib/cuda_toolkit.py)
    toolkit_home = cuda_home(launch_environment(profile)) if profile.features.allreduce_fusion else None
    facts = read_host_facts(remote, layout, venv.path, profile.server.port, toolkit_home,
                            profile.service.working_directory, model.fact_steps(venv.path))
    current = facts.store.release(facts.store.current) if facts.store.current else None
    hand_pid = hand_run_pid(current.metadata if current else None,
                            remote.run(hand_run_check(current.metadata if current else None)))
    run.previous = facts.store.current
    run.timings["facts"] = round(run.clock() - started, 3)
    model_facts = model.parse(facts.model_results)
    check_model(model, model_facts, target.host.name)
    plan = plan_deploy(loaded, target, facts, secrets, options.force, datetime.now(UTC), venv, options.patches,
                       not_available, hand_pid, model, model_facts)
    preflight(plan, loaded, target, facts, hand_pid)
    if plan.unchanged and not isinstance(verdict := run.live_verdict(plan.release.metadata()), Ready):
        plan = replace(plan, unchanged=False, notes=(*plan.notes, f"release {plan.release.id} is current but not "
                                                     f"ready ({verdict.message}): it is restarted and verified"))
    for note in () if options.dry_run else plan.notes:  # a dry run prints them with the plan
        progress.note(note)
    if options.dry_run:
        return Outcome("planned", plan.release_id, plan.current_id, plan=plan, timings=run.timings)
    if plan.unchanged:
        return Outcome("unchanged", plan.release.id, plan.current_id, plan=plan, timings=run.timings)
    tags = release_tags(target, plan.release)
    restore_id = facts.store.last_healthy(exclude=plan.release.id)
    record_new_crashes(remote, layout, facts.store, facts.unit)  # the restart below resets their count
    if not model_facts.complete:
        stage_weights(run, model, venv.path, plan, facts)
    staged = plan.batches.get("stage", [])
    if plan.gpu_check_reasons:  # the NCCL check runs between the stage and the switch: the stage goes alone, first
        run.phase("stage", staged)
        staged = []
    gate = profile.gate or (GateSettings() if options.gate else None)
    try:
        if plan.gpu_check_reasons:
            check_before_start(run, plan)
        ready = run.activate(plan.release.id, plan.release.metadata(), start_prediction(facts.store, loaded.name),
                             options.grace_s, plan.batches, staged)
        if gate is not None:
            from deploy_lib.throughput import gate_after_ready  # the benchmark's code loads only for a gated deploy

            remote.run(run.unsent)  # the start is verified before the benchmark judges it
            run.unsent = []
            gate_after_ready(remote, layout, plan.release.metadata(), tags, profile.bench, gate,
                             facts.store.history, progress, secrets.get(API_KEY_ENV))
    except ReadinessFailed as failure:
        diagnosis = gate_diagnosis(failure) if isinstance(failure, GateFailed) else \
            diagnose(failure.evidence, profile=loaded.name) if isinstance(failure, GpuCheckFailed) else \
            run.journal_diagnosis(run.cursor, loaded.name)
        run.record("deploy", FAILED, tags, failure_line(failure, diagnosis))
        _restore(run, facts.store, plan.release.id, failure, diagnosis, restore_id, plan.current_id)
    except KeyboardInterrupt as stop:
        run.verified = None  # a gate cut short has not judged the release
        interrupt, diagnosis = interruption(stop)
        run.record("deploy", FAILED, tags, diagnosis.cause)
        _restore(run, facts.store, plan.release.id, interrupt, diagnosis, restore_id, plan.current_id)
    # the store as the record leaves it: what the lock let no one else change, plus the release just staged
    known = [*facts.store.releases, ReleaseRecord(plan.release.id, "", plan.release.metadata())]
    read = run.record("deploy", HEALTHY, tags, then=prune_read_steps(layout, known))
    prune(remote, layout, profile.service.keep_releases, tags, progress, read)
    return Outcome("deployed", plan.release.id, plan.current_id, plan=plan, ready=ready, timings=run.timings)


def check_before_start(run: _Run, plan: Plan) -> None:
    """preflight.gpu_check: stop the old server, verify NCCL's all-reduce with the new release's venv and
    environment, and raise GpuCheckFailed (a failed start: the caller rolls back) unless it verified."""
    subject = gpu_check.subject_of_release(plan.release.id, plan.release.metadata())
    if run.before_restart is not None:  # the check stops the old server
        run.before_restart()
    try:
        results = run.phase("gpu check", plan.batches["gpu check"])
    except RemoteError as lost:  # the old server may be stopped already: roll back as after any failed start
        raise GpuCheckFailed(f"the NCCL check did not complete: {lost.message}", "gpu check",
                             (f"{gpu_check.REPORT_PREFIX}error: {lost.message}",)) from lost
    report = gpu_check.read_check_batch(subject, results)
    for warning in report.advice.warnings if report.advice else ():
        run.progress.note(f"gpu check: {warning}")
    if not report.check.verified:
        raise GpuCheckFailed(f"release {plan.release.id}'s NCCL check failed; SGLang was not started", "gpu check",
                             tuple(gpu_check.REPORT_PREFIX + line for line in report.check.lines()))
    run.progress.note(f"gpu check: {report.check.summary()}")


def stage_weights(run: _Run, model: Weights, venv: str, plan: Plan, facts: HostFacts) -> None:
    """The model phase: bring the weights the release names onto the host, while the old release serves."""
    run.progress.phase_started(f"model: {model.label}")
    started = run.clock()
    if isinstance(model, HubModel):
        staged = stage_model(run.remote, model, venv, plan.release.model["commit"], run.progress, run.clock)
    else:
        assert isinstance(model, PushedModel)
        staged = push_model(run.remote, model, facts.model_results[0].stdout, run.progress, run.clock)
    run.timings["model"] = round(run.clock() - started, 3)
    run.progress.step_done(f"model: {len(staged.files)} files, {size_text(staged.total_bytes)} staged",
                           run.timings["model"])


def prune_read_steps(layout: StoreLayout, releases: Sequence[ReleaseRecord]) -> list[Step | Put]:
    """What prune decides from: the store's releases, current and history, its venvs, and the weights kept where
    `releases` keep theirs."""
    return [*release_fact_steps(layout), *venv_store_fact_steps(layout), *listing_steps(model_locations(releases))]


def prune(remote: Remote, layout: StoreLayout, keep: int, tags: Tags, progress: Progress,
          read: Sequence[StepResult]) -> tuple[str, ...]:
    """Releases beyond keep-N (never current or the last healthy), leftovers and damaged releases, then venvs and
    staged model revisions no kept release uses. What was removed is shown and recorded in history (a damaged
    release with its reason), in one round trip.

    Decided from a fresh read (`prune_read_steps`, sent with the commit's history line): what is on the host after
    the commit, current and history included."""
    store, venv_store = parse_store_facts(layout, read), parse_venv_store_facts(layout, read)
    doomed = releases_to_prune(store, keep)
    kept_venvs = [release_venv_hash(layout, str(r.metadata.get("venv", ""))) for r in store.releases
                  if r.id not in doomed]
    venv_plan = plan_prune(venv_store, kept_venvs)
    stored = parse_stored(read, store.releases)
    kept = {r.id for r in store.releases if r.id not in doomed}
    removed = (*describe_pruned_releases(store, doomed), *describe_prune(venv_plan),
               *(f"model {item.name} {item.version[:12]}" for item in doomed_models(stored, kept)))
    if not removed:
        return ()
    remote.run([*prune_releases(layout, doomed), *prune_steps(layout, venv_plan),
                *prune_models(stored, kept, model_locations(store.releases)),
                *append_history(layout, history_entry("prune", HEALTHY, tags, datetime.now(UTC),
                                                      "removed " + "; ".join(removed)))])
    progress.note("pruned " + "; ".join(removed))
    return removed


def rollback(target: Target, service: str, remote: Remote, progress: Progress, to: str | None,
             environ: Mapping[str, str], clock: Callable[[], float] = time.monotonic,
             grace_s: float = GRACE_S) -> Outcome:
    """Switch to release `to` (default: the last healthy one before current) after the same preflight as a deploy,
    and verify it; when it fails (or a signal comes), switch back to the release that was serving."""
    run = _Run(remote, target.layout(service), target, progress, environ, clock, grace_s=grace_s)
    with signals_raise():
        try:
            return _rollback(run, to)
        except KeyboardInterrupt as stop:
            raise run.interrupted_outside(stop) from None


def _rollback(run: _Run, to: str | None) -> Outcome:
    store = read_store_facts(run.remote, run.layout)
    run.previous = store.current
    target_id = to or store.last_healthy(exclude=store.current)
    if target_id is None:
        raise ConfigError(f"{run.where}: no healthy release to roll back to (current: {store.current or 'none'})",
                          "`invoke releases` lists what is on the host")
    record = store.release(target_id)
    damaged = store.damaged_release(target_id)
    if damaged is not None:
        raise PreflightError(f"{run.where}: cannot roll back to release {target_id}: it is damaged: "
                             f"{damaged.reason}, in {run.layout.release(target_id)}",
                             "`invoke releases` lists the releases and what is wrong with each; nothing was changed")
    if record is None:
        known = ", ".join(r.id for r in store.releases) or "none"
        raise ConfigError(f"{run.where}: release {target_id!r} is not on the host", f"releases: {known}")
    tags = recorded_tags(run.target, target_id, record.metadata)
    facts = run.check_target(target_id, record.metadata)
    serving = store.current if store.current != target_id and facts.store.release(store.current or "") else None
    restore_id = serving or facts.store.last_healthy(exclude=target_id)
    with host_lock(run.remote, run.layout, f"rollback to {target_id}", run.where):
        record_new_crashes(run.remote, run.layout, facts.store, facts.unit)  # a crash loop: why a person rolls back
        try:
            ready = run.activate(target_id, record.metadata, start_prediction(facts.store, tags.profile), run.grace_s)
        except ReadinessFailed as failure:
            diagnosis = run.journal_diagnosis(run.cursor, tags.profile)
            run.record("rollback", FAILED, tags, failure_line(failure, diagnosis))
            _restore(run, facts.store, target_id, failure, diagnosis, restore_id, store.current)
        except KeyboardInterrupt as stop:
            interrupt, diagnosis = interruption(stop)
            run.record("rollback", FAILED, tags, diagnosis.cause)
            _restore(run, facts.store, target_id, interrupt, diagnosis, restore_id, store.current)
        run.record("rollback", HEALTHY, tags, f"by hand from {store.current or 'none'}")
    return Outcome("rolled back", target_id, store.current, ready=ready, timings=run.timings)


def _current_release(store: StoreFacts, where: str) -> ReleaseRecord:
    record = store.release(store.current) if store.current else None
    if record is None or "tags" not in record.metadata:
        raise ConfigError(f"{where}: no release is deployed (current: {store.current or 'none'})",
                          "`invoke deploy --profile P` first, or `invoke adopt` a server that runs by hand")
    return record


def start(target: Target, service: str, remote: Remote, progress: Progress, environ: Mapping[str, str],
          restart: bool, clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Start (or restart) the current release and climb the readiness ladder, as a deploy does; a release that
    does not come up is rolled back to the last healthy one like a failed deploy. Under the host's lock."""
    layout = target.layout(service)
    event = "restart" if restart else "start"
    with host_lock(remote, layout, event, target.host.name):
        facts = read_host_facts(remote, layout, venv=None, port=None)
        record = _current_release(facts.store, target.host.name)
        if not restart and facts.unit.active_state == "active":
            return Outcome("already running", record.id, record.id)
        tags = Tags.from_dict(record.metadata["tags"])
        run = _Run(remote, layout, target, progress, environ, clock)
        try:
            ready = run.activate(record.id, record.metadata, start_prediction(facts.store, tags.profile), GRACE_S)
        except ReadinessFailed as failure:
            diagnosis = run.journal_diagnosis(run.cursor, tags.profile)
            run.record(event, FAILED, tags, failure_line(failure, diagnosis))
            _restore(run, facts.store, record.id, failure, diagnosis, facts.store.last_healthy(exclude=record.id),
                     record.id)
        run.record(event, HEALTHY, tags)
    return Outcome("restarted" if restart else "started", record.id, record.id, ready=ready, timings=run.timings)


def stop(target: Target, service: str, remote: Remote) -> Outcome:
    """Stop the current release's unit (SGLang drains in-flight requests first); recorded in history."""
    layout = target.layout(service)
    with host_lock(remote, layout, "stop", target.host.name):
        store = read_store_facts(remote, layout)
        record = _current_release(store, target.host.name)
        tags = Tags.from_dict(record.metadata["tags"])
        hand_pid = hand_run_pid(record.metadata, remote.run(hand_run_check(record.metadata)))
        if hand_pid:
            remote.run(stop_hand_run(hand_pid, Profile.model_validate(record.metadata["profile"]).service
                                     .stop_timeout_s))
        _stop_unit(remote, layout)
        _Run(remote, layout, target, NullProgress(), {}).record("stop", STOPPED, tags, "by hand")
    return Outcome("stopped", record.id, record.id)


__all__ = ["DeployError", "Options", "Outcome", "Plan", "deploy", "plan_deploy", "preflight", "rollback", "start",
           "stop"]
