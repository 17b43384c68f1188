"""Progress callbacks: the library reports what it is doing here and never prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tenacity import RetryCallState


class Progress(Protocol):
    """What a long operation tells its caller; rich in tasks.py, a recorder in tests, a line writer for --json."""

    def phase_started(self, name: str) -> None: ...

    def step_done(self, name: str, seconds: float) -> None: ...

    def retrying(self, retry_state: RetryCallState) -> None: ...

    def log_line(self, text: str) -> None: ...

    def note(self, text: str) -> None: ...

    def transfer(self, text: str) -> None: ...  # a long transfer's state: bytes done / total, rate, ETA


class NullProgress:
    """Progress that goes nowhere: for callers that only want the result."""

    def phase_started(self, name: str) -> None:
        pass

    def step_done(self, name: str, seconds: float) -> None:
        pass

    def retrying(self, retry_state: RetryCallState) -> None:
        pass

    def log_line(self, text: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def transfer(self, text: str) -> None:
        pass


@dataclass
class RecordingProgress:
    """Keeps every event as (kind, value) in order; retries are kept as (attempt number, planned sleep)."""

    events: list[tuple[str, object]] = field(default_factory=list)

    def phase_started(self, name: str) -> None:
        self.events.append(("phase", name))

    def step_done(self, name: str, seconds: float) -> None:
        self.events.append(("done", (name, seconds)))

    def retrying(self, retry_state: RetryCallState) -> None:
        sleep = retry_state.next_action.sleep if retry_state.next_action else 0.0
        self.events.append(("retry", (retry_state.attempt_number, sleep)))

    def log_line(self, text: str) -> None:
        self.events.append(("log", text))

    def note(self, text: str) -> None:
        self.events.append(("note", text))

    def transfer(self, text: str) -> None:
        self.events.append(("transfer", text))

    def of_kind(self, kind: str) -> list[object]:
        """The values of every event of one kind, in order."""
        return [value for event_kind, value in self.events if event_kind == kind]
