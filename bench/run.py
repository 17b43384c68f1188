"""`make bench`: the performance figures of issues 4 (deploy, readiness, rollback), 5 (venvs) and 12 (model
staging), measured on a sandbox guest of its own that is always stopped at the end.

Every figure is the median of several runs, printed with its target and PASS/MISS; the exit code is 0 either way
(figures, not assertions). Instants on the host (the restart, "fired up", the process exit) are the journal's
__REALTIME_TIMESTAMP; the guest is a container on this machine, so its clock is this machine's clock and they
compare directly with time.time() taken here.

    .venv/bin/python -m bench.run [--runs 5] [--venv-runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tenacity import RetryCallState

from deploy_lib import deploy as engine
from deploy_lib import venvs
from deploy_lib.errors import ReadinessFailed
from deploy_lib.project import Project, load_for_host
from deploy_lib.remote import FabricRemote, OutputLine, Put, SSHTarget, Step, StepResult
from deploy_lib.store import StoreLayout, host_lock
from sandbox import hub, manage, wheelhouse

REPO = Path(__file__).resolve().parents[1]
UNIT = "sglang.service"
READY_LINE = "The server is fired up and ready to roll!"
EXIT_LINE = "Main process exited"
FAULT_FILE = "/etc/sglang-sim/fault-bench"  # read only by the bench-crash profile's releases
PROFILE = "glm5-nvfp4"
CRASH_PROFILE = "bench-crash"
VENV_LAYOUT = StoreLayout("bench", root=PurePosixPath("/opt/sglang-deploy-bench"))
# flashinfer-python versions other than the wheelhouse's, one per "one changed package" run
OTHER_FLASHINFER = ("0.6.12", "0.6.16.post4", "0.6.17")
# A real CUDA library wheel of a few hundred MB (351 MB), for what a wheel's size costs once it is cached
LARGE_WHEEL = ("nvidia-nccl-cu12", "2.32.3")
ANSIBLE = "Ansible, for comparison: ~1 s per task, > 4 s for a four-task play on one host."


# ---------------------------------------------------------------------------------------------------------
# Instants seen from this side: progress events and remote batches, stamped with time.time()


@dataclass
class StampedProgress:
    """A Progress that keeps every event with the wall-clock time it arrived."""

    events: list[tuple[float, str, object]] = field(default_factory=list)

    def phase_started(self, name: str) -> None:
        self.events.append((time.time(), "phase", name))

    def step_done(self, name: str, seconds: float) -> None:
        self.events.append((time.time(), "done", name))

    def retrying(self, retry_state: RetryCallState) -> None:
        pass

    def log_line(self, text: str) -> None:
        pass

    def note(self, text: str) -> None:
        self.events.append((time.time(), "note", text))

    def transfer(self, text: str) -> None:
        self.events.append((time.time(), "transfer", text))

    def first(self, kind: str, name: str, after: float = 0.0) -> float:
        return next(at for at, event_kind, value in self.events if event_kind == kind and value == name and at >= after)


@dataclass(frozen=True)
class Batch:
    started: float
    ended: float
    names: tuple[str, ...]


@dataclass
class StampedRemote:
    """The one FabricRemote of a command, with the start and end of every batch it ran."""

    inner: FabricRemote
    batches: list[Batch] = field(default_factory=list)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        started = time.time()
        try:
            return self.inner.run(batch, on_output)
        finally:
            self.batches.append(Batch(started, time.time(), tuple(step.name for step in batch)))

    def close(self) -> None:
        self.inner.close()

    def restarts(self) -> list[Batch]:
        return [batch for batch in self.batches if "systemd: restart" in batch.names]

    def after_ladder(self, restart: Batch) -> Batch:
        """The first batch after `restart` that is not a readiness probe: it starts once the ladder has raised."""
        return next(batch for batch in self.batches if batch.started > restart.ended
                    and not all(name.startswith("readiness probe") for name in batch.names))


# ---------------------------------------------------------------------------------------------------------
# Instants seen on the host: the unit's journal


@dataclass(frozen=True)
class JournalEntry:
    at: float
    message: str
    job_type: str | None


class Journal:
    """The unit's journal on the guest, read as root over a separate ssh (never inside a measured command)."""

    def __init__(self, guest: manage.Guest) -> None:
        self.guest = guest

    def read(self, *options: str) -> list[JournalEntry]:
        text = manage.run_on(self.guest, shlex.join(["journalctl", "-u", UNIT, "-o", "json", "--no-pager", "-q",
                                                     *options]))
        entries = []
        for line in text.splitlines():
            record = json.loads(line)
            message = record.get("MESSAGE")
            entries.append(JournalEntry(int(record["__REALTIME_TIMESTAMP"]) / 1e6,
                                        message if isinstance(message, str) else "", record.get("JOB_TYPE")))
        return entries

    def cursor(self) -> str | None:
        text = manage.run_on(self.guest, shlex.join(["journalctl", "-u", UNIT, "-o", "json", "-n", "1", "-q"]))
        return json.loads(text)["__CURSOR"] if text.strip() else None

    def since(self, cursor: str | None) -> list[JournalEntry]:
        return self.read(f"--after-cursor={cursor}") if cursor else self.read()


