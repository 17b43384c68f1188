"""What bench/run.py reads its instants from: progress events and remote batches stamped with time.time() on
this side, and the unit's journal on the guest (whose clock is this machine's: the guest is a container here)."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tenacity import RetryCallState

from deploy_lib.remote import FabricRemote, Forwarded, OutputLine, Put, Step, StepResult
from sandbox import manage

UNIT = "sglang.service"
READY_LINE = "The server is fired up and ready to roll!"
EXIT_LINE = "Main process exited"


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
    thread_cpu: float = 0.0  # the sending thread's CPU (time.thread_time) when it was sent


@dataclass
class StampedRemote:
    """The one FabricRemote of a command, with the start and end of every batch it ran."""

    inner: FabricRemote
    batches: list[Batch] = field(default_factory=list)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        started, cpu = time.time(), time.thread_time()
        try:
            return self.inner.run(batch, on_output)
        finally:
            self.batches.append(Batch(started, time.time(), tuple(step.name for step in batch), cpu))

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        started = time.time()
        try:
            return self.inner.push_directory(local_dir, dest, link_dest, on_output)
        finally:
            self.batches.append(Batch(started, time.time(), (f"push {local_dir} -> {dest}",)))

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        started = time.time()
        try:
            return self.inner.forward(host, port, data, timeout_s)
        finally:
            self.batches.append(Batch(started, time.time(), (f"forward {host}:{port}",)))

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

    def __init__(self, guest: manage.Guest, unit: str = UNIT) -> None:
        self.guest, self.unit = guest, unit

    def read(self, *options: str) -> list[JournalEntry]:
        """The unit's entries once journald has processed every stream (`--sync`): the lines a server printed just
        before are not in the journal until then (systemd/systemd#28650)."""
        text = manage.run_on(self.guest, "journalctl --sync; " + shlex.join(
            ["journalctl", "-u", self.unit, "-o", "json", "--no-pager", "-q", *options]))
        entries = []
        for line in text.splitlines():
            record = json.loads(line)
            message = record.get("MESSAGE")
            entries.append(JournalEntry(int(record["__REALTIME_TIMESTAMP"]) / 1e6,
                                        message if isinstance(message, str) else "", record.get("JOB_TYPE")))
        return entries

    def cursor(self) -> str | None:
        text = manage.run_on(self.guest, shlex.join(["journalctl", "-u", self.unit, "-o", "json", "-n", "1", "-q"]))
        return json.loads(text)["__CURSOR"] if text.strip() else None

    def since(self, cursor: str | None) -> list[JournalEntry]:
        return self.read(f"--after-cursor={cursor}") if cursor else self.read()

    def since_showing(self, cursor: str | None, line: str, wait_s: float = 15.0) -> list[JournalEntry]:
        """The entries since `cursor` once one ends with `line`: on a loaded machine the server can print its ready
        line after the ladder's generation was answered, so the first read may come before it."""
        deadline = time.monotonic() + wait_s
        while True:
            entries = self.since(cursor)
            if any(entry.message.endswith(line) for entry in entries) or time.monotonic() >= deadline:
                return entries
            time.sleep(0.5)


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
# The guest's CPU for what came in over SSH


class GuestSshCpu:
    """The CPU seconds the guest spent on SSH connections: its sshd listener's reaped children (each connection's
    sshd, with the crypto and every process its sessions ran, counted when the connection closed), read from this
    machine's /proc (the guest is a container here). What a command costs the host beyond the client's own CPU; a
    server started by systemd is not in it."""

    def __init__(self, guest: manage.Guest) -> None:
        cgroup = f"/testhost.{guest.name}/payload/system.slice/ssh.service"
        self.pid = next(pid for pid in _pids() if _cmdline(pid).startswith("sshd: /usr/sbin/sshd -D [listener]")
                        and cgroup in _read(f"/proc/{pid}/cgroup"))

    def seconds(self) -> float:
        """The total so far, once every connection opened before has closed (waits up to 5 s for them)."""
        deadline = time.monotonic() + 5
        while _read(f"/proc/{self.pid}/task/{self.pid}/children").strip() and time.monotonic() < deadline:
            time.sleep(0.01)
        fields = _read(f"/proc/{self.pid}/stat").rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace("\0", " ")


def say(text: str) -> None:
    print(text, flush=True)
