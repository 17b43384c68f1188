"""The deploy measurements of bench/run.py: a rig (a tmp project with bench profiles, the guest's inventory) and
one function per measured run, each returning its figures' raw seconds."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bench.timeline import (
    READY_LINE,
    GuestSshCpu,
    Journal,
    StampedProgress,
    StampedRemote,
    exit_instant,
    first_entry,
    ready_instant,
    restart_instant,
)
from deploy_lib import venvs
from deploy_lib.commands import deploy as engine
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.errors import ReadinessFailed
from deploy_lib.health.downtime import Downtime
from deploy_lib.host import venv_build
from deploy_lib.host.store import host_lock
from deploy_lib.remote import FabricRemote, SSHTarget, Step
from deploy_lib.store import StoreLayout
from sandbox import manage

REPO = Path(__file__).resolve().parents[1]
FAULT_FILE = "/etc/sglang-sim/fault-bench"  # read only by the bench-crash profile's releases
PROFILE = "glm5-nvfp4"
CRASH_PROFILE = "bench-crash"
VENV_LAYOUT = StoreLayout("bench", root=PurePosixPath("/opt/sglang-deploy-bench"))


# ---------------------------------------------------------------------------------------------------------
# The rig: a tmp project with bench profiles, the guest's inventory, one connection per command


@dataclass
class Rig:
    guest: manage.Guest
    project: Project
    inventory: str
    journal: Journal
    ssh_cpu: GuestSshCpu

    @contextmanager
    def command(self, profile: str, options: engine.Options | None = None
                ) -> Iterator[tuple[StampedRemote, StampedProgress, Callable[[], engine.Outcome]]]:
        """What one `invoke deploy --profile P` holds: one SSH connection, a progress, the deploy to call."""
        loaded, target = load_for_host(self.project, profile, self.inventory, None)
        remote = StampedRemote(FabricRemote(target.ssh))
        progress = StampedProgress()
        try:
            yield remote, progress, lambda: engine.deploy(loaded, target, remote, progress,
                                                          options or engine.Options())
        finally:
            remote.close()

    def root(self, command: str) -> str:
        return manage.run_on(self.guest, command, user="root")


def make_rig(guest: manage.Guest, root: Path, changed_runs: int) -> Rig:
    shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
    profiles = root / "inventory" / "profiles"
    for run in range(changed_runs):
        (profiles / f"bench-{run}.yaml").write_text(f"extends: {PROFILE}\nenv:\n  BENCH_RUN: '{run}'\n")
    (profiles / f"{CRASH_PROFILE}.yaml").write_text(
        f"extends: {PROFILE}\nenv:\n  SGLANG_SIM_FAULT: {FAULT_FILE}\nservice:\n  startup_timeout_s: 30\n")
    inventory = root / "inventory" / "sandbox.yaml"
    inventory.write_text(manage.inventory_text([guest]))
    return Rig(guest, Project(root), str(inventory), Journal(guest), GuestSshCpu(guest))


# ---------------------------------------------------------------------------------------------------------
# Measurements


@dataclass(frozen=True)
class NoOpRun:
    seconds: float
    round_trips: int


def no_op_redeploy(rig: Rig) -> NoOpRun:
    started = time.time()
    with rig.command(PROFILE) as (remote, _progress, deploy):
        outcome = deploy()
    seconds = time.time() - started
    assert outcome.action == "unchanged", outcome.action
    return NoOpRun(seconds, remote.inner.round_trips)


LONG_STEP_S = 5.0


@dataclass(frozen=True)
class LongStepRun:
    seconds: float
    cpu_s: float  # this process's CPU (all its threads) while the one round trip of the step ran


def long_step_cpu(rig: Rig) -> LongStepRun:
    """One round trip whose step runs LONG_STEP_S (`sleep`), as a venv build, a model download or a gpu check runs
    minutes: what waiting for it costs the client, on a connection opened before."""
    _, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
    with FabricRemote(target.ssh) as remote:
        remote.run([Step("connect", ("true",))])
        cpu, started = time.process_time(), time.time()
        remote.run([Step("a long step", ("sleep", f"{LONG_STEP_S:g}"), timeout_s=LONG_STEP_S + 60)])
        return LongStepRun(time.time() - started, time.process_time() - cpu)


@dataclass(frozen=True)
class ProcessRun:
    seconds: float
    cpu_s: float  # user + sys of the process: what a loaded machine inflates far less than the wall time
    guest_cpu_s: float = 0.0  # the guest's CPU for the command's SSH connections and all they ran (GuestSshCpu)


def whole_process_no_op(rig: Rig, pycache: Path, write_pyc: bool = False) -> ProcessRun:
    """`invoke deploy --profile P --yes` as a user runs it, a no-op: the process's wall time, Python's start and
    every import included. Bytecode is cached (in `pycache`) as an installed tool's is: a first run with `write_pyc`
    (invoke's --write-pyc; invoke writes none of what it imports after its own options otherwise) writes it."""
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    argv = [sys.executable, "-m", "invoke", *(["--write-pyc"] if write_pyc else []), "--search-root", str(REPO),
            "deploy", "--profile", PROFILE, "--yes", "--inventory", rig.inventory]
    guest_before = rig.ssh_cpu.seconds()
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**environ, "PYTHONPYCACHEPREFIX": str(pycache)})
    seconds, after = time.time() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0 and "no changes" in done.stdout, done.stdout + done.stderr
    return ProcessRun(seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                      rig.ssh_cpu.seconds() - guest_before)