def first_entry(entries: Sequence[JournalEntry], after: float, matches: Callable[[JournalEntry], bool]) -> float:
    return next(entry.at for entry in entries if entry.at >= after and matches(entry))


def restart_instant(entries: Sequence[JournalEntry], after: float) -> float:
    """systemd's first job message for the unit (Stopping/Stopped/Started) once the restart was issued."""
    return first_entry(entries, after, lambda entry: entry.job_type is not None)


def ready_instant(entries: Sequence[JournalEntry], after: float) -> float:
    return first_entry(entries, after, lambda entry: entry.message.endswith(READY_LINE))


def exit_instant(entries: Sequence[JournalEntry], after: float) -> float:
    return first_entry(entries, after, lambda entry: EXIT_LINE in entry.message)


# ---------------------------------------------------------------------------------------------------------
# The rig: a tmp project with bench profiles, the guest's inventory, one connection per command


@dataclass
class Rig:
    guest: manage.Guest
    project: Project
    inventory: str
    journal: Journal

    @contextmanager
    def command(self, profile: str) -> Iterator[tuple[StampedRemote, StampedProgress,
                                                       Callable[[], engine.Outcome]]]:
        """What one `invoke deploy --profile P` holds: one SSH connection, a progress, the deploy to call."""
        loaded, target = load_for_host(self.project, profile, self.inventory, None)
        remote = StampedRemote(FabricRemote(target.ssh))
        progress = StampedProgress()
        try:
            yield remote, progress, lambda: engine.deploy(loaded, target, remote, progress, engine.Options())
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
    return Rig(guest, Project(root), str(inventory), Journal(guest))


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


def whole_process_no_op(rig: Rig, pycache: Path) -> ProcessRun:
    """`invoke deploy --profile P --yes` as a user runs it, a no-op: the process's wall time, Python's start and
    every import included. Bytecode is cached (in `pycache`) as an installed tool's is; the first run writes it."""
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), "deploy", "--profile", PROFILE, "--yes",
            "--inventory", rig.inventory]
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**environ, "PYTHONPYCACHEPREFIX": str(pycache)})
    seconds, after = time.time() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0 and "no changes" in done.stdout, done.stdout + done.stderr
    return ProcessRun(seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


@dataclass(frozen=True)
class ProcessParts:
    """One run of bench/noop_parts.py: each part's (wall, CPU) seconds, in the order the deploy task runs them."""

    parts: dict[str, tuple[float, float]]
    round_trips: int


def no_op_parts(rig: Rig, pycache: Path) -> ProcessParts:
    """The whole process's parts, from a fresh process that does what the deploy task does (bench/noop_parts.py)."""
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
    assert outcome.action == "deployed", outcome.action
    entries = rig.journal.since(cursor)
    [restart] = remote.restarts()
    restarted = restart_instant(entries, restart.started)
    ready = ready_instant(entries, restarted)
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
                      daemon_reloads=sum(batch.names.count("systemd: daemon-reload") for batch in remote.batches))


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
        result = venvs.ensure_venv(remote, VENV_LAYOUT, spec)
        return VenvRun(time.time() - started, result.bytes_sent, result.wheels_sent, remote.round_trips - before)


