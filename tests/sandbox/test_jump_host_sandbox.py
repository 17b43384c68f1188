"""A target reachable only through a jump host (a Proxmox VM behind its node), with two sandbox guests.

The fixture links the two guests' network namespaces with a veth pair of its own (10.214.0.0/16, a /30 per test
run) and takes the target's link to this machine down: the target then answers only at its address on that
link, which only the jump guest can reach. Both are removed when the module ends. The target boots over the
session's venv layer (/opt/ml-env, the simulated SGLang), so the last test deploys to it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import pytest
import yaml
from helpers.json_doc import envelope, result
from helpers.projects import REPO, project_for_guest
from tenacity import stop_after_attempt

from deploy_lib.deploy.project import resolve_target
from deploy_lib.errors import ConnectFailed, SudoPasswordRequired
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote import SSH_CONNECT, FabricRemote, JumpHost, Put, SSHTarget, Step
from deploy_lib.remote.ssh import SudoPassword
from sandbox import manage

pytestmark = pytest.mark.sandbox

LINK = "jump0"  # the veth end's name inside each guest's own namespace


@dataclass(frozen=True)
class JumpPair:
    jump: manage.Guest
    target: manage.Guest
    target_ip: str  # the target's address on the link between the two guests

    def key_line(self, guest: manage.Guest, name: str) -> str:
        """`name <type> <key>` for the host key the guest's sshd offers (testhost.sh writes it at start)."""
        kind, blob = guest.known_hosts.read_text().split()[1:3]
        return f"{name} {kind} {blob}\n"

    def fingerprint(self, guest: manage.Guest) -> str:
        return subprocess.run(["ssh-keygen", "-lf", str(guest.known_hosts)], check=True, capture_output=True,
                              text=True).stdout.split()[1]

    def ssh_target(self, known_hosts: Path, accept_new: bool = False) -> SSHTarget:
        return SSHTarget(host=self.target_ip, user=manage.GUEST_USER, key_files=(self.jump.key,),
                         known_hosts_file=known_hosts, accept_new_host_key=accept_new,
                         jump=JumpHost(self.jump.guest_ip, 22, manage.GUEST_USER))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def pair(venv_layer: Path) -> Iterator[JumpPair]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox VM needs root (netns, overlay mount, systemd-nspawn)")
    names = (f"ja{os.getpid()}"[:12], f"jt{os.getpid()}"[:12])
    base = (os.getpid() % 16384) * 4
    jump_ip, target_ip = (f"10.214.{base // 256}.{base % 256 + end}" for end in (1, 2))
    try:
        jump, target = manage.up(names[0], record=False), manage.up(names[1], record=False, layers=(venv_layer,))
        _ip("link", "add", LINK, "netns", jump.netns, "type", "veth", "peer", "name", LINK, "netns", target.netns)
        for guest, address in ((jump, jump_ip), (target, target_ip)):
            _ip("-n", guest.netns, "addr", "add", f"{address}/30", "dev", LINK)
            _ip("-n", guest.netns, "link", "set", LINK, "up")
        _ip("-n", target.netns, "link", "set", "host0", "down")  # this machine's own way to the target
        yield JumpPair(jump, target, target_ip)
    finally:
        for name in names:
            manage.down(name, record=False)  # deleting a namespace deletes its end of the link, and the pair


def test_inventory_proxyjump_reaches_the_target_through_the_jump_host(pair: JumpPair, tmp_path: Path) -> None:
    """Input tried: `ansible_ssh_common_args: -o ProxyJump=deploy@<jump>` as an Ansible inventory writes it."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.jump, pair.jump.guest_ip) + pair.key_line(pair.target, pair.target_ip))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        f"all:\n  hosts:\n    vm:\n      ansible_host: {pair.target_ip}\n      ansible_user: {manage.GUEST_USER}\n"
        f"      ansible_ssh_private_key_file: {pair.jump.key}\n      known_hosts_file: {known_hosts}\n"
        f"      ansible_ssh_common_args: '-o ProxyJump={manage.GUEST_USER}@{pair.jump.guest_ip}'\n")
    target = resolve_target(load_inventory(inventory), "vm")
    with FabricRemote(target.ssh) as remote:
        name, = remote.run([Step("hostname", ("cat", "/etc/hostname"))])
        remote.run([Put(PurePosixPath("/etc/sglang-deploy-jump.txt"), b"through the node\n", 0o640, sudo=True)])
        written, = remote.run([Step("read back", ("stat", "-c", "%a %U", "/etc/sglang-deploy-jump.txt"),
                                    sudo=True)])
    assert name.stdout.strip() == pair.target.name
    assert written.stdout.split() == ["640", "root"]


def test_ssh_config_host_aliases_reach_the_target_through_the_jump_host(pair: JumpPair, tmp_path: Path) -> None:
    """Input tried: an inventory naming only the alias `vm` (and the ssh config file), an ssh config the test writes
    with `Host vm` (HostName, User, IdentityFile, UserKnownHostsFile, ProxyJump node) and `Host node` for the jump
    host; both the paramiko connection and rsync's ssh (a directory pushed) reach the target."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.jump, pair.jump.guest_ip) + pair.key_line(pair.target, pair.target_ip))
    (tmp_path / "ssh_config").write_text(
        f"Host node\n  HostName {pair.jump.guest_ip}\n  User {manage.GUEST_USER}\n\n"
        f"Host vm\n  HostName {pair.target_ip}\n  User {manage.GUEST_USER}\n  ProxyJump node\n"
        f"  IdentityFile {pair.jump.key}\n  UserKnownHostsFile {known_hosts}\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    vm: {ssh_config_file: ssh_config}\n")
    target = resolve_target(load_inventory(inventory), "vm")
    assert target.ssh.jump == JumpHost(pair.jump.guest_ip, 22, manage.GUEST_USER)
    pushed = tmp_path / "pushed"
    pushed.mkdir()
    (pushed / "a.txt").write_text("by rsync through the node\n")
    with FabricRemote(target.ssh) as remote:
        name, = remote.run([Step("hostname", ("cat", "/etc/hostname"))])
        remote.push_directory(pushed, PurePosixPath("/srv/sglang-deploy-alias"), None)
        copied, = remote.run([Step("read back", ("cat", "/srv/sglang-deploy-alias/a.txt"), sudo=True)])
    assert name.stdout.strip() == pair.target.name
    assert copied.stdout == "by rsync through the node\n"


def test_the_target_is_not_reachable_without_the_jump_host(pair: JumpPair, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.target, pair.target_ip) + pair.key_line(pair.target,
                                                                                      pair.target.guest_ip))
    once = SSH_CONNECT.copy(sleep=lambda _: None, stop=stop_after_attempt(1))
    for address in (pair.target_ip, pair.target.guest_ip):
        direct = SSHTarget(host=address, user=manage.GUEST_USER, key_files=(pair.jump.key,),
                           known_hosts_file=known_hosts, connect_timeout_s=3)
        with pytest.raises(ConnectFailed, match="cannot connect"), FabricRemote(direct, once) as remote:
            remote.run([Step("probe", ("true",))])


def test_unknown_target_key_behind_the_jump_host_is_refused_with_its_fingerprint(pair: JumpPair,
                                                                                  tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.jump, pair.jump.guest_ip))
    with pytest.raises(ConnectFailed) as refused, FabricRemote(pair.ssh_target(known_hosts)) as remote:
        remote.run([Step("probe", ("true",))])
    assert f"host key of host {pair.target_ip} via jump host" in refused.value.message
    assert pair.fingerprint(pair.target) in refused.value.message
    assert known_hosts.read_text() == pair.key_line(pair.jump, pair.jump.guest_ip)


def test_unknown_jump_host_key_is_refused_with_its_fingerprint(pair: JumpPair, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.target, pair.target_ip))
    with pytest.raises(ConnectFailed) as refused, FabricRemote(pair.ssh_target(known_hosts)) as remote:
        remote.run([Step("probe", ("true",))])
    assert f"host key of jump host {pair.jump.guest_ip} is not in" in refused.value.message
    assert pair.fingerprint(pair.jump) in refused.value.message


def test_changed_key_on_either_hop_is_refused_even_with_opt_in(pair: JumpPair, tmp_path: Path) -> None:
    """Input tried: known_hosts holding the other guest's key for the jump host, then for the target."""
    cases = {"jump host": pair.key_line(pair.target, pair.jump.guest_ip) + pair.key_line(pair.target, pair.target_ip),
             "host": pair.key_line(pair.jump, pair.jump.guest_ip) + pair.key_line(pair.jump, pair.target_ip)}
    for what, text in cases.items():
        known_hosts = tmp_path / f"known_hosts-{what.replace(' ', '-')}"
        known_hosts.write_text(text)
        with (pytest.raises(ConnectFailed) as refused,
              FabricRemote(pair.ssh_target(known_hosts, accept_new=True)) as remote):
            remote.run([Step("probe", ("true",))])
        assert f"host key of {what} " in refused.value.message and "CHANGED" in refused.value.message
        assert pair.fingerprint(pair.jump) in refused.value.message
        assert pair.fingerprint(pair.target) in refused.value.message
        assert known_hosts.read_text() == text


def test_opt_in_records_each_hops_key_once(pair: JumpPair, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    with FabricRemote(pair.ssh_target(known_hosts, accept_new=True)) as remote:
        remote.run([Step("probe", ("true",))])
    with FabricRemote(pair.ssh_target(known_hosts)) as remote:
        name, = remote.run([Step("hostname", ("cat", "/etc/hostname"))])
    assert name.stdout.strip() == pair.target.name
    assert known_hosts.read_text() == (pair.key_line(pair.jump, pair.jump.guest_ip)
                                       + pair.key_line(pair.target, pair.target_ip))


RELAY = REPO / "tests" / "helpers" / "stdio_relay.py"
SUDO_PASSWORD = "Tr0ub4dor &3 'x' $HOME"  # a space and shell characters: quoted nowhere, it travels on stdin


def _invoke(project: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEPLOY_")} | env
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv, "--json"], cwd=project,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=environ, timeout=1200)


