"""How long a sandbox test waits for a state: a bound only so that a broken test ends, never a measure of speed. A
busy machine (other test modules, other work on its cores) may take many times the idle figure for a server to
start or a unit to fail; the tests wait on the state itself, and this bound is far above any such figure."""

from __future__ import annotations

import time
from collections.abc import Callable

STATE_WAIT_S = 300


def wait_for(condition: Callable[[], bool], what: str, bound_s: float = STATE_WAIT_S) -> None:
    """Until `condition()` holds, looked at every 0.1 s; AssertionError naming `what` past the bound."""
    end = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not reached within {bound_s:g} s")
        time.sleep(0.1)