# ---------------------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    runs: int
    target: str
    passed: bool | None  # None: a figure shown for context, without a target

    def row(self) -> tuple[str, str, str, str, str]:
        verdict = "" if self.passed is None else ("PASS" if self.passed else "MISS")
        return self.name, self.value, str(self.runs), self.target, verdict


def seconds_figure(name: str, samples: Sequence[float], limit: float | None, target: str = "") -> Figure:
    median = statistics.median(samples)
    spread = f" ({min(samples):.2f}-{max(samples):.2f})" if len(samples) > 1 else ""
    return Figure(name, f"{median:.2f} s{spread}", len(samples), target or (f"<= {limit:g} s" if limit else ""),
                  None if limit is None else median <= limit)


def table(figures: Sequence[Figure]) -> str:
    rows = [("figure", "median (min-max)", "runs", "target", ""), *(figure.row() for figure in figures)]
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def part_figure(name: str, walls: Sequence[float], cpus: Sequence[float]) -> Figure:
    return Figure(name, f"{statistics.median(walls):.2f} s, CPU {statistics.median(cpus):.2f} s", len(walls), "",
                  None)


def process_figures(processes: Sequence[ProcessRun], parts: Sequence[ProcessParts]) -> list[Figure]:
    """The whole-process no-op and where its time goes: each part of bench/noop_parts.py, then what `invoke` adds
    (its command line parse, the output): the whole minus the parts, wall and CPU."""
    names = list(parts[0].parts)
    wall = {name: [run.parts[name][0] for run in parts] for name in names}
    cpu = {name: [run.parts[name][1] for run in parts] for name in names}
    round_trips = statistics.median(run.round_trips for run in parts)
    trips = f" ({round_trips:g} round trip{'' if round_trips == 1 else 's'})"
    rows = [part_figure(f"  - {name}" + (trips if "round trips" in name else ""), wall[name], cpu[name])
            for name in names]
    parts_wall = sum(statistics.median(values) for values in wall.values())
    parts_cpu = sum(statistics.median(values) for values in cpu.values())
    return [
        seconds_figure(f"no-op `invoke deploy --profile {PROFILE} --yes`, whole process",
                       [run.seconds for run in processes], 0.8),
        seconds_figure("  the process's own CPU time (user + sys)", [run.cpu_s for run in processes], None),
        *rows,
        part_figure("  - the rest: invoke's command line parse, the output (whole - parts)",
                    [run.seconds - parts_wall for run in processes], [run.cpu_s - parts_cpu for run in processes]),
    ]


def long_step_figure(runs: Sequence[LongStepRun]) -> Figure:
    cpu = statistics.median(run.cpu_s for run in runs)
    share = statistics.median(run.cpu_s / run.seconds for run in runs)
    return Figure(f"client's CPU while one {LONG_STEP_S:g} s remote step runs (a build, a download)",
                  f"{cpu:.3f} s ({share:.1%} of the step)", len(runs), "", None)


