"""A local sshd for the SSH tests (the `sshd` fixture itself: tests/conftest.py)."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy_lib.remote import SSHTarget

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass(frozen=True)
class SshServer:
    port: int
    host_public_key: Path
    client_key: Path
    workdir: Path

    def target(self, known_hosts: Path, accept_new: bool = False) -> SSHTarget:
        return SSHTarget(host="127.0.0.1", port=self.port, user=getpass.getuser(), key_files=(self.client_key,),
                         known_hosts_file=known_hosts, connect_timeout_s=5, accept_new_host_key=accept_new)

    def known_hosts(self, directory: Path) -> Path:
        """A known_hosts file that trusts this server's real host key."""
        path = directory / "known_hosts"
        path.write_text(f"[127.0.0.1]:{self.port} {self.host_public_key.read_text().split(' ')[0]} "
                        f"{self.host_public_key.read_text().split(' ')[1]}\n")
        return path


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


