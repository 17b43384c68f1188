"""One TCP exchange forwarded through the SSH connection, as `ssh -L` does (a `direct-tcpip` channel, RFC 4254
7.2): the client talks to HOST:PORT as the host itself reaches it, and the host runs no process for it, only its
sshd connects. OpenSSH's sshd allows this by default (AllowTcpForwarding yes); a host that refuses it answers the
channel's open "administratively prohibited", and the caller asks the host instead (`Forwarded.sent` False)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import paramiko

READ_CHUNK = 65536
CLOSE_WAIT_S = 1.0  # sshd's close answers our EOF within a round trip
CLOSE_POLL_S = 0.001


@dataclass(frozen=True)
class Forwarded:
    """What one forwarded exchange got: every byte the server sent until it closed the connection."""

    sent: bool  # False: this connection cannot forward (the host's sshd refuses, or the connection failed)
    connected: bool = False  # the host's sshd reached HOST:PORT
    answer: bytes = b""
    error: str | None = None  # why not: the host's connect error as its sshd words it, or a timeout


NOT_SENT = Forwarded(sent=False, error="this remote does not forward connections")


@runtime_checkable
class Forwarder(Protocol):
    """A Remote that can forward a TCP exchange through its connection (FabricRemote; tests' FakeRemote)."""

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded: ...


def forward(remote: object, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
    """`remote.forward(...)` where the remote forwards; NOT_SENT for one that does not (a test's wrapper)."""
    return remote.forward(host, port, data, timeout_s) if isinstance(remote, Forwarder) else NOT_SENT


def exchange(transport: paramiko.Transport, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
    """Open a direct-tcpip channel to host:port on `transport`, send `data`, read until the server closes (no `data`:
    connect only), and let sshd close the channel. A connection that fails here is not an answer (`sent` False): the
    caller's round trips have the reconnects."""
    import paramiko  # with the connection that calls it: the data above needs no SSH library
    from paramiko.common import OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    try:
        channel = transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout_s)
    except paramiko.ChannelException as refused:  # the open's reason code says which (RFC 4254 5.1)
        if refused.code == OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
            return Forwarded(sent=False, error=f"the host does not forward TCP: {refused.text}")
        return Forwarded(sent=True, error=refused.text or f"connect failed (code {refused.code})")
    except (paramiko.SSHException, OSError, EOFError) as failed:
        return Forwarded(sent=False, error=str(failed) or type(failed).__name__)
    chunks: list[bytes] = []
    try:
        channel.settimeout(timeout_s)
        if data:
            channel.sendall(data)
            while chunk := channel.recv(READ_CHUNK):
                chunks.append(chunk)
        _close_from_the_host(channel)
    except TimeoutError:  # socket.timeout, which paramiko raises, is TimeoutError
        return Forwarded(sent=True, connected=True, answer=b"".join(chunks), error="timeout")
    except (paramiko.SSHException, OSError, EOFError) as failed:
        return Forwarded(sent=False, connected=True, error=str(failed) or type(failed).__name__)
    finally:
        channel.close()
    return Forwarded(sent=True, connected=True, answer=b"".join(chunks))


def _close_from_the_host(channel: paramiko.Channel) -> None:
    """Send EOF and wait for sshd's own close of the channel, so that no message of it is still on its way when the
    connection closes: a close that overtakes it resets the connection, and sshd then ends without its normal
    exit ("Read error from remote host ... Connection reset by peer" in the host's log, and its processes' CPU
    never reaped by its listener), measured with OpenSSH 9.2 for a user other than root."""
    channel.shutdown_write()
    deadline = time.monotonic() + CLOSE_WAIT_S
    while not channel.closed and time.monotonic() < deadline:
        time.sleep(CLOSE_POLL_S)  # a sleep, not status_event: as remote/connection.py's wait, for the same reason
