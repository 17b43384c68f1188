"""RecordingProgress: the Progress of the tests; keeps every event so a test can say what the user was shown."""

from __future__ import annotations

from dataclasses import dataclass, field

from tenacity import RetryCallState


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
