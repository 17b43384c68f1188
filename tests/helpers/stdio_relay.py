"""A ProxyCommand for the tests, as `nc %h %p` or a bastion's `ssh -W` would be: it connects to HOST PORT and
relays its stdin to that socket and the socket to its stdout; it records each connection in RECORD (a file) when
given, so a test can tell that the connection went through it."""

from __future__ import annotations

import socket
import sys
import threading


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        with open(sys.argv[3], "a", encoding="utf-8") as record:
            record.write(f"{host} {port}\n")
    connection = socket.create_connection((host, port))

    def upstream() -> None:
        while data := sys.stdin.buffer.read1(65536):
            connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
    threading.Thread(target=upstream, daemon=True).start()
    while data := connection.recv(65536):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
