"""SIGINT and SIGTERM as an exception, so that a deploy or rollback finishes its transition before it exits."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deploy_lib.errors import Interrupted, Terminated


class Interrupt(KeyboardInterrupt):
    """A signal arrived; raised in the main thread wherever it was. A KeyboardInterrupt, so that Fabric passes it
    on from a running remote command as it does Ctrl-C, and `except Exception` never swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """SIGINT or SIGTERM; a plain KeyboardInterrupt (no handler installed) is SIGINT."""
    return signal.Signals(getattr(interrupt, "signum", signal.SIGINT)).name


def interrupted(interrupt: KeyboardInterrupt, message: str, hint: str | None = None) -> Interrupted:
    """The error a command ends with after a signal: exit 130 for SIGINT, 143 for SIGTERM."""
    is_term = getattr(interrupt, "signum", signal.SIGINT) == signal.SIGTERM
    return (Terminated if is_term else Interrupted)(message, hint)


@contextmanager
def signals_raise() -> Iterator[None]:
    """For the block, SIGINT and SIGTERM raise Interrupt (main thread only: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: object) -> None:
        raise Interrupt(signum)

    previous = {signum: signal.signal(signum, raise_interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def signals_noted(on_first: Callable[[int], None] | None = None) -> Iterator[list[int]]:
    """For the block, SIGINT and SIGTERM are noted (the list it yields), not raised: work on other threads that
    must not be cut mid-way (a host's deploy, a node's round trip) runs to its end, and the caller decides what a
    noted signal means. `on_first` is told of the first one. Outside the main thread nothing changes."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum: int, frame: object) -> None:
        if not noted and on_first is not None:
            on_first(signum)
        noted.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