def test_a_deploy_through_a_proxycommand_and_a_second_hop_with_a_sudo_password_ends_verified(
        pair: JumpPair, tmp_path: Path) -> None:
    """Issue 40's done-when. Input tried: the inventory's `ansible_ssh_common_args: -J node`, where the ssh config's
    `Host node` (the jump guest) is reached through a ProxyCommand, a relay (as a bastion behind SSM or
    cloudflared): two hops, the relay's to the jump guest and the jump guest's to the target, for the connection and
    for rsync. The target's sudoers rule asks deploy for a password (no NOPASSWD), and the inventory's
    `become_password: {env: ...}` gives it. A wrong one is refused first, nothing changed."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pair.key_line(pair.jump, pair.jump.guest_ip) + pair.key_line(pair.target, pair.target_ip))
    with FabricRemote(pair.ssh_target(known_hosts)) as remote:  # still passwordless: the guest's image grants it
        remote.run([Step("set deploy's password", ("chpasswd",), sudo=True,
                         stdin=f"{manage.GUEST_USER}:{SUDO_PASSWORD}\n".encode(), secret=True),
                    Put(PurePosixPath(f"/etc/sudoers.d/{manage.GUEST_USER}"), f"{manage.GUEST_USER} ALL=(ALL) ALL\n"
                        .encode(), 0o440, sudo=True)])
        with pytest.raises(SudoPasswordRequired):
            remote.run([Step("sudo -n now", ("true",), sudo=True)])
    _ip("-n", pair.target.netns, "link", "set", "host0", "up")  # the target's way to the model hub on this machine
    record = tmp_path / "relayed"
    (tmp_path / "ssh_config").write_text(
        f"Host node\n  HostName {pair.jump.guest_ip}\n  User {manage.GUEST_USER}\n"
        f"  ProxyCommand {shlex.join([sys.executable, str(RELAY), '%h', '%p', str(record)])}\n")
    project, inventory = project_for_guest(tmp_path / "project", pair.target, {})
    written = yaml.safe_load(Path(inventory).read_text())
    written["all"]["children"]["sandbox"]["hosts"] = {"vm": {
        "ansible_host": pair.target_ip, "known_hosts_file": str(known_hosts),
        "ssh_config_file": str(tmp_path / "ssh_config"), "hf_endpoint": pair.target.hub.endpoint,
        "become_password": {"env": "VM_SUDO_PASSWORD"}, "ansible_ssh_common_args": "-J node"}}
    Path(inventory).write_text(yaml.safe_dump(written))
    deploy = ("deploy", "--profile", "glm5-nvfp4", "--inventory", inventory, "--host", "vm", "--yes")
    try:
        wrong = _invoke(project.root, *deploy, env={"VM_SUDO_PASSWORD": "not the password"})
        assert wrong.returncode == 2, wrong.stderr[-3000:]
        assert "refused the password of deploy from" in wrong.stderr and "become_password" in wrong.stderr
        assert envelope(wrong.stdout, 2)["outcome"] == "failed"

        deployed = _invoke(project.root, *deploy, env={"VM_SUDO_PASSWORD": SUDO_PASSWORD})
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        outcome = result(envelope(deployed.stdout, 0))
        assert outcome["outcome"] == "deployed", outcome
        for shown in (wrong.stdout, wrong.stderr, deployed.stdout, deployed.stderr):
            assert "Tr0ub4dor" not in shown
        assert set(record.read_text().splitlines()) == {f"{pair.jump.guest_ip} 22"}

        target = resolve_target(load_inventory(Path(inventory)), "vm")
        assert target.ssh.jump is not None and target.ssh.jump.proxy_command is not None  # node, by its ProxyCommand
        with_password = replace(target.ssh, sudo_password=SudoPassword(SUDO_PASSWORD, "the test"))
        pushed = tmp_path / "pushed"
        pushed.mkdir()
        (pushed / "a.txt").write_text("by rsync, sudo with a password\n")
        with FabricRemote(with_password) as remote:
            remote.push_directory(pushed, PurePosixPath("/srv/sglang-deploy-sudo-password"), None)
            copied, serving, store = remote.run([
                Step("read back", ("stat", "-c", "%U %n", "/srv/sglang-deploy-sudo-password/a.txt"), sudo=True),
                Step("current", ("readlink", "/opt/sglang-deploy/sglang/current"), sudo=True),
                Step("the password in the store", ("grep", "-rlF", "Tr0ub4dor", "/opt/sglang-deploy", "/tmp",
                                                   "/var/tmp", "/home"), sudo=True, ok=frozenset({1}))])
        assert copied.stdout.split() == ["root", "/srv/sglang-deploy-sudo-password/a.txt"]
        assert serving.stdout.strip() == f"releases/{outcome['release']}"
        assert store.stdout == ""
    finally:
        _ip("-n", pair.target.netns, "link", "set", "host0", "down")
