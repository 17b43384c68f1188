"""A TCP exchange forwarded through an SSH connection (remote/forward.py), against paramiko's own SSH server on
loopback that forwards as OpenSSH's sshd does (or refuses, as with AllowTcpForwarding no), to a real HTTP server."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath

import paramiko
import pytest
from paramiko.common import (
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_FAILED_CONNECT_FAILED,
    OPEN_SUCCEEDED,
)

from deploy_lib.errors import ReadinessFailed
from deploy_lib.health import NotReady, ProbeRejected, ProbeTarget, Ready, Verdict
from deploy_lib.host.readiness import health_request, live_verdict
from deploy_lib.host_scripts.probe import answer_status
from deploy_lib.remote import Forwarded, OutputLine, Put, Step, StepResult
from deploy_lib.remote.forward import exchange


class Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b"warming up" if self.path == "/ready" else b""
        self.send_response(503 if body else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Sshd(paramiko.ServerInterface):
    """Accepts the client without auth; opens direct-tcpip channels as sshd does: it connects first, then confirms
    (or refuses with OpenSSH's reason codes)."""

    def __init__(self, forwarding: bool) -> None:
        self.forwarding = forwarding
        self.sockets: dict[int, socket.socket] = {}

    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return AUTH_SUCCESSFUL

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        if not self.forwarding:
            return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        try:
            self.sockets[chanid] = socket.create_connection(destination, timeout=5)
        except OSError:
            return OPEN_FAILED_CONNECT_FAILED
        return OPEN_SUCCEEDED


def _pump(source: socket.socket | paramiko.Channel, sink: socket.socket | paramiko.Channel) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


@pytest.fixture
def http_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def connected(forwarding: bool) -> tuple[paramiko.Transport, paramiko.Transport]:
    """(client, server) transports of one SSH connection on loopback; the server forwards what it accepts."""
    listener = socket.create_server(("127.0.0.1", 0))
    client_socket = socket.create_connection(listener.getsockname())
    server_socket, _ = listener.accept()
    listener.close()
    server = paramiko.Transport(server_socket)
    server.add_server_key(paramiko.ECDSAKey.generate())
    sshd = Sshd(forwarding)

    def serve() -> None:
        server.start_server(server=sshd)  # returns once the client's handshake is done
        while server.is_active():
            channel = server.accept(timeout=0.2)
            if channel is not None:
                upstream = sshd.sockets.pop(channel.get_id())
                threading.Thread(target=_pump, args=(channel, upstream), daemon=True).start()
                threading.Thread(target=_pump, args=(upstream, channel), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    client = paramiko.Transport(client_socket)
    client.start_client(timeout=10)
    client.auth_none("deploy")
    return client, server


@pytest.fixture
def ssh() -> Iterator[paramiko.Transport]:
    client, server = connected(forwarding=True)
    yield client
    client.close()
    server.close()


def test_a_forwarded_request_gets_the_servers_whole_answer(ssh: paramiko.Transport, http_port: int) -> None:
    for path, status in (("/health", 200), ("/ready", 503)):
        target = ProbeTarget(unit=None, port=http_port, health_path=path)
        answer = exchange(ssh, "127.0.0.1", http_port, health_request(target), 5)
        assert answer.sent and answer.connected and answer.error is None
        assert answer_status(answer.answer)[0] == status
        assert answer.answer.endswith(b"warming up" if status == 503 else b"\r\n\r\n")


def test_a_closed_port_is_a_forwarded_answer_of_its_own(ssh: paramiko.Transport) -> None:
    """Input tried: a port nothing listens on (a server still loading): sshd's connect fails, the open says so."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        closed = taken.getsockname()[1]
    answer = exchange(ssh, "127.0.0.1", closed, b"GET / HTTP/1.1\r\n\r\n", 5)
    assert answer.sent and not answer.connected and answer.error


def test_an_exchange_without_data_only_connects(ssh: paramiko.Transport, http_port: int) -> None:
    answer = exchange(ssh, "127.0.0.1", http_port, b"", 5)
    assert answer.sent and answer.connected and answer.answer == b""


def test_a_host_that_refuses_forwarding_leaves_the_question_unsent(http_port: int) -> None:
    """Input tried: the sshd answers the open "administratively prohibited" (AllowTcpForwarding no)."""
    client, server = connected(forwarding=False)
    try:
        answer = exchange(client, "127.0.0.1", http_port, b"GET / HTTP/1.1\r\n\r\n", 5)
    finally:
        client.close()
        server.close()
    assert not answer.sent and not answer.connected and "does not forward" in (answer.error or "")


def test_an_answers_status_is_read_from_its_first_line_and_its_end_from_its_length() -> None:
    assert answer_status(b"HTTP/1.1 200 OK\r\nX: HTTP/1.1 503\r\n\r\n")[0] == 200
    assert answer_status(b"HTTP/1.0 503 Service Unavailable\r\n\r\n") == (503, None)  # ends at the close
    assert answer_status(b"") == (None, False) and answer_status(b"HTT") == (None, False)
    assert answer_status(b"HTTP/1.1 2") == (None, False)  # a status line not whole yet has no status
    assert answer_status(b"SSH-2.0-OpenSSH_9.2\r\n") == (None, True)
    assert answer_status(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no") == (200, False)
    assert answer_status(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == (200, True)
    assert answer_status(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n") == (200, False)
    assert answer_status(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n") == \
        (200, True)
    assert answer_status(b"HTTP/1.1 204 No Content\r\n\r\n") == (204, True)


# What a server on the port sends to whatever it is asked, and whether it then closes the connection; each is a state
# a user's server can be in (loading, answering, stalled, cut off, keeping the connection open, something else).
SERVER_STATES = {
    "ready": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    "warming up": (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\n\r\nwarming up", True),
    "wrong path": (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", True),
    "stalled after its status line": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", False),
    "cut off in its body": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", True),
    "keeps the connection open": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", False),
    "no length, closed": (b"HTTP/1.0 200 OK\r\n\r\nok", True),
    "not HTTP": (b"SSH-2.0-OpenSSH_9.2\r\n", True),
    "closes at once": (b"", True),
}


@pytest.fixture(params=sorted(SERVER_STATES))
def server_state(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """A port whose server answers every connection as SERVER_STATES[name] says (and reads the request first)."""
    answer, closes = SERVER_STATES[request.param]
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # the listener closed: the test is over
                return
            connection.recv(65536)  # the request (the port rung's connect sends none: EOF)
            if answer:
                connection.sendall(answer)
            if closes:
                connection.close()
            else:
                held.append(connection)

    threading.Thread(target=serve, daemon=True).start()
    yield request.param, listener.getsockname()[1]
    listener.close()
    for connection in held:
        connection.close()


class HostRemote:
    """A Remote whose host is this machine: runs a step's argv here, its stdin given (the host probe's python)."""

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results = []
        for step in batch:
            assert isinstance(step, Step)
            argv = (sys.executable, *step.argv[1:]) if step.argv[0] == "python3" else step.argv
            done = subprocess.run(argv, input=step.stdin, capture_output=True, timeout=step.timeout_s)
            results.append(StepResult(step, done.returncode, done.stdout.decode(), done.stderr.decode(), 0.0))
        return results

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        raise AssertionError("the probe pushes nothing")

    def close(self) -> None:
        pass


class ForwardingRemote(HostRemote):
    """The same host, reached through an SSH connection that forwards (the loopback sshd above)."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.answers: list[Forwarded] = []

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        self.answers.append(exchange(self.transport, host, port, data, timeout_s))
        return self.answers[-1]


def test_the_forwarded_and_the_host_probe_give_one_server_state_the_same_verdict(
        ssh: paramiko.Transport, server_state: tuple[str, int]) -> None:
    """The live probe forwards its health request where the host's sshd allows it, and runs the host probe where it
    does not (AllowTcpForwarding no): whichever way a host is reached, the same server gets the same verdict."""
    name, port = server_state
    target = ProbeTarget(unit=None, port=port, http_timeout_s=2.0)
    through_ssh = ForwardingRemote(ssh)
    forwarded = live_verdict(through_ssh, target)
    assert [answer.sent for answer in through_ssh.answers] == [True], "decided forwarded, not by the host probe"
    on_host = live_verdict(HostRemote(), target)
    assert (type(forwarded), forwarded.rung if isinstance(forwarded, ReadinessFailed) else None) == \
        (type(on_host), on_host.rung if isinstance(on_host, ReadinessFailed) else None), name
    assert verdict_status(forwarded) == verdict_status(on_host), name
    expected = Ready if name in ("ready", "keeps the connection open", "chunked", "no length, closed") else \
        ProbeRejected if name == "wrong path" else NotReady
    assert isinstance(forwarded, expected), name


def verdict_status(verdict: Verdict) -> int | None:
    """The health endpoint's status the verdict was decided on."""
    if isinstance(verdict, Ready):
        return verdict.snapshot.health_status
    line = next((line for line in verdict.evidence if line.startswith("health endpoint: ")), "")
    return int(line.split(": ", 1)[1]) if line.split(": ", 1)[-1].isdigit() else None
