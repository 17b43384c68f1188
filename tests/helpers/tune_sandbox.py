"""A tune's lines in a sandbox host's history."""

from __future__ import annotations

from helpers.rig import Rig


def tune_lines(rig: Rig, tune_id: str) -> list[dict[str, object]]:
    return [h for h in rig.history() if h["event"] == "tune" and h["tune"]["id"] == tune_id]  # type: ignore[index]