def deploy_figures(no_ops: Sequence[NoOpRun], processes: Sequence[ProcessRun], parts: Sequence[ProcessParts],
                   changed: Sequence[ChangedRun], crashes: Sequence[CrashRun],
                   long_steps: Sequence[LongStepRun]) -> list[Figure]:
    round_trips = statistics.median(run.round_trips for run in no_ops)
    plural = "" if round_trips == 1 else "s"
    phases = {name: statistics.median(run.phases.get(name, 0.0) for run in changed) for name in changed[0].phases}
    return [
        seconds_figure(f"no-op redeploy (one SSH connection, {round_trips:g} round trip{plural})",
                       [run.seconds for run in no_ops], 1.0),
        *process_figures(processes, parts),
        seconds_figure("changed deploy, total", [run.total_s for run in changed], None),
        seconds_figure("  server's own start (restart -> fired up)", [run.server_start_s for run in changed], None),
        # the grace window is a policy's wait (GRACE_S), not the tool's overhead: targets judge the time around it
        seconds_figure("  tool's own time (total - server start), the grace window included",
                       [run.tool_s for run in changed], None),
        seconds_figure("  tool's own time without the grace window",
                       [run.tool_s - run.grace_s for run in changed], 1.0),
        seconds_figure("  - before the restart (connect, facts, stage, switch)",
                       [run.before_restart_s for run in changed], None),
        seconds_figure("  - restart sent -> systemd's job starts (enable; daemon-reload only for another unit text)",
                       [run.restart_to_job_s for run in changed], None),
        seconds_figure("  - readiness noticed (fired up -> Ready verdict)", [run.ready_noticed_s for run in changed],
                       0.3),
        seconds_figure("    of it the server answering the one real generation", [run.generation_s for run in changed],
                       None),
        seconds_figure("  - the ladder's grace window after Ready", [run.grace_s for run in changed], None),
        seconds_figure("  - ladder returned -> deploy returned (history, prune)",
                       [run.ladder_to_return_s for run in changed], None),
        Figure("  phases (Outcome.timings)", " ".join(f"{name} {value:.2f}" for name, value in phases.items()),
               len(changed), f"{statistics.median(run.round_trips for run in changed):g} round trips", None),
        Figure("  systemctl daemon-reload sent (env changed, same unit settings)",
               str(max(run.daemon_reloads for run in changed)), len(changed), "0",
               all(run.daemon_reloads == 0 for run in changed)),
        seconds_figure("crash noticed (process exit -> ladder raised)", [run.noticed_s for run in crashes], 1.0),
        seconds_figure("rollback, total (ladder raised -> rolled back)", [run.rollback_s for run in crashes], None),
        seconds_figure("  previous release's start (restart -> fired up)", [run.previous_start_s for run in crashes],
                       None),
        seconds_figure("  rollback minus the previous release's start", [run.rollback_s - run.previous_start_s
                                                                         for run in crashes], None),
        seconds_figure("  - of it the restored release's grace window after Ready", [run.grace_s for run in crashes],
                       None),
        seconds_figure("  rollback minus the previous release's start and the grace window",
                       [run.rollback_s - run.previous_start_s - run.grace_s for run in crashes], 1.0,
                       "start + grace + <= 1 s"),
        long_step_figure(long_steps),
    ]


@dataclass(frozen=True)
class VenvRuns:
    unchanged: Sequence[VenvRun]   # the built lock again
    changed: Sequence[VenvRun]     # one flashinfer-python wheel swapped, each a new venv
    changed_wheels: Sequence[Path]
    fresh: Sequence[VenvRun]       # the reference lock's venv removed and built again: every wheel in uv's cache
    large_first: VenvRun           # the reference lock plus the large wheel: sent, unpacked into the cache once
    large_fresh: Sequence[VenvRun]  # that venv removed and built again
    large_bytes: int


