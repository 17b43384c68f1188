"""bench.timeline's reading of a unit's journal: journald writes a service's output only once it has processed its
stream, so a read right after a deploy can miss the last lines (systemd/systemd#28650: `journalctl --sync` returns
once every stream was processed). `make bench`'s fleet part died on such a read at 8 guests on a loaded machine: no
"fired up" line after the restart (StopIteration). No guest: a journal whose last lines wait in journald's queue."""

from __future__ import annotations

import json
import shlex

import pytest

from bench import timeline
from sandbox import manage

RESTART, READY = 100.0, 106.0


def record(at: float, message: str, job_type: str | None = None) -> str:
    return json.dumps({"__REALTIME_TIMESTAMP": str(int(at * 1e6)), "MESSAGE": message, "__CURSOR": f"c{at}",
                       **({"JOB_TYPE": job_type} if job_type else {})})


class QueuedJournal:
    """The guest's journald: the restart's job message written, the server's "fired up" line still queued until a
    sync has journald process every stream."""

    def __init__(self) -> None:
        self.written = [record(RESTART, "Started sglang.service.", "start")]
        self.queued = [record(READY, f"[2026-12-02 19:00:00] {timeline.READY_LINE}")]

    def run_on(self, guest: manage.Guest, command: str, **_: object) -> str:
        shown = []
        for part in command.split(";"):
            argv = shlex.split(part)
            if argv[:2] == ["journalctl", "--sync"]:
                self.written, self.queued = [*self.written, *self.queued], []
            elif argv[:1] == ["journalctl"]:
                shown = self.written
        return "".join(line + "\n" for line in shown)


def test_the_server_start_is_read_from_a_journal_whose_last_lines_journald_has_not_written_yet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    journald = QueuedJournal()
    monkeypatch.setattr(manage, "run_on", journald.run_on)
    entries = timeline.Journal(manage.Guest.__new__(manage.Guest)).since(None)
    restarted = timeline.restart_instant(entries, RESTART - 1)
    assert timeline.ready_instant(entries, restarted) - restarted == pytest.approx(READY - RESTART)
