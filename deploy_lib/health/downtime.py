"""A switch's downtime: from the moment the old server stops (the step that stops it) to the moment the new one
answers a generation (the ladder's generate rung), split into the server's own start (from systemd's "Started" line
to its first generation, itemized by its logged phases) and the rest, the tool's own part (stopping the old server,
systemd, the ladder's notice). A switch with no server running before it has none.

History keeps it in the entry's timings (`downtime`, `downtime.server`; the phases are its `start.*` timings), so a
history file written before it stays readable: its entries have no downtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deploy_lib.health.startup import (
    FIRST_GENERATION,
    PHASE_LABELS,
    PHASES,
    TIMING_PREFIX,
    LogMark,
    duration_text,
    marker_times,
)

DOWNTIME = "downtime"  # history timings: seconds from the old server's stop to the new one's first answer
DOWNTIME_SERVER = "downtime.server"  # of which the new server's own start


@dataclass(frozen=True)
class Downtime:
    """How long the endpoint did not answer during one switch, and which part of it the server's start took."""

    total_s: float
    server_s: float  # the new server's start, from its process to its first generation
    phases: Mapping[str, float] = field(default_factory=dict)  # the server's logged start phases (health.startup)

    @property
    def tool_s(self) -> float:
        """The part that is not the server's start: the old server's stop, systemd, the tool's round trips."""
        return round(self.total_s - self.server_s, 3)

    def timings(self) -> dict[str, float]:
        """As history's timings keep it (the phases are the start's own `start.*` timings)."""
        return {DOWNTIME: self.total_s, DOWNTIME_SERVER: self.server_s}

    def timings_with_phases(self) -> dict[str, float]:
        """timings() and the server's start phases as history names them, for a line whose start timings came from
        elsewhere (a sweep's candidate, a multi-node release's other nodes) to keep it whole."""
        return self.timings() | {TIMING_PREFIX + name: seconds for name, seconds in self.phases.items()}

    @classmethod
    def from_timings(cls, timings: Mapping[str, float]) -> Downtime | None:
        """The downtime a history entry recorded; None for one that recorded none (or was written before it was)."""
        if DOWNTIME not in timings:
            return None
        total = timings[DOWNTIME]
        phases = {name: timings[TIMING_PREFIX + name] for name in PHASES if TIMING_PREFIX + name in timings}
        return cls(total, timings.get(DOWNTIME_SERVER, 0.0), phases)

    def line(self) -> str:
        """`downtime 3m41s: tool 2.6 s, server 3m38s (init 14.0 s, weights 2m10s, ...)`."""
        phases = ", ".join(f"{PHASE_LABELS[name]} {duration_text(seconds)}" for name, seconds in self.phases.items())
        return (f"downtime {duration_text(self.total_s)}: tool {duration_text(self.tool_s)}, server "
                f"{duration_text(self.server_s)}" + (f" ({phases})" if phases else ""))


def server_start_s(marks: Sequence[LogMark], phases: Mapping[str, float]) -> float:
    """The server's own start: from systemd's "Started" line to "ready to roll", plus its first generation; the sum
    of the phases it logged when either line is missing."""
    times = marker_times(marks)
    if "process" in times and "server_up" in times:
        return times["server_up"] - times["process"] + phases.get(FIRST_GENERATION, 0.0)
    return sum(phases.values())


def measure_downtime(stopped_at: float, answered_at: float, server_s: float, phases: Mapping[str, float]
                     ) -> Downtime:
    """The downtime between two readings of one clock; the server's part never exceeds it (its lines are timed by
    the host's journal, so a part of a second may differ)."""
    total = round(max(0.0, answered_at - stopped_at), 3)
    return Downtime(total, round(min(total, server_s), 3), {name: phases[name] for name in PHASES if name in phases})