def venv_figures(runs: VenvRuns) -> list[Figure]:
    only_that_wheel = all(run.wheels_sent == (wheel.name,) and run.bytes_sent == wheel.stat().st_size
                          for run, wheel in zip(runs.changed, runs.changed_wheels, strict=True))
    sent = statistics.median(run.bytes_sent for run in runs.changed)
    round_trips = statistics.median(run.round_trips for run in runs.unchanged)
    fresh, large = statistics.median(r.seconds for r in runs.fresh), statistics.median(r.seconds for r in
                                                                                        runs.large_fresh)
    size = f"{runs.large_bytes / 1e6:.0f} MB"
    return [
        Figure("venv, unchanged lock: wheels / bytes sent / round trips (inside the deploy's lock)",
               f"{max(len(run.wheels_sent) for run in runs.unchanged)} / "
               f"{max(run.bytes_sent for run in runs.unchanged)} B / {round_trips:g}", len(runs.unchanged),
               "0 wheels, 1 round trip", all(not run.wheels_sent for run in runs.unchanged) and round_trips == 1),
        seconds_figure("venv, unchanged lock: ensure_venv", [run.seconds for run in runs.unchanged], 1.0),
        Figure("venv, one package changed: wheels / bytes sent",
               f"{max(len(run.wheels_sent) for run in runs.changed)} / {sent / 1e6:.1f} MB", len(runs.changed),
               "only that wheel", only_that_wheel),
        seconds_figure("venv, one package changed: ensure_venv, end to end (uv)", [run.seconds for run in runs.changed],
                       3.0),
        seconds_figure("venv, fresh venv of the reference wheelhouse, warm host cache (uv)",
                       [run.seconds for run in runs.fresh], 5.0),
        seconds_figure(f"venv, reference + {LARGE_WHEEL[0]} ({size}): first build (send, unpack once)",
                       [runs.large_first.seconds], None),
        seconds_figure(f"venv, reference + {LARGE_WHEEL[0]} ({size}): fresh venv, warm cache",
                       [run.seconds for run in runs.large_fresh], None),
        Figure(f"  the {size} wheel's share of a fresh venv once cached", f"{large - fresh:+.2f} s", len(runs.fresh),
               "does not grow with size", None),
    ]


# ---------------------------------------------------------------------------------------------------------
# The whole run


MODEL_REPO = "bench/weights"
MODEL_PROFILE = "bench-model"
MODEL_SHARD_VALUES = (25_000_000, 25_000_000)  # two float32 shards of 100 MB each
MODEL_CACHE = "/root/.cache/huggingface"


def measure_models(rig: Rig, runs: int) -> list[Figure]:
    """Staging a 200 MB model from the guest's hub into its HF cache (the model phase of a deploy), against rsync of
    the same files over SSH on the same veth; then an unchanged model: the no-op redeploy's round trips."""
    files = hub.stand_in_files(MODEL_REPO, shard_values=MODEL_SHARD_VALUES)
    hub.commit(rig.guest.hub, MODEL_REPO, files, "bench weights")
    total = sum(len(data) for name, data in files.items() if not name.endswith(".md"))
    (rig.project.root / "inventory" / "profiles" / f"{MODEL_PROFILE}.yaml").write_text(
        f"extends: {PROFILE}\nmodel:\n  path: {MODEL_REPO}\n")
    forget = (f"rm -rf {MODEL_CACHE}/hub/models--bench--weights {MODEL_CACHE}/sglang-deploy/models--bench--weights "
              "/tmp/bench-raw")
    source = rig.guest.hub.repo_dir(MODEL_REPO)
    ssh = shlex.join(rig.guest.ssh_argv("root")[:-1])
    staged, copied, round_trips = [], [], []
    for _ in range(runs):
        rig.root(forget)
        with rig.command(MODEL_PROFILE) as (remote, _progress, deploy):
            outcome = deploy()
        staged.append(total / outcome.timings["model"] / 1e6)
        started = time.time()
        subprocess.run(["rsync", "-a", "-e", ssh, *[str(source / name) for name in files if not name.endswith(".md")],
                        f"root@{rig.guest.guest_ip}:/tmp/bench-raw/"], check=True, capture_output=True)
        copied.append(total / (time.time() - started) / 1e6)
        with rig.command(MODEL_PROFILE) as (remote, _progress, deploy):
            again = deploy()
        assert again.action == "unchanged" and "model" not in again.timings, again.action
        round_trips.append(remote.inner.round_trips)
        say(f"model: staged {staged[-1]:.0f} MB/s, rsync {copied[-1]:.0f} MB/s, no-op {round_trips[-1]} round trip")
    ratio = statistics.median(staged) / statistics.median(copied)
    return [
        # the model's plan rides in the facts' round trip (tests/sandbox/test_models_sandbox.py asserts it)
        Figure("model unchanged: no-op redeploy round trips (lock, facts + model plan, unlock) / bytes staged",
               f"{statistics.median(round_trips):g} / 0 B", runs, "0 B", True),
        Figure(f"model staging, {total / 1e6:.0f} MB hub -> HF cache (snapshot_download)",
               f"{statistics.median(staged):.0f} MB/s ({min(staged):.0f}-{max(staged):.0f})", runs, "", None),
        Figure("  raw copy of the same files (rsync over ssh, same veth)",
               f"{statistics.median(copied):.0f} MB/s ({min(copied):.0f}-{max(copied):.0f})", runs, "", None),
        Figure("  staging / raw copy", f"{ratio:.2f}x", runs, "", None),
    ]


