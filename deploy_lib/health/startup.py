"""A start's phases from the server's own log lines: which lines mark them, and their durations from the journal's
timestamps. The probe (probe_script.py) sends back every line after the restart that matches a marker; a phase
whose begin or end line is missing is unknown (absent), never guessed.

The texts are SGLang's, as 0.5.9 and 0.5.23 write them (sglang/srt/model_executor/model_runner.py "Load weight
begin." / "Load weight end."; sglang/srt/mem_cache/memory_pool.py "KV Cache is allocated."; the CUDA graph capture
"Capture cuda graph begin." in 0.5.9's model_runner.py, "Capture target decode CUDA graph begin." in 0.5.23's
model_runner_components/cuda_graph_setup.py, with the same "end." lines; "The server is fired up and ready to
roll!" in sglang/srt/entrypoints/http_server.py), plus systemd's own "Started UNIT" line for the process start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class LogMark(BaseModel):
    """One journal line that matched a marker, with the journal's time of it (microseconds since the epoch)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    text: str
    usec: int


@dataclass(frozen=True)
class Marker:
    name: str
    pattern: re.Pattern[str]
    last: bool  # the last matching line counts (an end: every TP rank logs it; the slowest one ends the phase)


def _marker(name: str, pattern: str, last: bool = False) -> Marker:
    return Marker(name, re.compile(pattern), last)


MARKERS: tuple[Marker, ...] = (
    _marker("process", r"^Started \S+"),
    _marker("weights_begin", r"Load weight begin\."),
    _marker("weights_end", r"Load weight end\.", last=True),
    _marker("kv_cache", r"KV Cache is allocated\.", last=True),
    _marker("graphs_begin", r"Capture [\w ]*?(?:cuda|CUDA) graph begin\."),
    _marker("graphs_end", r"Capture [\w ]*?(?:cuda|CUDA) graph end\.", last=True),
    _marker("server_up", r"The server is fired up and ready to roll"),
)
MARKER_PATTERNS: tuple[str, ...] = tuple(marker.pattern.pattern for marker in MARKERS)

# (phase, from marker, to marker), in the order a start goes through them
LOGGED_PHASES: tuple[tuple[str, str, str], ...] = (
    ("init", "process", "weights_begin"),
    ("weights", "weights_begin", "weights_end"),
    ("kv_cache", "weights_end", "kv_cache"),
    ("cuda_graphs", "graphs_begin", "graphs_end"),
    ("warmup", "graphs_end", "server_up"),
)
FIRST_GENERATION = "first_generation"  # the ladder's one real request, timed by the probe
PHASES: tuple[str, ...] = (*(name for name, _, _ in LOGGED_PHASES), FIRST_GENERATION)
PHASE_LABELS: Mapping[str, str] = {"init": "init", "weights": "weights", "kv_cache": "KV cache",
                                   "cuda_graphs": "cuda graphs", "warmup": "warmup",
                                   FIRST_GENERATION: "first generation"}
TIMING_PREFIX = "start."  # history's timings: start.<phase> -> seconds; ready.<rung> -> seconds since the restart
RUNG_PREFIX = "ready."


def marker_times(marks: Sequence[LogMark]) -> dict[str, float]:
    """Each marker's time (seconds since the epoch): its first matching line, or its last for an end."""
    times: dict[str, float] = {}
    for mark in sorted(marks, key=lambda m: m.usec):
        for marker in MARKERS:
            if marker.pattern.search(mark.text) and (marker.last or marker.name not in times):
                times[marker.name] = mark.usec / 1e6
    return times


def startup_phases(marks: Sequence[LogMark], first_generation_s: float | None) -> dict[str, float]:
    """Seconds per phase whose both lines were logged (in order); the first generation when the ladder sent one."""
    times = marker_times(marks)
    phases = {name: round(times[end] - times[begin], 3) for name, begin, end in LOGGED_PHASES
              if begin in times and end in times and times[end] >= times[begin]}
    if first_generation_s is not None:
        phases[FIRST_GENERATION] = round(first_generation_s, 3)
    return phases


def startup_timings(phases: Mapping[str, float], rungs_s: Mapping[str, float]) -> dict[str, float]:
    """The history timings of one start: start.<phase>, and ready.<rung> (seconds from the restart to the rung)."""
    return {**{TIMING_PREFIX + name: seconds for name, seconds in phases.items()},
            **{RUNG_PREFIX + rung: round(seconds, 3) for rung, seconds in rungs_s.items()}}


def recorded_phases(timings: Mapping[str, float]) -> dict[str, float | None]:
    """Every phase of a history entry's timings, None where it is unknown (its line was not logged or not seen)."""
    return {name: timings.get(TIMING_PREFIX + name) for name in PHASES}


def duration_text(seconds: float) -> str:
    """`2m10s` from a minute on, `8.2 s` below it."""
    if seconds >= 60:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes}m{rest:02d}s"
    return f"{seconds:.1f} s"


def startup_line(timings: Mapping[str, float], phases: Sequence[str] = ("weights", "cuda_graphs", FIRST_GENERATION)
                 ) -> str:
    """`weights 2m10s, cuda graphs 1m05s, first generation 0.2 s`; '' for a start with no phase recorded at all."""
    known = recorded_phases(timings)
    if all(value is None for value in known.values()):
        return ""
    return ", ".join(f"{PHASE_LABELS[name]} {'unknown' if known[name] is None else duration_text(known[name] or 0)}"
                     for name in phases)
