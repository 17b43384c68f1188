"""Reading JSON-lines output: the lines of a text that are JSON objects."""

from __future__ import annotations

import json
from typing import Any


def json_objects(text: str) -> list[dict[str, Any]]:
    """Each line of `text` that is a JSON object, in order; any other line (a progress or warning line, a cut-off
    last line) is skipped."""
    objects = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects
