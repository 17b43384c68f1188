"""Crashes after the deploy: what systemd's restart policy did to the current release, read from the journal.

systemd writes a structured journal message for each step of a crash (process exit, "Failed with result",
"Scheduled restart job", the start limit); `crash_events_step` reads only those (from PID 1, about our unit),
`parse_crashes` turns them into Crash values, and the server's own lines between a start and its crash are
diagnosed with the same signature table as a failed deploy. The tool records each crash in history the next
time it reads the host (status, deploy, rollback): docs/deploy.md ("After the deploy") says why.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from deploy_lib.facts.diagnose import Diagnosis, journal_argv
from deploy_lib.facts.host import UnitFacts
from deploy_lib.json_lines import json_objects
from deploy_lib.remote import Step
from deploy_lib.store import (
    FAILED,
    RESTARTED,
    HistoryEntry,
    StoreFacts,
    StoreLayout,
    Tags,
    operator_name,
)

# MESSAGE_IDs of systemd's unit messages (systemd, src/systemd/sd-messages.h, v252).
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"
UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
UNIT_FAILURE_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"
UNIT_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"
EVENT_FIELDS = "MESSAGE_ID,UNIT_RESULT,EXIT_CODE,EXIT_STATUS,N_RESTARTS"
MAX_EVENTS = 1000
DIAGNOSIS_LINES = 2000  # the newest lines before a crash: the traceback is at the end
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Crash:
    """One end of the server that systemd counted as a failure."""

    at_us: int                 # the host's clock, microseconds since the epoch ("Failed with result")
    started_us: int            # when the start that crashed began: the diagnosis reads the lines between
    result: str                # systemd's Result: exit-code, signal, core-dump, oom-kill, timeout, watchdog
    exit: str                  # "exit status 1", "killed by SIGKILL"
    restarted: bool            # systemd scheduled a restart after it
    diagnosis: Diagnosis | None = None

    @property
    def when(self) -> datetime:
        return EPOCH + timedelta(microseconds=self.at_us)

    def iso(self) -> str:
        """The history line's `when`: exact to the microsecond, so a crash is never recorded twice."""
        return self.when.isoformat(timespec="microseconds")

    @property
    def cause(self) -> str:
        diagnosis = self.diagnosis
        if diagnosis is None or diagnosis.signature == "unknown":
            return f"{self.exit} (no known failure signature in the log)"
        return f"{self.exit}: {diagnosis.one_line()}"


@dataclass(frozen=True)
class CrashReport:
    """The current release's crashes since its own start (deploy, rollback or a restart by hand)."""

    restarts: int                    # systemd's NRestarts: automatic restarts since that start
    crashes: tuple[Crash, ...]       # oldest first
    gave_up: bool                    # the start limit refused a restart: the unit is left failed
    down: bool                       # the unit is failed after a crash (gave up, or Restart=no)
    pending: bool = False            # systemd waits RestartSec before restarting after the last crash

    @property
    def last(self) -> Crash | None:
        return self.crashes[-1] if self.crashes else None

    def restarts_done(self) -> int:
        """Restarts that ran: every crash but a last one that was not restarted."""
        return sum(1 for crash in self.crashes if crash.restarted) - (1 if self.gave_up else 0)

    @property
    def verdict(self) -> str | None:
        """One line for status; None when nothing crashed."""
        last = self.last
        if last is None:
            return None
        if self.gave_up:
            return f"gave up after {self.restarts_done()} restarts: {last.cause}"
        if self.down:
            return f"not restarted (service.restart: no): {last.cause}"
        if self.pending:
            return f"crash {len(self.crashes)} since the deploy; systemd restarts it after service.restart_sec"
        return f"systemd restarted it after {len(self.crashes)} crash(es)"


def crash_events_step(layout: StoreLayout) -> Step:
    """systemd's own messages about the unit (not the server's lines): starts, exits, results, restarts."""
    return Step(f"read {layout.unit_name} crash events", sudo=True, timeout_s=30, argv=(
        "journalctl", "_PID=1", f"UNIT={layout.unit_name}", "-o", "json", f"--output-fields={EVENT_FIELDS}",
        "--no-pager", "-q", "-n", str(MAX_EVENTS)))


def _exit_text(code: str, status: str) -> str:
    if code in ("killed", "dumped") and status.isdigit():
        try:
            name = signal.Signals(int(status)).name
        except ValueError:
            name = f"signal {status}"
        return f"killed by {name}" + (" (core dumped)" if code == "dumped" else "")
    return f"exit status {status}" if code == "exited" else f"{code} {status}".strip()


