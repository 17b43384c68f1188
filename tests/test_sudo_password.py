"""A sudo password where the host's sudoers rule is not NOPASSWD: where the inventory gives it from (never in clear),
how rsync's far side gets it (a relay ahead of rsync's own stream, never an argument), and what is refused. The
batch script's part runs through a real sudo in test_remote_sudo.py; a deploy with one, in
tests/sandbox/test_jump_host_sandbox.py."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from helpers.cli import sglang_deploy

from deploy_lib.deploy.project import resolve_target, with_sudo_password
from deploy_lib.errors import ConfigError
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote.batch import SUDO_PASSWORD_END
from deploy_lib.remote.ssh import SUDO_PASSWORD_ENV, SSHTarget, SudoPassword, rsync_argv, rsync_env

PASSWORD = "hunter2 'x' $HOME"


def _inventory(tmp_path: Path, host_vars: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.10\n      ansible_user: deploy\n"
                    f"{host_vars}")
    return path


def _never_typed() -> SudoPassword:
    raise AssertionError("nothing is typed for a password from a secret source")


@pytest.mark.parametrize("written", ["ansible_become_password: s3cr3t-pw", "ansible_become_pass: s3cr3t-pw",
                                     "become_password: s3cr3t-pw"])
def test_a_sudo_password_in_clear_in_the_inventory_is_refused_naming_the_file_and_key(tmp_path: Path,
                                                                                       written: str) -> None:
    """Input tried: Ansible's become password vars, and our own key with a plain value, in group_vars/all.yml."""
    _inventory(tmp_path, "")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(written + "\n")
    with pytest.raises(ConfigError) as refused:
        load_inventory(tmp_path / "hosts.yaml")
    key = written.split(":")[0]
    assert f"group_vars/all.yml: host gpu1: {key}" in refused.value.message
    assert "become_password: ask" in refused.value.message and "{env: VAR}" in refused.value.message
    assert "s3cr3t-pw" not in str(refused.value)


def test_a_password_from_the_environment_reaches_the_target_and_is_never_shown(tmp_path: Path) -> None:
    target = resolve_target(load_inventory(_inventory(tmp_path, "      become_password: {env: GPU_SUDO}\n")), "gpu1")
    ssh = with_sudo_password(target, {"GPU_SUDO": PASSWORD}, _never_typed)
    assert ssh.password_for_sudo is not None and ssh.password_for_sudo.value == PASSWORD
    assert "become_password" in ssh.password_for_sudo.source
    assert PASSWORD not in repr(ssh) and "hunter2" not in repr(ssh)
    assert replace(ssh, user="root").password_for_sudo is None  # root runs its steps without sudo


def test_a_password_source_that_gives_nothing_is_refused_naming_the_inventory_key(tmp_path: Path) -> None:
    target = resolve_target(load_inventory(_inventory(tmp_path, "      become_password: {env: GPU_SUDO}\n")), "gpu1")
    with pytest.raises(ConfigError, match=r"hosts.yaml: host gpu1: become_password: environment variable GPU_SUDO "
                                          r"is not set"):
        with_sudo_password(target, {}, _never_typed)


def test_ask_takes_the_password_typed_once(tmp_path: Path) -> None:
    typed = []

    def at_the_terminal() -> SudoPassword:
        typed.append(1)
        return SudoPassword(PASSWORD, "the terminal")
    inventory = load_inventory(_inventory(tmp_path, "      become_password: ask\n"))
    ssh = with_sudo_password(resolve_target(inventory, "gpu1"), {}, at_the_terminal)
    assert ssh.sudo_password == SudoPassword(PASSWORD, "the terminal") and typed == [1]


def test_ask_without_a_terminal_is_refused_before_any_connection(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: `status` (no terminal: pytest's stdin) for a host whose inventory says `become_password: ask`;
    its address is TEST-NET, so a connection would fail otherwise."""
    monkeypatch.chdir(tmp_path)
    inventory = _inventory(tmp_path, "      become_password: ask\n")
    code, _, err = sglang_deploy(f"status --inventory {inventory}", capsys)
    assert code == 2
    assert "become_password: ask: stdin is not a terminal" in err and "{env: VAR}" in err


@pytest.mark.parametrize("value", ["", "two\nlines", "car\rriage", "nul\x00"])
def test_a_password_sudo_cannot_read_whole_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="empty or has a newline"):
        SudoPassword(value, "$GPU_SUDO")


def test_rsync_gets_the_password_through_its_relay_never_as_an_argument(tmp_path: Path) -> None:
    """The relay is run here as rsync would run it, with `cat` for ssh: what reaches the far side is the password,
    the end line, then rsync's own stream; the variable it came in is gone before ssh starts."""
    target = SSHTarget(host="192.0.2.10", user="deploy", sudo_password=SudoPassword(PASSWORD, "$GPU_SUDO"))
    argv = rsync_argv(target, tmp_path, PurePosixPath("/srv/m"), None)
    assert not any("hunter2" in arg for arg in argv)
    far_side = shlex.split(argv[argv.index("--rsync-path") + 1])
    assert far_side[:5] == ["sudo", "-S", "-p", "", "--"] and far_side[-1] == "rsync"
    relay = shlex.split(argv[argv.index("-e") + 1])
    assert relay[:2] == ["bash", "-c"] and relay[4] == "ssh"
    environ = rsync_env(target, {"PATH": "/usr/bin:/bin"})
    stream = subprocess.run([*relay[:4], "sh", "-c", f"cat; env | grep -c {SUDO_PASSWORD_ENV} || true"],
                            input=b"rsync protocol bytes", env=environ, capture_output=True, timeout=30, check=True)
    assert stream.stdout == f"{PASSWORD}\n{SUDO_PASSWORD_END}\nrsync protocol bytes0\n".encode()
    # the far side ended (rsync's stream still open, as rsync keeps it until its remote shell exits): the relay ends
    far_side_done = subprocess.Popen([*relay[:4], "head", "-n", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=environ)
    try:
        assert far_side_done.wait(timeout=30) == 0  # it hung here, waiting on a `cat` that waited on rsync
        assert far_side_done.stdout is not None and far_side_done.stdin is not None
        assert far_side_done.stdout.read() == f"{PASSWORD}\n{SUDO_PASSWORD_END}\n".encode()
    finally:
        far_side_done.kill()
        far_side_done.communicate()
    without = replace(target, sudo_password=None)
    assert rsync_env(without, {"PATH": "/bin"}) == {"PATH": "/bin"}
    plain = rsync_argv(without, tmp_path, PurePosixPath("/srv/m"), None)
    assert plain[plain.index("--rsync-path") + 1] == "sudo -n rsync"
