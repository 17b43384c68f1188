"""A command's first reads, sent while the command is still starting (read-ahead).

The same command line in the same directory reads its hosts the same way each time: a no-op `deploy` is one read-only
batch and the live probe's health request. `start`, which the CLI calls before it imports the rest of the tool (some
0.3 s of CPU), opens each host's connection and sends what this command line read first last time
(remote/reads_record.py), in a thread per host. FabricRemote takes a result only when the round trip it is about to
send is that one (the same target, equal steps, or the same request to the same port); anything else and it sends its
own. What it takes is what it would have read itself, a few hundred milliseconds earlier, so nothing is decided from
it that would not have been. SGLANG_DEPLOY_READ_AHEAD=0 turns it off."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from deploy_lib.remote import reads_record
from deploy_lib.remote.reads_record import Exchange, Op, ReadAhead
from deploy_lib.remote.ssh import SSHTarget
from deploy_lib.remote.steps import StepResult

if TYPE_CHECKING:
    from deploy_lib.remote.connection import FabricRemote
    from deploy_lib.remote.forward import Forwarded

SWITCH_ENV = "SGLANG_DEPLOY_READ_AHEAD"


class Ahead:
    """One host's reads sent ahead: its connection, and each op's result as it comes. The command takes results in
    order while they are what it sends, then the connection (`take_connection`), or leaves it (`let_finish`)."""

    def __init__(self, target: SSHTarget, ops: tuple[Op, ...]) -> None:
        self.target, self.ops = target, ops
        self.results: list[list[StepResult] | Forwarded] = []
        self.remote: FabricRemote | None = None
        self.connected = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._stopped = self._unwanted = False
        self.thread = threading.Thread(target=self._send, name=f"read-ahead {target.address}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _send(self) -> None:
        from deploy_lib.remote.connection import FabricRemote
        from deploy_lib.remote.ssh import ONE_CONNECT

        remote = FabricRemote(self.target, connect_policy=ONE_CONNECT, read_ahead=False)
        try:
            remote._connect()  # one attempt: the command's own connect says why it failed, after its retries
            self.remote = remote
            self.connected.set()
            for op in self.ops:
                if self._stopped:
                    break
                self.results.append(remote.forward(op.host, op.port, op.data, op.timeout_s)
                                    if isinstance(op, Exchange) else remote._run_steps(op))
        except Exception:  # whatever failed here, the command meets it again when it sends that op itself
            pass
        finally:
            with self._lock:
                self.done.set()
                unwanted = self._unwanted
            if unwanted:
                remote.close()

    def result(self, index: int, op: Op) -> list[StepResult] | Forwarded | None:
        """Op number `index`'s result when it is `op` and came back; None otherwise, and then nothing more is sent
        ahead. Waits for a result on its way, never for a connection still opening (the command opens its own)."""
        if self.connected.is_set() and index < len(self.ops) and self.ops[index] == op:
            while len(self.results) <= index and not self.done.wait(0.001):
                pass
            if len(self.results) > index:
                return self.results[index]
        self._stopped = True
        return None

    def take_connection(self, wait_s: float) -> FabricRemote | None:
        """The open connection for the command's own round trips, once the read in flight on it is back (within
        `wait_s`); None when it did not open or is still busy (the command opens its own)."""
        self._stopped = True
        if self.connected.is_set() and self.done.wait(wait_s):
            return self.remote
        self._unwant()
        return None

    def let_finish(self, wait_s: float) -> None:
        """Nobody takes the connection: a read in flight is let finish (cut, it leaves a reset in the host's sshd log),
        then it closes."""
        self._stopped = True
        if self.connected.is_set():
            self.done.wait(wait_s)
        self._unwant()

    def _unwant(self) -> None:
        """Close the connection now if nothing is in flight on it, else when that is back."""
        with self._lock:
            self._unwanted = True
            idle = self.done.is_set()
        if idle and self.remote is not None:
            self.remote.close()


def start(command: Sequence[str], cwd: str, environ: Mapping[str, str]) -> None:
    """For the CLI, first thing: send ahead what this command line read first last time, and remember at exit what
    it reads first this time. Loads the connection's modules (Fabric, paramiko) only when there is something to
    send."""
    if environ.get(SWITCH_ENV, "1") == "0" or reads_record.current() is not None:
        return
    path = reads_record.record_path(reads_record.record_dir(environ), command, cwd)
    read_ahead = ReadAhead(path, command, cwd)
    reads_record.install(read_ahead)
    atexit.register(read_ahead.finish)
    hosts = reads_record.load(path, command, cwd)
    if hosts:
        import deploy_lib.remote.connection  # noqa: F401  (here, not in the threads: one importer, no import race)

        read_ahead.send([Ahead(target, ops) for target, ops in hosts])