def unit_crashed(unit: UnitFacts) -> bool:
    """Whether the unit's state says it crashed since its last start; no journal is read when it does not."""
    return unit.n_restarts > 0 or unit.sub_state == "auto-restart" or \
        (unit.active_state == "failed" and unit.result != "success")


def _events(stdout: str) -> list[dict[str, str]]:
    return [{str(k): str(v) for k, v in entry.items()} for entry in json_objects(stdout)]


def parse_crashes(stdout: str, unit: UnitFacts) -> CrashReport:
    """The crashes since the unit's last start by hand (deploy, rollback), from `crash_events_step` output.

    A crash is a main-process exit followed by "Failed with result" (systemd 252 repeats that message without
    an exit when the start limit refuses a restart). NRestarts counts systemd's own restarts since the last start
    by hand, refused ones included, so the newest crashes it accounts for are this release's."""
    crashes: list[Crash] = []
    started_us, exit_text = 0, ""
    for entry in _events(stdout):
        kind, at_us = entry.get("MESSAGE_ID"), int(entry.get("__REALTIME_TIMESTAMP", "0"))
        if kind in (UNIT_STARTING, UNIT_STARTED):
            started_us = at_us
        elif kind == UNIT_PROCESS_EXIT:
            exit_text = _exit_text(entry.get("EXIT_CODE", ""), entry.get("EXIT_STATUS", ""))
        elif kind == UNIT_FAILURE_RESULT and exit_text:
            crashes.append(Crash(at_us, started_us, entry.get("UNIT_RESULT", ""), exit_text, False))
            exit_text = ""
        elif kind == UNIT_RESTART_SCHEDULED and crashes:
            crashes[-1] = replace(crashes[-1], restarted=True)
    if unit.sub_state == "auto-restart" and crashes:  # the restart is due after RestartSec
        crashes[-1] = replace(crashes[-1], restarted=True)
    down = unit.active_state == "failed" and unit.result != "success"
    gave_up = down and unit.n_restarts > 0  # the restart systemd scheduled last was refused: the start limit
    # A crash whose restart is still to come (auto-restart), or that was not restarted (Restart=no), is not
    # counted in NRestarts yet.
    count = unit.n_restarts + (1 if unit.sub_state == "auto-restart" or (down and not gave_up) else 0)
    return CrashReport(restarts=unit.n_restarts, crashes=tuple(crashes[-count:]) if count else (),
                       gave_up=gave_up, down=down, pending=unit.sub_state == "auto-restart")


def _journal_time(us: int) -> str:
    return f"@{us // 1_000_000}.{us % 1_000_000:06d}"


def diagnosis_step(layout: StoreLayout, crash: Crash) -> Step:
    """The newest lines of the server between the start that crashed and its crash, newest first."""
    return Step(f"read {layout.unit_name} journal up to the crash at {crash.iso()}", sudo=True, timeout_s=30,
                argv=journal_argv(layout.unit_name, DIAGNOSIS_LINES, "-r", f"--since={_journal_time(crash.started_us)}",
                                  f"--until={_journal_time(crash.at_us)}"))


def crash_entry(crash: Crash, tags: Tags, report: CrashReport, index: int) -> HistoryEntry:
    """The history line of the `index`th crash (1-based) of a report."""
    last = index == len(report.crashes)
    if last and report.gave_up:
        cause = f"gave up after {report.restarts_done()} restarts: {crash.cause}"
    elif crash.restarted:
        cause = f"restarted (crash {index} since the deploy): {crash.cause}"
    else:
        cause = f"not restarted: {crash.cause}"
    return HistoryEntry("crash", RESTARTED if crash.restarted and not (last and report.gave_up) else FAILED,
                        crash.iso(), replace(tags, who=operator_name()), cause)


def unrecorded(report: CrashReport, store: StoreFacts, release: str) -> list[tuple[int, Crash]]:
    """The report's crashes (with their 1-based index) that history does not have yet."""
    seen = {entry.when for entry in store.history if entry.event == "crash" and entry.tags.release == release}
    return [(index, crash) for index, crash in enumerate(report.crashes, start=1) if crash.iso() not in seen]


def crash_loop_advice(report: CrashReport | None, store: StoreFacts) -> str | None:
    """When the current release is down after crashing and an earlier healthy one exists: the way back."""
    if report is None or not report.down or store.current is None:
        return None
    target = store.last_healthy(exclude=store.current)
    if target is None:
        return (f"release {store.current} is down after {len(report.crashes)} crash(es) and there is no earlier "
                "healthy release; fix the cause and `invoke deploy`")
    return (f"release {store.current} is down after {len(report.crashes)} crash(es); `invoke rollback` returns "
            f"to release {target}, the last healthy one")
