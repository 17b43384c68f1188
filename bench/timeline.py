"""What bench/run.py reads its instants from: progress events and remote batches stamped with time.time() on
this side, and the unit's journal on the guest (whose clock is this machine's: the guest is a container here)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tenacity import RetryCallState

from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
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

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        started = time.time()
        try:
            return self.inner.push_directory(local_dir, dest, link_dest, on_output)
        finally:
            self.batches.append(Batch(started, time.time(), (f"push {local_dir} -> {dest}",)))

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
        text = manage.run_on(self.guest, shlex.join(["journalctl", "-u", self.unit, "-o", "json", "--no-pager", "-q",
                                                     *options]))
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


def first_entry(entries: Sequence[JournalEntry], after: float, matches: Callable[[JournalEntry], bool]) -> float:
    return next(entry.at for entry in entries if entry.at >= after and matches(entry))


def restart_instant(entries: Sequence[JournalEntry], after: float) -> float:
    """systemd's first job message for the unit (Stopping/Stopped/Started) once the restart was issued."""
    return first_entry(entries, after, lambda entry: entry.job_type is not None)


def ready_instant(entries: Sequence[JournalEntry], after: float) -> float:
    return first_entry(entries, after, lambda entry: entry.message.endswith(READY_LINE))


def exit_instant(entries: Sequence[JournalEntry], after: float) -> float:
    return first_entry(entries, after, lambda entry: EXIT_LINE in entry.message)



def say(text: str) -> None:
    print(text, flush=True)
