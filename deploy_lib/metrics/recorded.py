"""The watch's windows as history records them: a few figures of each window in the deploy's history line
(`figures`, beside a benchmark's), so that the report can show a release's served traffic beside its benchmarks.

    watch.before.<figure>   the release serving before the switch, over the window read just before it
    watch.after.<figure>    the deployed release, over the window read once it was ready

A figure the window did not observe (no inter-token latency in a window of short non-streamed answers) is left out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from deploy_lib.metrics.window import WindowFigures

PREFIX = "watch."


class Side(enum.StrEnum):
    BEFORE = "before"  # the release serving before the switch
    AFTER = "after"    # the deployed release


@dataclass(frozen=True)
class RecordedWindow:
    """One window's served traffic as history keeps it (seconds, requests, tokens)."""

    window_s: float
    requests: float
    request_rate: float
    generation_tok_s: float
    ttft_p99_s: float | None
    inter_token_p99_s: float | None
    mean_in_flight: float | None

    @classmethod
    def of(cls, figures: WindowFigures) -> RecordedWindow:
        return cls(window_s=figures.window_s, requests=figures.requests, request_rate=figures.request_rate,
                   generation_tok_s=figures.generation_tok_s, ttft_p99_s=figures.ttft_s.p99,
                   inter_token_p99_s=figures.inter_token_s.p99, mean_in_flight=figures.mean_in_flight)

    def as_figures(self, side: Side) -> dict[str, float]:
        return {f"{PREFIX}{side}.{name}": round(value, 6) for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_figures(cls, figures: Mapping[str, float], side: Side) -> RecordedWindow | None:
        """The window a history line recorded on `side`, or None when it recorded none."""
        prefix = f"{PREFIX}{side}."
        found = {key.removeprefix(prefix): value for key, value in figures.items() if key.startswith(prefix)}
        if "requests" not in found:
            return None
        return cls(window_s=found.get("window_s", 0.0), requests=found["requests"],
                   request_rate=found.get("request_rate", 0.0), generation_tok_s=found.get("generation_tok_s", 0.0),
                   ttft_p99_s=found.get("ttft_p99_s"), inter_token_p99_s=found.get("inter_token_p99_s"),
                   mean_in_flight=found.get("mean_in_flight"))


def watch_figures(before: WindowFigures, after: WindowFigures) -> dict[str, float]:
    """Both windows of one watched deploy, as its history line's figures."""
    return RecordedWindow.of(before).as_figures(Side.BEFORE) | RecordedWindow.of(after).as_figures(Side.AFTER)
