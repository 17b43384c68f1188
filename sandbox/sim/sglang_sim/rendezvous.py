"""The rendezvous of a multi-node server (`--nnodes N --node-rank R --dist-init-addr HOST:PORT`), over real TCP as
torch.distributed's TCPStore does it: node 0 listens on the address, every other rank connects and says its rank,
and distributed init ends for everyone once all N ranks have joined. The connections stay open for the server's
life: a rank whose connection drops is a dead rank, which the others notice as NCCL does (a collective that never
completes, then the watchdog)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_S = 0.2  # how often a wait looks at SIGTERM and its deadline


class RendezvousFailed(Exception):
    """The message torch.distributed raises, e.g. `torch.distributed.DistStoreError: Timed out ...`."""


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: int
    host: str
    port: int

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> Topology | None:
        nnodes = int(args.get("nnodes") or 1)
        if nnodes == 1:
            return None
        host, _, port = str(args.get("dist_init_addr") or "").rpartition(":")
        return cls(nnodes, int(args.get("node_rank") or 0), host.strip("[]"), int(port))


class Rendezvous:
    """One node's side of the rendezvous; `stop` (SIGTERM) ends any wait, with None."""

    def __init__(self, topology: Topology, timeout_s: float, stop: threading.Event) -> None:
        self.topology = topology
        self.timeout_s = timeout_s
        self.stop = stop
        self.peers: dict[int, socket.socket] = {}

    def join(self) -> bool:
        """Wait until every rank has joined (True), or SIGTERM came (False); RendezvousFailed on the timeout."""
        return self._serve() if self.topology.node_rank == 0 else self._dial()

    def _serve(self) -> bool:
        family = socket.AF_INET6 if ":" in self.topology.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", self.topology.port))
        listener.listen()
        listener.settimeout(POLL_S)
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(self.peers) < self.topology.nnodes - 1:
                if self.stop.is_set():
                    return False
                if time.monotonic() > deadline:
                    raise RendezvousFailed(
                        f"torch.distributed.DistStoreError: Timed out after {self.timeout_s:.0f} seconds waiting for "
                        f"clients. {len(self.peers) + 1}/{self.topology.nnodes} clients joined.")
                try:
                    peer, _ = listener.accept()
                except TimeoutError:
                    continue
                peer.settimeout(self.timeout_s)
                line = peer.makefile("r").readline().split()
                if len(line) == 2 and line[0] == "rank" and line[1].isdigit():
                    self.peers[int(line[1])] = peer
                else:
                    peer.close()
            for peer in self.peers.values():
                peer.sendall(b"go\n")
                peer.settimeout(None)
            return True
        finally:
            listener.close()

    def _dial(self) -> bool:
        address = (self.topology.host, self.topology.port)
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.is_set():
            if time.monotonic() > deadline:
                raise RendezvousFailed(
                    f"torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{self.timeout_s * 1000:.0f}ms while trying to connect to ({address[0]}, {address[1]}).")
            try:
                peer = socket.create_connection(address, timeout=POLL_S * 5)
            except OSError:
                self.stop.wait(POLL_S)  # node 0 not listening yet: torch's client retries until its timeout
                continue
            try:
                peer.sendall(f"rank {self.topology.node_rank}\n".encode())
                peer.settimeout(max(POLL_S, deadline - time.monotonic()))
                if peer.makefile("r").readline().strip() == "go":
                    peer.settimeout(None)
                    self.peers[0] = peer
                    return True
            except OSError:
                pass
            peer.close()  # node 0 went away before everyone joined: dial again
        return False

    def watch(self, on_lost: Callable[[int], None]) -> None:
        """Call `on_lost(rank)` from a thread when a peer's connection drops (its process died or stopped)."""
        for rank, peer in self.peers.items():
            threading.Thread(target=self._wait_closed, args=(rank, peer, on_lost), daemon=True).start()

    @staticmethod
    def _wait_closed(rank: int, peer: socket.socket, on_lost: Callable[[int], None]) -> None:
        try:
            while peer.recv(1024):
                pass
        except OSError:
            pass
        on_lost(rank)