def say(text: str) -> None:
    print(text, flush=True)


def measure_deploys(rig: Rig, runs: int) -> list[Figure]:
    rig.root(f"mkdir -p /etc/sglang-sim && echo oom > {FAULT_FILE}")
    with rig.command(PROFILE) as (_remote, _progress, deploy):
        say(f"first deploy of {PROFILE}: {deploy().action}")
    no_ops = [no_op_redeploy(rig) for _ in range(runs)]
    say(f"no-op redeploys: {', '.join(f'{run.seconds:.2f} s' for run in no_ops)}")
    pycache = Path(tempfile.mkdtemp(prefix="sglang-bench-pycache-"))
    whole_process_no_op(rig, pycache)  # writes the bytecode cache
    processes = [whole_process_no_op(rig, pycache) for _ in range(runs)]
    parts = [no_op_parts(rig, pycache) for _ in range(runs)]
    shutil.rmtree(pycache)
    say(f"no-op deploys, whole process: {', '.join(f'{run.seconds:.2f} s' for run in processes)}")
    changed = []
    for run in range(runs):
        changed.append(changed_deploy(rig, f"bench-{run}"))
        say(f"changed deploy {run + 1}/{runs}: total {changed[-1].total_s:.2f} s, "
            f"server start {changed[-1].server_start_s:.2f} s")
    crashes = []
    for run in range(runs):
        crashes.append(crash_and_roll_back(rig))
        say(f"crash {run + 1}/{runs}: noticed {crashes[-1].noticed_s:.2f} s, rollback {crashes[-1].rollback_s:.2f} s")
    long_steps = [long_step_cpu(rig) for _ in range(runs)]
    say(f"long steps: client CPU {', '.join(f'{run.cpu_s:.3f} s' for run in long_steps)}")
    return deploy_figures(no_ops, processes, parts, changed, crashes, long_steps)


