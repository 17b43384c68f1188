"""A gate in front of a guest's hub (sandbox/hub.py): a TCP proxy on the host end of the guest's veth that passes
every request and answer, except that the answers to GETs of one file stop after `budget` bytes (all connections
together) and are held until the test releases them, or the gate closes.

A download through the gate then reaches a state the test can wait on (`holding`: part of the file arrived, the
rest is held) and cannot finish before the test acts, however slow the machine is. While held, one byte now and
then keeps the connection alive: huggingface_hub gives up on a connection silent for its read timeout (10 s,
HF_HUB_DOWNLOAD_TIMEOUT in huggingface_hub 1.x constants.py) and would retry, then fail.

    with HubGate(guest.hub, "model-00002-of-00002.safetensors", budget=256_000) as gate:
        ...  # deploy with the host var hf_endpoint = gate.endpoint; gate.holding.wait(); interrupt
"""

from __future__ import annotations

import re
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit

from sandbox.hub import Hub

# Each request on a connection starts with its request line; HTTP/1.1 clients send the next one only after the
# answer to the last (huggingface_hub's httpx does not pipeline), so the last one seen is the one being answered.
REQUEST_LINE = re.compile(rb"(?:^|\r\n)([A-Z]+) (\S+) HTTP/1\.[01]\r\n")
KEEPALIVE_S = 2.0  # a held answer's one byte this often: well inside huggingface_hub's 10 s read timeout
CHUNK = 65536


class HubGate:
    """Listens on the hub's address at a free port (`endpoint`) and forwards to the hub; see the module."""

    def __init__(self, hub: Hub, held_file: str, budget: int) -> None:
        self.upstream = (hub.host_ip, hub.port)
        self.held_file = held_file
        self.budget = budget
        self.passed = 0                       # bytes of held answers forwarded so far
        self.holding = threading.Event()      # set once an answer is held back
        self._released = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server((hub.host_ip, 0))

    @property
    def endpoint(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def release(self) -> None:
        """Let the held answers, and every answer after them, through whole."""
        self._released.set()

    def __enter__(self) -> HubGate:
        self._start(self._accept)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening, drop every connection (a held answer is never completed) and end the gate's threads."""
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._sockets]
        self._released.set()  # wakes the held answers, which see the gate closed
        for sock in sockets:
            _shut(sock)  # wakes the threads blocked on it (on Linux, accept() too)
        for thread in self._threads:  # the accept loop first: no thread starts after it ended
            thread.join()
        for sock in [self._listener, *self._sockets]:
            sock.close()  # only now: a pump never meets a closed socket whose number was reused

    # -- the proxy ---------------------------------------------------------------------------------------------

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
                if self._closed:
                    return _shut_all(client, server)
            held = threading.Event()  # set while this connection's current request is a GET of the held file
            self._start(self._requests, client, server, held)
            self._start(self._answers, server, client, held)

    def _requests(self, client: socket.socket, server: socket.socket, held: threading.Event) -> None:
        tail = b""
        while data := _receive(client):
            seen = tail + data
            if lines := REQUEST_LINE.findall(seen):
                method, target = lines[-1]
                path = urlsplit(target.decode("latin-1")).path
                # decided before the request is forwarded, so its answer cannot arrive first
                (held.set if method == b"GET" and path.endswith("/" + self.held_file) else held.clear)()
            tail = seen[-1024:]
            if not _send(server, data):
                return _shut_all(client, server)
        _shut(server, socket.SHUT_WR)  # the client's end of sending, passed on

    def _answers(self, server: socket.socket, client: socket.socket, held: threading.Event) -> None:
        while data := _receive(server):
            while data:
                count = self._allowance(len(data)) if held.is_set() else len(data)
                if count == 0:
                    if self._closed:
                        return _shut_all(server, client)
                    if self._released.wait(KEEPALIVE_S):
                        continue
                    count = 1  # still held: one byte keeps the connection alive
                if not _send(client, data[:count]):
                    return _shut_all(server, client)
                data = data[count:]
        _shut(client, socket.SHUT_WR)

    def _allowance(self, wanted: int) -> int:
        """How many of `wanted` bytes of a held answer may pass now (all once released); marks the gate holding
        when not all."""
        with self._lock:
            if self._closed:
                return 0
            if self._released.is_set():
                return wanted
            count = min(wanted, self.budget - self.passed)
            self.passed += count
            if count < wanted:
                self.holding.set()
            return count


def _receive(sock: socket.socket) -> bytes:
    try:
        return sock.recv(CHUNK)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _shut(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    """`sock` shut (both directions by default: the other pump of its connection sees the end); closed only by
    `HubGate.close`."""
    try:
        sock.shutdown(how)
    except OSError:
        pass  # not connected any more


def _shut_all(*socks: socket.socket) -> None:
    for sock in socks:
        _shut(sock)
