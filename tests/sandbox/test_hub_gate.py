"""The hub gate (hub_gate.py) on loopback, in front of a plain HTTP server: what it passes, holds and lets go."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import hub_gate
from helpers.hub_gate import HubGate
from helpers.waits import STATE_WAIT_S

from sandbox.hub import Hub

HELD = "model-00002-of-00002.safetensors"
BUDGET = 100_000


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Hub]:
    """A plain HTTP server on loopback serving a repo's resolve paths, as a Hub the gate stands in front of."""
    files = tmp_path / "tests" / "tiny" / "resolve" / "c0"
    files.mkdir(parents=True)
    (files / HELD).write_bytes(bytes(range(256)) * 4000)  # 1,024,000 bytes
    (files / "config.json").write_bytes(b"{}" * 60_000)  # bigger than the budget: only the held file is held
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield Hub("loopback", "127.0.0.1", server.server_address[1])
    server.shutdown()
    serving.join()
    server.server_close()


class Download:
    """A GET through the gate, read in a thread: `body` grows as bytes arrive, `done` once it ended."""

    def __init__(self, gate: HubGate, name: str) -> None:
        self.body = bytearray()
        self.done = threading.Event()
        self.arrived = threading.Condition()
        host, port = gate.endpoint.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=STATE_WAIT_S)
        self.connection.request("GET", f"/tests/tiny/resolve/c0/{name}")
        self.response = self.connection.getresponse()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while chunk := self.response.read1(65536):
                with self.arrived:
                    self.body += chunk
                    self.arrived.notify_all()
        except (OSError, http.client.HTTPException):
            pass  # cut off: `body` holds what came
        self.done.set()
        with self.arrived:
            self.arrived.notify_all()

    def wait_for(self, size: int) -> bool:
        """Whether `size` bytes of the body arrived (False once the answer ended short of them)."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.body) >= size or self.done.is_set(), STATE_WAIT_S) and \
                len(self.body) >= size

    def close(self) -> None:
        self.connection.close()
        self.reader.join()


def test_other_files_pass_whole_and_the_held_one_stops_at_the_budget_until_released(upstream: Hub) -> None:
    with HubGate(upstream, HELD, BUDGET) as gate:
        config = Download(gate, "config.json")
        assert config.done.wait(STATE_WAIT_S) and len(config.body) == 120_000 and not gate.holding.is_set()
        held = Download(gate, HELD)
        assert gate.holding.wait(STATE_WAIT_S) and held.wait_for(BUDGET // 2)
        assert not held.done.is_set() and len(held.body) < 1_024_000 // 2
        gate.release()
        assert held.done.wait(STATE_WAIT_S) and bytes(held.body) == bytes(range(256)) * 4000
        again = Download(gate, HELD)  # released: no longer held
        assert again.done.wait(STATE_WAIT_S) and len(again.body) == 1_024_000
        for download in (config, held, again):
            download.close()


def test_a_held_answer_gets_a_byte_now_and_then_and_closing_the_gate_cuts_it_off(
        upstream: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_gate, "KEEPALIVE_S", 0.05)
    with HubGate(upstream, HELD, BUDGET) as gate:
        held = Download(gate, HELD)
        assert gate.holding.wait(STATE_WAIT_S)
        at_hold = len(held.body)
        assert held.wait_for(at_hold + 3)  # the connection stays alive byte by byte
    held.reader.join()
    assert held.done.is_set() and len(held.body) < 1_024_000  # the gate closed: the answer never completed
    held.close()
