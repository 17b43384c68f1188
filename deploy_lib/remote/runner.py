"""The invoke runner of a round trip's channel: the whole stdin in one write, Ctrl-C closing the channel, and the
wait for the exit status that looks every millisecond at first and watches the connection's silence."""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from typing import Any

import fabric.runners

from deploy_lib.remote.batch import SilenceBound
from deploy_lib.remote.ssh import ChannelWatch

EXIT_POLL_S = 0.001  # the first looks at the channel: a short round trip ends within 1 ms of its exit status
EXIT_POLL_FAST_S = 0.1  # how long a round trip is looked at every EXIT_POLL_S
EXIT_POLL_SHARE = 0.01  # after that, a look every 1 % of the time waited so far ...
EXIT_POLL_MAX_S = 0.05  # ... and at least every 50 ms

# The silence bound of the round trip this thread is waiting on (set around `connection.run`, read by the runner).
SILENCE: ContextVar[SilenceBound | None] = ContextVar("silence", default=None)
OPENING: ContextVar[ChannelWatch | None] = ContextVar("opening", default=None)  # ... and its channel's open


def exit_poll_s(waited_s: float) -> float:
    """The pause before the next look at a round trip's channel, `waited_s` after it was sent: every millisecond for
    the first 100 ms, then growing with the wait, so that the wait adds at most 1 % (or 1 ms) to any round trip and
    a long step (a venv build, a model download, a gpu check: minutes) wakes this process 20 times a second, not
    1,000 (`make bench`: the client's CPU during a long step)."""
    if waited_s < EXIT_POLL_FAST_S:
        return EXIT_POLL_S
    return min(EXIT_POLL_MAX_S, max(EXIT_POLL_S, waited_s * EXIT_POLL_SHARE))


class WholeStdinRemote(fabric.runners.Remote):
    """Sends a step's stdin in one write, then EOF: invoke's own pump moves one byte per 10 ms. On Ctrl-C it closes
    the channel: invoke would otherwise wait for the remote command to end before raising (it joins its output
    threads without a timeout, invoke 2.x runners.py `_run_body`), e.g. for the whole of a model download."""

    def handle_stdin(self, input_: Any, output: Any, echo: bool = False) -> None:
        self.channel.sendall(input_.getvalue())
        self.channel.shutdown_write()

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.channel.close()  # the remote command sees its output closed and stops at its next write
        raise interrupt

    def wait(self) -> None:
        """Until the command's exit status (or the channel's close) arrives, looking every millisecond at first where
        invoke looks every 10 ms, which each round trip paid, then less often as the wait grows (`exit_poll_s`). In
        the main thread a sleep, not the channel's status_event: waiting on that takes a lock paramiko's thread
        needs, and a Ctrl-C landing there once left a round trip waiting forever. A worker thread (a group's host,
        `ops.fleet.in_parallel`) gets no signal, so it waits on the event, woken when the status
        arrives: a group's threads polling every millisecond took the interpreter lock from each other (`make
        bench`: the client's CPU per host in a group's changed deploy 0.21 -> 0.14 s)."""
        woken = None if threading.current_thread() is threading.main_thread() else self.channel.status_event
        if (opening := OPENING.get()) is not None:
            opening.started()  # the command runs: from here on the silence bound watches the channel
        sent = time.monotonic()
        silence = SILENCE.get()
        heard, seen_out, seen_err = sent, 0, 0
        while not (self.process_is_finished or self.has_dead_threads):
            now = time.monotonic()
            if silence is None:
                pass
            elif len(self.stdout) > seen_out or len(self.stderr) > seen_err:
                for chunk in self.stdout[seen_out:]:
                    silence.seen(chunk)
                seen_out, seen_err, heard = len(self.stdout), len(self.stderr), now
            elif now - heard > silence.bound_s:
                # nothing for longer than the host's `timeout` allows the running steps: a dead connection
                silence.gave_up_after_s = now - heard
                self.channel.close()
                return
            if woken is None:
                time.sleep(exit_poll_s(now - sent))
            else:
                woken.wait(EXIT_POLL_MAX_S)  # set with the exit status; the silence bound is looked at 20 times/s