@dataclass(frozen=True)
class ProcessParts:
    """One run of bench/noop_parts.py: each part's (wall, CPU) seconds, in the order the deploy task runs them."""

    parts: dict[str, tuple[float, float]]
    round_trips: int


def no_op_parts(rig: Rig, pycache: Path) -> ProcessParts:
    """The whole process's parts, from a fresh process that does what the deploy task does (bench/noop_parts.py):
    where the work goes."""
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-m", "bench.noop_parts", repr(time.time()), rig.inventory, PROFILE],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**environ, "PYTHONPYCACHEPREFIX": str(pycache)})
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    parts = {"Python's start (interpreter, site)": (report["interpreter"]["wall_s"], report["interpreter"]["cpu_s"])}
    parts |= {part["name"]: (part["wall_s"], part["cpu_s"]) for part in report["parts"]}
    return ProcessParts(parts, report["round_trips"])


@dataclass(frozen=True)
class ChangedRun:
    total_s: float
    before_restart_s: float  # command start -> restart issued (profile, connect, facts, stage, switch)
    restart_to_job_s: float  # restart batch sent -> systemd's first job message (enable, any daemon-reload first)
    server_start_s: float   # restart instant -> "fired up" (the journal's clock)
    ready_noticed_s: float  # "fired up" -> the ladder's Ready verdict
    generation_s: float     # of it, the server answering the ladder's one real generation (the probe's own clock)
    grace_s: float          # the ladder's grace window after Ready (a failed start caught early, by design)
    ladder_to_return_s: float  # ladder returned -> deploy returned (history, prune, close)
    round_trips: int
    phases: dict[str, float]
    daemon_reloads: int  # `systemctl daemon-reload` steps sent (none: systemd held the release's unit text)
    downtime: Downtime  # what the deploy itself measured and printed: the old server's stop -> the first answer
    old_stop_s: float   # systemd's "Stopping" -> "Started" (journal): the old server's drain and exit, systemd

    @property
    def tool_s(self) -> float:
        return self.total_s - self.server_start_s


def changed_deploy(rig: Rig, profile: str) -> ChangedRun:
    cursor = rig.journal.cursor()
    started = time.time()
    with rig.command(profile) as (remote, progress, deploy):
        outcome = deploy()
        returned = time.time()
    ended = time.time()
    assert outcome.action == "deployed" and outcome.downtime is not None, (outcome.action, outcome.downtime)
    entries = rig.journal.since_showing(cursor, READY_LINE)
    [restart] = remote.restarts()
    restarted = restart_instant(entries, restart.started)
    ready = ready_instant(entries, restarted)
    new_started = first_entry(entries, restarted, lambda entry: entry.job_type == "start")
    noticed = progress.first("done", "readiness: generate", restart.ended)
    ladder_returned = progress.first("done", "readiness", noticed)
    return ChangedRun(total_s=ended - started, before_restart_s=restart.started - started,
                      restart_to_job_s=restarted - restart.started,
                      server_start_s=ready - restarted, ready_noticed_s=noticed - ready,
                      generation_s=generation.seconds if outcome.ready and (generation := outcome.ready.snapshot
                                                                             .generation) else 0.0,
                      grace_s=progress.first("done", "readiness: grace", noticed) - noticed,
                      ladder_to_return_s=returned - ladder_returned, round_trips=remote.inner.round_trips,
                      phases=dict(outcome.timings),
                      daemon_reloads=sum(batch.names.count("systemd: daemon-reload") for batch in remote.batches),
                      downtime=outcome.downtime, old_stop_s=new_started - restarted)


@dataclass(frozen=True)
class CrashRun:
    noticed_s: float         # process exit (journal) -> the ladder raised
    rollback_s: float        # the ladder raised -> deploy raised "rolled back"
    previous_start_s: float  # the rollback's restart instant -> "fired up" of the previous release
    grace_s: float           # the restored release's grace window after Ready, as any start's


def crash_and_roll_back(rig: Rig) -> CrashRun:
    cursor = rig.journal.cursor()
    with rig.command(CRASH_PROFILE) as (remote, progress, deploy):
        try:
            deploy()
        except ReadinessFailed as failure:
            raised = time.time()
            assert "rolled back" in failure.message, failure.message
        else:
            raise AssertionError(f"{CRASH_PROFILE} started although its release reads the oom fault")
    entries = rig.journal.since(cursor)
    crash_restart, rollback_restart = remote.restarts()
    exited = exit_instant(entries, crash_restart.started)
    ladder_raised = remote.after_ladder(crash_restart).started
    restarted = restart_instant(entries, rollback_restart.started)
    restored_ready = progress.first("done", "readiness: generate", rollback_restart.ended)
    return CrashRun(noticed_s=ladder_raised - exited, rollback_s=raised - ladder_raised,
                    previous_start_s=ready_instant(entries, restarted) - restarted,
                    grace_s=progress.first("done", "readiness: grace", restored_ready) - restored_ready)


@dataclass(frozen=True)
class VenvRun:
    seconds: float
    bytes_sent: int
    wheels_sent: tuple[str, ...]
    round_trips: int



def ensure_venv_timed(ssh: SSHTarget, spec: venvs.VenvSpec) -> VenvRun:
    """ensure_venv on an open connection inside the host's lock: the venv work a deploy adds, not the SSH handshake
    and the lock it has anyway."""
    with FabricRemote(ssh) as remote, host_lock(remote, VENV_LAYOUT, "bench", "the guest"):
        before = remote.round_trips
        started = time.time()
        result = venv_build.ensure_venv(remote, VENV_LAYOUT, spec)
        return VenvRun(time.time() - started, result.bytes_sent, result.wheels_sent, remote.round_trips - before)