def measure_venvs(rig: Rig, house: wheelhouse.Wheelhouse, runs: int, changed_runs: int, work: Path) -> list[Figure]:
    others = [wheelhouse.download("flashinfer-python", version) for version in OTHER_FLASHINFER[:changed_runs]]
    large = wheelhouse.download(*LARGE_WHEEL)
    directory = house.link_into(work / "wheelhouse", *others, large)
    _, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
    rig.root(f"rm -rf {shlex.quote(str(VENV_LAYOUT.base))}")  # a host that has never seen these wheels

    def spec(name: str, wheels: Sequence[Path]) -> venvs.VenvSpec:
        return venvs.VenvSpec(lock=wheelhouse.write_lock(work / name, wheels), wheelhouse=directory)

    def rebuilt(built: venvs.VenvSpec) -> VenvRun:
        """The published venv of `built` removed (its wheels and uv's cache stay), then built again."""
        venv = venvs.venv_path(VENV_LAYOUT, venvs.venv_hash(venvs.load_lock(built.lock), facts.python))
        rig.root(f"rm -rf {shlex.quote(str(venv))}")
        return ensure_venv_timed(target.ssh, built)

    base = spec("base.lock", house.wheels)
    first = ensure_venv_timed(target.ssh, base)
    say(f"venv built: {len(first.wheels_sent)} wheels, {first.bytes_sent / 1e6:.1f} MB in {first.seconds:.1f} s")
    with FabricRemote(target.ssh) as remote:
        facts = venvs.read_facts(remote, VENV_LAYOUT, base.python)
    unchanged = [ensure_venv_timed(target.ssh, base) for _ in range(runs)]
    changed = []
    for number, other in enumerate(others):
        wheels = [other if wheel == house.flashinfer else wheel for wheel in house.wheels]
        changed.append(ensure_venv_timed(target.ssh, spec(f"changed-{number}.lock", wheels)))
        say(f"venv, {other.name}: {changed[-1].wheels_sent}, {changed[-1].seconds:.1f} s")
    fresh = [rebuilt(base) for _ in range(runs)]
    say(f"venv, fresh from a warm cache: {', '.join(f'{run.seconds:.2f} s' for run in fresh)}")
    with_large = spec("large.lock", [*house.wheels, large])
    large_first = ensure_venv_timed(target.ssh, with_large)
    large_fresh = [rebuilt(with_large) for _ in range(runs)]
    say(f"venv with {large.name}: first {large_first.seconds:.1f} s, then "
        f"{', '.join(f'{run.seconds:.2f} s' for run in large_fresh)}")
    return venv_figures(VenvRuns(unchanged, changed, [directory / other.name for other in others], fresh,
                                 large_first, large_fresh, large.stat().st_size))


@contextmanager
def guest_for_bench(existing: str | None) -> Iterator[manage.Guest]:
    """A guest of this run's own (name bn<pid>), always stopped at the end; or a running one, left running."""
    if existing:
        yield manage.guest(existing)
        return
    name = f"bn{os.getpid()}"[:12]
    say(f"sandbox guest {name}: starting")
    try:
        yield manage.up(name, record=False)
    finally:
        manage.down(name, record=False)
        say(f"sandbox guest {name}: stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per deploy figure and per unchanged-lock figure")
    parser.add_argument("--venv-runs", type=int, default=3, choices=range(1, len(OTHER_FLASHINFER) + 1),
                        help="one-changed-package builds (each a new venv in the guest)")
    parser.add_argument("--guest", help="measure on this running guest (neither started nor stopped here)")
    parser.add_argument("--only", choices=("deploys", "venvs", "models"), help="measure this group of figures only")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("make bench needs root (the sandbox guest is a systemd-nspawn machine)")
        return 2
    started = time.time()
    with guest_for_bench(options.guest) as guest, tempfile.TemporaryDirectory(prefix="sglang-bench-") as work:
        house = wheelhouse.prepare()
        if not manage.guest_venv_is(guest, house):
            manage.build_guest_venv(guest, house)
        rig = make_rig(guest, Path(work), options.runs)
        wanted = {options.only} if options.only else {"deploys", "venvs", "models"}
        figures = measure_deploys(rig, options.runs) if "deploys" in wanted else []
        if "venvs" in wanted:
            figures += measure_venvs(rig, house, options.runs, options.venv_runs, Path(work))
        if "models" in wanted:
            figures += measure_models(rig, options.runs)
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    say(f"\nmake bench on the sandbox guest ({time.time() - started:.0f} s in all; load average now {load})\n")
    say(table(figures))
    say(f"\n{ANSIBLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
