"""SSH to a sandbox guest for tests: paramiko with RejectPolicy and the guest's own known_hosts."""

from __future__ import annotations

import shlex

import paramiko

from sandbox import manage


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

    def write(self, path: str, text: str | None) -> None:
        """`text` into `path` as root (None removes it): sandbox.manage.put_text, over its own ssh as root."""
        manage.put_text(self.guest, path, text)

    def close(self) -> None:
        self.client.close()
