"""A peer measured in the same run (issue 30): pyinfra (PyPI, in .venv-bench: bench/requirements.txt) doing the job
`invoke deploy` does on the same guest, with the unit, env file and launcher text deploy_lib renders for the same
profile, run by bench/peer_deploy.py. bench/run.py interleaves its runs with ours (ours, theirs, ours, ...), so a
change of the shared machine's load hits both; the figures it judges are ratios. Also the floor of a no-op on the
same guest: one interpreter start (`python3 -c pass`) plus one SSH handshake and round trip (`ssh host true`).

The peer's server is its own unit (`sglang-peer`, port 8001, its files under /etc/systemd/system and
/opt/sglang-peer), so it neither sees nor disturbs ours.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.figures import Figure
from bench.measure import PROFILE, REPO, ChangedRun, ProcessRun, Rig
from bench.timeline import Journal, ready_instant, restart_instant
from deploy_lib.deploy.project import load_for_host
from deploy_lib.models import ReleaseModel
from deploy_lib.release.model import Release, build_release
from deploy_lib.release.server_args import launch_environment
from deploy_lib.store import ENV_FILE, LAUNCHER_FILE

SERVICE = "sglang-peer"
PORT = 8001
DEPLOY_FILE = REPO / "bench" / "peer_deploy.py"
PYINFRA = REPO / ".venv-bench" / "bin" / "pyinfra"  # its own environment (Makefile: why)
POLL_S = 0.1  # the wait's poll interval, as a pyinfra user writes `until curl ...; do sleep 0.1; done`
# What a pyinfra user polls, both shown: SGLang's `/health`, which the simulator answers without generating (SGLang's
# with generation off), and `/health_generate`, a 1-token generation looked for once a second (SGLang's `/health` by
# default). Each its own operation, in this order, so each success line is the instant that endpoint was noticed.
POLLED = ("/health", "/health_generate")


def wait_op(endpoint: str) -> str:
    return f"wait for {endpoint}"


def wait_command(endpoint: str) -> str:
    return (f"timeout 600 sh -c 'until curl -sf -o /dev/null http://127.0.0.1:{PORT}{endpoint}; "
            f"do sleep {POLL_S:g}; done'")


def profile_name(run: int | str) -> str:
    return f"bench-peer-{run}"


def write_profiles(profiles: Path, runs: int) -> None:
    """The peer's profiles: ours (PROFILE) under another service name and port; each run its own env value. Its unit
    allows more starts in systemd's interval (StartLimitBurst): ours resets the count in its restart batch, pyinfra's
    systemd.service has no such step (another operation would cost it a round trip ours does not pay)."""
    for run in ["first", *range(runs)]:
        (profiles / f"{profile_name(run)}.yaml").write_text(
            f"extends: {PROFILE}\nservice:\n  name: {SERVICE}\n  start_limit_burst: 50\nserver:\n  port: {PORT}\n"
            f"env:\n  BENCH_RUN: '{run}'\n")


@dataclass(frozen=True)
class PeerNoOp:
    seconds: float
    cpu_s: float
    guest_cpu_s: float  # the guest's CPU for its SSH connections and all they ran (bench.timeline.GuestSshCpu)


@dataclass(frozen=True)
class PeerChanged:
    total_s: float
    server_start_s: float  # restart instant -> "fired up" (the journal's clock), as ours
    # per endpoint polled: "fired up" -> pyinfra printed its wait's success (stamped here, unbuffered output)
    ready_noticed_s: dict[str, float]

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.server_start_s


class Peer:
    """pyinfra on the rig's guest: its inventory and the files it puts, written under `work`."""

    def __init__(self, rig: Rig, ours: Release, work: Path) -> None:
        if not PYINFRA.exists():
            raise SystemExit(f"bench: {PYINFRA} not found: `make bench` installs it (make bench-venv)")
        self.rig, self.ours, self.work = rig, ours, work
        self.journal = Journal(rig.guest, unit=f"{SERVICE}.service")
        work.mkdir(parents=True, exist_ok=True)
        self.inventory = work / "inventory.py"

    def write(self, profile: str) -> None:
        """The unit, env file and launcher deploy_lib renders for `profile` (ours' venv, version, staged weights and
        host-side environment), as local files, and the inventory that names them."""
        loaded, target = load_for_host(self.rig.project, profile, self.rig.inventory, None)
        ours_loaded, _ = load_for_host(self.rig.project, PROFILE, self.rig.inventory, None)
        host_side = {name: value for name, value in self.ours.environment.items()
                     if name not in launch_environment(ours_loaded.profile)}
        layout = target.layout(SERVICE)
        release = build_release(loaded, layout, self.ours.sglang_version, {}, venv=self.ours.venv,
                                extra_environment=host_side, model=ReleaseModel(**self.ours.model))
        assert release.launcher_text is not None
        files = [(self.work / "unit", f"/etc/systemd/system/{SERVICE}.service", "644", release.unit_text),
                 (self.work / "env", str(layout.current / ENV_FILE), "600", release.env_text),
                 (self.work / "launch", str(layout.current / LAUNCHER_FILE), "755", release.launcher_text)]
        for local, _dest, _mode, text in files:
            local.write_text(text)
        guest = self.rig.guest
        data = {"ssh_user": guest.ssh_argv()[-1].split("@")[0], "ssh_key": str(guest.key),
                "ssh_known_hosts_file": str(guest.known_hosts), "ssh_strict_host_key_checking": "yes",
                "peer": {"files": [(str(local), dest, mode) for local, dest, mode, _ in files], "service": SERVICE,
                         "waits": [(wait_op(endpoint), wait_command(endpoint)) for endpoint in POLLED]}}
        self.inventory.write_text(f"hosts = [({guest.guest_ip!r}, {data!r})]\n")

    def _run(self) -> tuple[float, float, list[tuple[float, str]]]:
        """One `pyinfra -y INVENTORY bench/peer_deploy.py`: its wall and CPU seconds, each output line stamped."""
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        process = subprocess.Popen([str(PYINFRA), "-y", str(self.inventory), str(DEPLOY_FILE)], cwd=self.work,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None
        lines = [(time.time(), line) for line in process.stdout]
        code = process.wait(timeout=300)
        seconds, after = time.time() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
        output = "".join(line for _, line in lines)
        assert code == 0, output
        return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, lines

    def first(self) -> None:
        """The peer's first deploy (not measured): its unit installed and started."""
        self.write(profile_name("first"))
        self._run()

    def no_op(self) -> PeerNoOp:
        cursor = self.journal.cursor()
        guest_before = self.rig.ssh_cpu.seconds()
        seconds, cpu, _lines = self._run()
        guest_cpu = self.rig.ssh_cpu.seconds() - guest_before
        restarted = [entry for entry in self.journal.since(cursor) if entry.job_type is not None]
        assert not restarted, f"pyinfra's no-op restarted {SERVICE}: {restarted}"
        return PeerNoOp(seconds, cpu, guest_cpu)

    def changed(self, run: int) -> PeerChanged:
        self.write(profile_name(run))
        cursor = self.journal.cursor()
        started = time.time()
        seconds, _cpu, lines = self._run()
        entries = self.journal.since(cursor)
        restarted = restart_instant(entries, started)
        ready = ready_instant(entries, restarted)
        return PeerChanged(seconds, ready - restarted,
                           {endpoint: noticed_at(lines, wait_op(endpoint)) - ready for endpoint in POLLED})


def noticed_at(lines: Sequence[tuple[float, str]], operation: str) -> float:
    """When pyinfra printed the success that follows the start of `operation` (its output lines, stamped)."""
    started = next(index for index, (_, line) in enumerate(lines) if "Starting operation" in line
                   and operation in line)
    return next(at for at, line in lines[started + 1:] if "Success" in line)


@dataclass(frozen=True)
class FloorRun:
    interpreter_s: float  # `python3 -c pass`
    ssh_s: float          # `ssh host true`: handshake, auth, one round trip

    @property
    def seconds(self) -> float:
        return self.interpreter_s + self.ssh_s


def floor(rig: Rig) -> FloorRun:
    started = time.time()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    middle = time.time()
    subprocess.run([*rig.guest.ssh_argv(), "true"], check=True, stdin=subprocess.DEVNULL)
    return FloorRun(middle - started, time.time() - middle)


def _median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def ratio_figure(name: str, ours: Sequence[float], theirs: Sequence[float], least: float | None) -> Figure:
    """ours | pyinfra | how many times faster ours is; PASS when at least `least` (None: context)."""
    ratio = _median(theirs) / _median(ours) if _median(ours) > 0 else float("inf")
    return Figure(name, f"{_median(ours):.2f} s | pyinfra {_median(theirs):.2f} s | {ratio:.2f}x", len(ours),
                  f">= {least:g}x faster" if least else "", None if least is None else ratio >= least)


def ahead_figure(name: str, ours: Sequence[float], theirs: Sequence[float]) -> Figure:
    """ours | pyinfra | how many times faster ours is; PASS when ours is ahead (the lower median of the same run)."""
    figure = ratio_figure(name, ours, theirs, None)
    return Figure(figure.name, figure.value, figure.runs, "ahead of pyinfra", _median(ours) < _median(theirs))


def peer_figures(processes: Sequence[ProcessRun], peer_no_ops: Sequence[PeerNoOp], floors: Sequence[FloorRun],
                 changed: Sequence[ChangedRun], peer_changed: Sequence[PeerChanged]) -> list[Figure]:
    noticed = _median([r.ready_noticed_s for r in changed])
    no_op = _median([run.seconds for run in processes])
    return [
        ahead_figure("peer: no-op whole process (ours | pyinfra | ratio)", [run.seconds for run in processes],
                     [run.seconds for run in peer_no_ops]),
        ratio_figure("  the process's CPU (user + sys)", [run.cpu_s for run in processes],
                     [run.cpu_s for run in peer_no_ops], None),
        ratio_figure("  the guest's CPU (its sshd and all the command ran there)",
                     [run.guest_cpu_s for run in processes], [run.guest_cpu_s for run in peer_no_ops], None),
        Figure("  floor on the same guest: `python3 -c pass` + `ssh host true`",
               f"{_median([f.seconds for f in floors]):.2f} s ({_median([f.interpreter_s for f in floors]):.2f} + "
               f"{_median([f.ssh_s for f in floors]):.2f}); the no-op {no_op:.2f} s is "
               f"{no_op / _median([f.seconds for f in floors]):.2f}x it", len(floors), "", None),
        ratio_figure("peer: changed deploy's own time, no grace (ours | pyinfra's overhead | ratio)",
                     [run.tool_s - run.grace_s for run in changed], [run.overhead_s for run in peer_changed], 2.0),
        ratio_figure("  server's own start (restart -> fired up), context", [run.server_start_s for run in changed],
                     [run.server_start_s for run in peer_changed], None),
        *(readiness_figure(endpoint, noticed, [run.ready_noticed_s[endpoint] for run in peer_changed])
          for endpoint in POLLED),
    ]


def readiness_figure(endpoint: str, ours: float, theirs: Sequence[float]) -> Figure:
    """Readiness noticed after "fired up": ours (up to a generation of the ladder's) against pyinfra polling
    `endpoint`; judged: ours no later."""
    return Figure(f"peer: readiness noticed after fired up (ours | pyinfra polling {endpoint})",
                  f"{ours:.2f} s | pyinfra {_median(theirs):.2f} s (a poll every {POLL_S:g} s)", len(theirs),
                  "<= pyinfra's", ours <= _median(theirs))
