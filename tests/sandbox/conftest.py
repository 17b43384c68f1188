"""Fixtures for the sandbox VM and the simulated SGLang server.

- `sandbox_guest` (session): a guest of its own (name pt<pid>, so concurrent test runs do not collide),
  always stopped at the end; `sandbox_ssh`: a deploy_lib FabricRemote logged in as `deploy` (sudo -n works);
  `sandbox_venv`: the guest with /opt/ml-env built from the wheelhouse (real sglang + flashinfer, the sim).
- `wheelhouse`, `sim_venv` (session): the wheels, and a venv on this machine for the sim's loopback tests.
- `GuestShell`: paramiko with RejectPolicy and the guest's known_hosts, for tests that run shell commands.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from deploy_lib.remote import FabricRemote, SSHTarget
from sandbox import manage, wheelhouse

# the sim's pure parts are unit-tested from source; it has no dependencies
sys.path.insert(0, str(Path(manage.SANDBOX_DIR) / "sim"))


class GuestShell:
    """One SSH connection to a guest as `deploy`; host key checked against the guest's known_hosts."""

    def __init__(self, guest: manage.Guest) -> None:
        self.guest = guest
        self.client = paramiko.SSHClient()
        self.client.load_host_keys(str(guest.known_hosts))
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self.client.connect(guest.guest_ip, username=manage.GUEST_USER, key_filename=str(guest.key),
                            look_for_keys=False, allow_agent=False, timeout=10)

    def run(self, command: str, timeout_s: float = 60) -> tuple[int, str, str]:
        _, stdout, stderr = self.client.exec_command(command, timeout=timeout_s)
        out, err = stdout.read().decode(), stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err

    def sudo(self, command: str, timeout_s: float = 60) -> str:
        """Run as root; fail the test on a non-zero exit."""
        code, out, err = self.run(f"sudo -n sh -c {shlex.quote(command)}", timeout_s)
        assert code == 0, f"`{command}` exited {code}: {err}"
        return out

    def write(self, path: str, text: str) -> None:
        quoted = shlex.quote(path)
        self.sudo(f"mkdir -p $(dirname {quoted}) && printf %s {shlex.quote(text)} > {quoted}")

    def close(self) -> None:
        self.client.close()


@pytest.fixture(scope="session")
def wheelhouse_default() -> wheelhouse.Wheelhouse:
    return wheelhouse.prepare()


@pytest.fixture(scope="session")
def sim_venv(wheelhouse_default: wheelhouse.Wheelhouse, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv on this machine: real sglang + flashinfer (--no-deps), msgspec and the sim wheel."""
    return wheelhouse.build_local_venv(tmp_path_factory.mktemp("sim") / "venv", wheelhouse_default)


@pytest.fixture(scope="session")
def sandbox_guest() -> Iterator[manage.Guest]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox VM needs root (netns, overlay mount, systemd-nspawn)")
    name = f"pt{os.getpid()}"[:12]
    try:
        yield manage.up(name, record=False)
    finally:
        manage.down(name, record=False)


@pytest.fixture(scope="session")
def sandbox_ssh(sandbox_guest: manage.Guest) -> Iterator[FabricRemote]:
    remote = FabricRemote(SSHTarget(host=sandbox_guest.guest_ip, user=manage.GUEST_USER,
                                    key_file=sandbox_guest.key, known_hosts_file=sandbox_guest.known_hosts))
    yield remote
    remote.close()


@pytest.fixture(scope="session")
def sandbox_venv(sandbox_guest: manage.Guest, wheelhouse_default: wheelhouse.Wheelhouse) -> manage.Guest:
    """The guest once /opt/ml-env holds the wheelhouse (until the deploy engine builds venvs itself)."""
    manage.build_guest_venv(sandbox_guest, wheelhouse_default)
    return sandbox_guest


@pytest.fixture(scope="session")
def guest_shell(sandbox_guest: manage.Guest) -> Iterator[GuestShell]:
    shell = GuestShell(sandbox_guest)
    yield shell
    shell.close()
