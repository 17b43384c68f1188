"""Progress callbacks: the library reports what it is doing here and never prints."""

from __future__ import annotations

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
