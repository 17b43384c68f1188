"""The user's OpenSSH config (~/.ssh/config, or the one the inventory or $SGLANG_DEPLOY_SSH_CONFIG names) as the
inventory's defaults: what it resolves to, what it refuses, and connections through a Host alias to a real sshd on
127.0.0.1 (the fixture of test_remote_ssh.py)."""

from __future__ import annotations

import getpass
import json
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
from helpers.remote_ssh import SshServer

from deploy_lib.deploy.project import resolve_target
from deploy_lib.errors import ConfigError, ConnectFailed
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote import FabricRemote, JumpHost, SSHTarget, Step
from deploy_lib.remote.ssh import keys_needing_passphrase, rsync_argv, unlocked_with
from deploy_lib.remote.ssh_config import SSH_CONFIG_ENV

CONFIG = """\
Host bastion
  HostName 198.51.100.7
  User hop
  Port 2022
  IdentityFile ~/keys/bastion
Host gpu*
  HostName 192.0.2.%h
  User alice
  Port 2200
  IdentityFile ~/keys/one
  IdentityFile /abs/two
  ProxyJump bastion
  UserKnownHostsFile /etc/ssh/gpu_known_hosts ~/.ssh/other
Host strict
  IdentitiesOnly yes
  IdentityFile /abs/only
"""


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own: the default ~/.ssh/config is the test's, never the developer's."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(SSH_CONFIG_ENV, raising=False)
    return home


def _target(tmp_path: Path, host_vars: str, host: str = "gpu1", config: str | None = CONFIG,
            config_name: str = "ssh_config") -> SSHTarget:
    if config is not None:
        (tmp_path / config_name).write_text(config)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    {host}: {{{host_vars}}}\n")
    return resolve_target(load_inventory(inventory), host).ssh


def test_a_host_alias_takes_hostname_user_port_keys_jump_and_known_hosts_from_the_config(
        tmp_path: Path, _home: Path) -> None:
    """Input tried: an inventory host with no connection vars but `ssh_config_file`, matched by `Host gpu*`."""
    ssh = _target(tmp_path, "ssh_config_file: ssh_config")
    assert (ssh.host, ssh.user, ssh.port) == ("192.0.2.gpu1", "alice", 2200)
    # the jump host's own IdentityFile is offered too; its HostName, User and Port are its Host block's
    assert ssh.key_files == (_home / "keys/one", Path("/abs/two"), _home / "keys/bastion")
    assert ssh.jump == JumpHost("198.51.100.7", 2022, "hop")
    assert ssh.known_hosts_file == Path("/etc/ssh/gpu_known_hosts")
    assert not ssh.identities_only


def test_the_hosts_address_is_the_configs_hostname_for_endpoints_and_multi_node(tmp_path: Path) -> None:
    """Input tried: host `gpu1` known only by its ssh config HostName (the address a router, a status endpoint and a
    multi-node release's dist-init address use), and `gpu2` with ansible_host, which is looked up instead."""
    (tmp_path / "ssh_config").write_text("Host gpu1\n  HostName 192.0.2.41\nHost edge\n  HostName 192.0.2.42\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  vars: {ssh_config_file: ssh_config}\n  hosts:\n    gpu1: {}\n"
                         "    gpu2: {ansible_host: edge}\n    gpu3: {}\n")
    loaded = load_inventory(inventory)
    assert [loaded.host(name).address for name in ("gpu1", "gpu2", "gpu3")] == ["192.0.2.41", "192.0.2.42", "gpu3"]


def test_inventory_vars_win_over_the_config(tmp_path: Path) -> None:
    """Input tried: every connection var set in the inventory, `proxy_jump: none` against the config's ProxyJump."""
    ssh = _target(tmp_path, "ssh_config_file: ssh_config, ansible_host: gpu7, ansible_user: bob, ansible_port: 22,"
                            " ansible_ssh_private_key_file: k/id, known_hosts_file: kh, proxy_jump: none")
    assert (ssh.host, ssh.user, ssh.port, ssh.jump) == ("192.0.2.gpu7", "bob", 22, None)  # ansible_host is the alias
    assert ssh.key_files == (tmp_path / "k/id",) and ssh.known_hosts_file == tmp_path / "kh"
    jumped = _target(tmp_path, "ssh_config_file: ssh_config, proxy_jump: 'carol@bastion:2023'")
    assert jumped.jump == JumpHost("198.51.100.7", 2023, "carol")


def test_without_user_anywhere_the_login_is_the_local_user_as_in_ansible(tmp_path: Path) -> None:
    ssh = _target(tmp_path, "ansible_host: 192.0.2.5", host="plain", config=None)
    assert (ssh.user, ssh.port, ssh.key_files, ssh.jump) == (getpass.getuser(), 22, (), None)
    assert ssh.known_hosts_file == Path("~/.ssh/known_hosts")


def test_the_default_is_home_ssh_config_the_env_var_points_elsewhere_or_turns_it_off(
        tmp_path: Path, _home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (_home / ".ssh/config").write_text("Host gpu1\n  User fromhome\n")
    assert _target(tmp_path, "", config=None).user == "fromhome"
    (tmp_path / "elsewhere").write_text("Host gpu1\n  User fromenv\n")
    monkeypatch.setenv(SSH_CONFIG_ENV, str(tmp_path / "elsewhere"))
    assert _target(tmp_path, "", config=None).user == "fromenv"
    monkeypatch.setenv(SSH_CONFIG_ENV, "none")
    assert _target(tmp_path, "", config=None).user == getpass.getuser()
    assert _target(tmp_path, "ssh_config_file: elsewhere", config=None).user == "fromenv"  # the inventory wins


def test_include_is_read_relative_to_home_ssh(tmp_path: Path, _home: Path) -> None:
    """Input tried: `Include conf.d/*` (paramiko alone skips Include) with two files, read in name order."""
    (_home / ".ssh/conf.d").mkdir()
    (_home / ".ssh/conf.d/10-gpu").write_text("Host gpu1\n  Port 2301\n")
    (_home / ".ssh/conf.d/20-all").write_text("Host *\n  Port 2302\n  User everyone\n")
    (_home / ".ssh/config").write_text("Include conf.d/*\n")
    ssh = _target(tmp_path, "", config=None)
    assert (ssh.port, ssh.user) == (2301, "everyone")


def test_a_proxyjump_for_every_host_does_not_make_the_jump_host_its_own_jump(tmp_path: Path) -> None:
    """Input tried: `Host *` with `ProxyJump bastion`, as people write it, which names bastion itself too."""
    ssh = _target(tmp_path, "ssh_config_file: ssh_config",
                  config="Host bastion\n  HostName 198.51.100.7\nHost *\n  ProxyJump bastion\n")
    assert ssh.jump == JumpHost("198.51.100.7", 22, getpass.getuser())


def test_identities_only_turns_the_agent_off(tmp_path: Path) -> None:
    ssh = _target(tmp_path, "ssh_config_file: ssh_config", host="strict")
    assert ssh.identities_only and ssh.key_files == (Path("/abs/only"),)


@pytest.mark.parametrize(("config", "expected"), [
    ("Host gpu1\n  HostName 1.2.3.4 -oProxyCommand=touch/tmp/x\n", "Host gpu1: HostName '1.2.3.4 -oProxyCommand"),
    ("Host gpu1\n  HostName -oBatchMode\n", "Host gpu1: HostName '-oBatchMode' is not a host name"),
    ("Host gpu1\n  User root;reboot\n", "Host gpu1: User 'root;reboot' is not a login name"),
    ("Host gpu1\n  Port 22 -oX\n", "Host gpu1: Port '22 -oX' is not in 1-65535"),
    ("Host gpu1\n  Port 0\n", "Host gpu1: Port '0' is not in 1-65535"),
    ("Host gpu1\n  ProxyCommand nc %h %p\n  ProxyJump j\n", "Host gpu1: both ProxyJump and ProxyCommand apply"),
    ("Host gpu1\n  RemoteCommand sh\n", "Host gpu1: remotecommand cannot be honoured"),
    ("Host gpu1\n  ProxyJump j\nHost j\n  ProxyJump k\nHost k\n  ProxyJump j\n",
     "Host j: ProxyJump 'k' makes a loop: gpu1 -> j -> k -> j"),
    ("Host gpu1\n  ProxyJump a,,b\n", "'' is not a jump host"),
    ("Host gpu1\n  ProxyJump 'x;y'\n", "is not a jump host"),
    ("Include loop\n", "Include nested more than 16 deep"),
])
def test_a_value_that_cannot_be_honoured_is_refused_naming_file_host_and_key(
        tmp_path: Path, config: str, expected: str) -> None:
    """Input tried: each hostile or unsupported ssh config value in turn (a loop: a file that includes itself)."""
    config = config.replace("Include loop", f"Include {tmp_path / 'ssh_config'}")
    with pytest.raises(ConfigError) as refused:
        _target(tmp_path, "ssh_config_file: ssh_config", config=config)
    assert expected in str(refused.value) and str(tmp_path / "ssh_config") in str(refused.value)


def test_a_missing_ssh_config_file_is_refused_naming_the_inventory_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hosts.yaml: ssh_config_file: .*absent is not a file"):
        _target(tmp_path, "ssh_config_file: absent", config=None)


def _alias_config(tmp_path: Path, server: SshServer, key: Path, extra: str = "") -> None:
    (tmp_path / "ssh_config").write_text(f"Host lab\n  HostName 127.0.0.1\n  Port {server.port}\n"
                                         f"  User {getpass.getuser()}\n  IdentityFile {key}\n{extra}")


def _known_hosts(tmp_path: Path, server: SshServer) -> Path:
    kind, blob = server.host_public_key.read_text().split()[:2]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{server.port} {kind} {blob}\n")
    return tmp_path / "known_hosts"


def test_a_host_alias_of_the_ssh_config_reaches_the_server(sshd: SshServer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: an inventory naming only `lab`, whose address, port, user and key are the ssh config's."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    _alias_config(tmp_path, sshd, sshd.client_key)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    lab: {{ssh_config_file: ssh_config, known_hosts_file: "
                         f"{_known_hosts(tmp_path, sshd)}}}\n")
    with FabricRemote(resolve_target(load_inventory(inventory), "lab").ssh) as remote:
        assert remote.run([Step("who", ("id", "-un"))])[0].stdout == f"{getpass.getuser()}\n"


def _encrypted_copy(server: SshServer, tmp_path: Path) -> Path:
    key = tmp_path / "encrypted"
    key.write_bytes(server.client_key.read_bytes())
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-N", "s3cret pass", "-P", "", "-f", str(key)], check=True)
    return key


def test_an_encrypted_key_without_an_agent_is_refused_saying_to_load_it(sshd: SshServer, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: IdentityFile a passphrase-protected copy of the authorised key, no ssh agent."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = _encrypted_copy(sshd, tmp_path)
    target = SSHTarget(host="127.0.0.1", port=sshd.port, user=getpass.getuser(), key_files=(key,),
                       known_hosts_file=_known_hosts(tmp_path, sshd), connect_timeout_s=5)
    with pytest.raises(ConnectFailed) as refused, FabricRemote(target) as remote:
        remote.run([Step("probe", ("true",))])
    assert "is encrypted" in refused.value.message and f"ssh-add {key}" in (refused.value.hint or "")


@contextmanager
def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An empty ssh-agent of the test's own, as SSH_AUTH_SOCK; stopped by its PID at the end."""
    socket_path = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if socket_path.exists():
                break
            time.sleep(0.05)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        yield
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)


def test_with_a_key_file_set_the_agents_keys_are_still_offered(sshd: SshServer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: the encrypted key file in the inventory and the same key loaded in an ssh-agent this test starts
    (before, a key file turned the agent off and the connection failed)."""
    key = _encrypted_copy(sshd, tmp_path)
    with _agent(tmp_path, monkeypatch):
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], check=True)
        _alias_config(tmp_path, sshd, key)
        inventory = tmp_path / "hosts.yaml"
        inventory.write_text(f"all:\n  hosts:\n    lab: {{ssh_config_file: ssh_config, ansible_ssh_private_key_file: "
                             f"{key}, known_hosts_file: {_known_hosts(tmp_path, sshd)}}}\n")
        with FabricRemote(resolve_target(load_inventory(inventory), "lab").ssh) as remote:
            assert remote.run([Step("probe", ("echo", "via agent"))])[0].stdout == "via agent\n"
        _alias_config(tmp_path, sshd, key, extra="  IdentitiesOnly yes\n")  # OpenSSH's way to turn the agent off
        with pytest.raises(ConnectFailed, match="is encrypted"), \
                FabricRemote(resolve_target(load_inventory(inventory), "lab").ssh) as remote:
            remote.run([Step("probe", ("true",))])


def test_a_passphrase_given_unlocks_an_encrypted_key_with_no_agent(sshd: SshServer, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: the encrypted key file, no ssh agent: the key is the one a passphrase prompt asks for, and the
    passphrase typed (the CLI asks, at a terminal) opens the connection; a wrong one is refused naming the key."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = _encrypted_copy(sshd, tmp_path)
    target = SSHTarget(host="127.0.0.1", port=sshd.port, user=getpass.getuser(), key_files=(key,),
                       known_hosts_file=_known_hosts(tmp_path, sshd), connect_timeout_s=5)
    assert keys_needing_passphrase(target) == (key,)
    assert keys_needing_passphrase(replace(target, key_files=(sshd.client_key,))) == ()
    unlocked = unlocked_with(target, (key,), "s3cret pass")
    assert "s3cret" not in repr(unlocked)
    with FabricRemote(unlocked) as remote:
        assert remote.run([Step("probe", ("echo", "unlocked"))])[0].stdout == "unlocked\n"
    with pytest.raises(ConfigError, match=f"does not unlock the key file {key}"):
        unlocked_with(target, (key,), "not it")


def test_no_passphrase_is_asked_for_a_key_the_agent_holds(sshd: SshServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: the encrypted key with its public half beside it, loaded in an ssh-agent this test starts; then
    IdentitiesOnly, which keeps the agent out."""
    key = _encrypted_copy(sshd, tmp_path)
    key.with_name(key.name + ".pub").write_text(Path(f"{sshd.client_key}.pub").read_text())
    with _agent(tmp_path, monkeypatch):
        target = SSHTarget(host="127.0.0.1", key_files=(key,))
        assert keys_needing_passphrase(target) == (key,)  # an empty agent
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], check=True)
        assert keys_needing_passphrase(target) == ()
        assert keys_needing_passphrase(replace(target, identities_only=True)) == (key,)


RELAY = Path(__file__).parent / "helpers" / "stdio_relay.py"


def _relay(record: Path, *address: str) -> str:
    return shlex.join([sys.executable, str(RELAY), *address, str(record)])


def test_a_proxycommand_in_the_ssh_config_carries_the_connection(sshd: SshServer, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: `ProxyCommand <relay> %h %p` for the host, as a bastion behind SSM, Teleport or cloudflared is
    reached (it was refused: `proxycommand cannot be honoured`)."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    record = tmp_path / "relayed"
    _alias_config(tmp_path, sshd, sshd.client_key, f"  ProxyCommand {_relay(record, '%h', '%p')}\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    lab: {{ssh_config_file: ssh_config, known_hosts_file: "
                         f"{_known_hosts(tmp_path, sshd)}}}\n")
    target = resolve_target(load_inventory(inventory), "lab").ssh
    with FabricRemote(target) as remote:
        assert remote.run([Step("who", ("id", "-un"))])[0].stdout == f"{getpass.getuser()}\n"
    assert record.read_text() == f"127.0.0.1 {sshd.port}\n"
    assert "via ProxyCommand" in target.address


def _run_and_push(target: SSHTarget, tmp_path: Path) -> None:
    """A step runs and an rsync push lands, over `target`'s way to the host."""
    local = tmp_path / "weights"
    local.mkdir()
    (local / "config.json").write_text("{}")
    with FabricRemote(target) as remote:
        assert remote.run([Step("echo", ("echo", "through"))])[0].stdout == "through\n"
        remote.push_directory(local, PurePosixPath(tmp_path / "pushed"), None)
    assert (tmp_path / "pushed" / "config.json").read_text() == "{}"


def test_a_proxycommand_in_ansible_ssh_common_args_expands_its_tokens_and_carries_steps_and_pushes(
        sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: `ansible_ssh_common_args: -o ProxyCommand="<relay> %h %p"`, as Ansible users write it; rsync's
    ssh (a push of weights) goes through the same command."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    record = tmp_path / "relayed"
    args = shlex.join(["-o", f"ProxyCommand={_relay(record, '%h', '%p')}"])
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    lab:\n      ansible_host: 127.0.0.1\n      ansible_port: {sshd.port}\n"
                         f"      ansible_user: {getpass.getuser()}\n"
                         f"      ansible_ssh_private_key_file: {sshd.client_key}\n"
                         f"      known_hosts_file: {_known_hosts(tmp_path, sshd)}\n"
                         f"      ssh_config_file: none\n      ansible_ssh_common_args: {json.dumps(args)}\n")
    target = resolve_target(load_inventory(inventory), "lab").ssh
    assert target.proxy_command == _relay(record, "127.0.0.1", str(sshd.port))
    _run_and_push(target, tmp_path)
    assert record.read_text().splitlines() == [f"127.0.0.1 {sshd.port}"] * 2  # the connection, then rsync's ssh


def test_a_proxycommand_that_fails_is_reported_naming_it(tmp_path: Path) -> None:
    target = SSHTarget(host="192.0.2.1", port=22, user="deploy", proxy_command="exit 3", connect_timeout_s=5,
                       known_hosts_file=tmp_path / "known_hosts")
    with pytest.raises(ConnectFailed) as refused, FabricRemote(target) as remote:
        remote.run([Step("probe", ("true",))])
    assert "through its ProxyCommand 'exit 3'" in refused.value.message
    assert "run the command yourself" in (refused.value.hint or "")


@pytest.mark.parametrize(("host_vars", "expected"), [
    ("ansible_ssh_common_args: '-o ProxyCommand=\"nc %h %p\" -J root@pve1'", "both ProxyJump and ProxyCommand"),
    ("proxy_jump: root@pve1, ansible_ssh_common_args: '-o ProxyCommand=\"nc %h %p\"'",
     "a jump host (proxy_jump) and a ProxyCommand (ansible_ssh_common_args) are both given"),
    ("ansible_ssh_common_args: '-o ProxyCommand=\"nc %h %C\"'", "%C cannot be expanded here"),
    ("ansible_ssh_common_args: '-o User=x'", "cannot be honoured"),
])
def test_a_way_to_the_host_that_cannot_hold_is_refused_naming_the_key(tmp_path: Path, host_vars: str,
                                                                      expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _target(tmp_path, f"{host_vars}, ssh_config_file: none", config=None)
    assert expected in str(refused.value), str(refused.value)


def test_rsyncs_ssh_runs_the_same_proxycommand_with_a_literal_percent_kept(tmp_path: Path) -> None:
    target = SSHTarget(host="10.0.0.5", proxy_command="connect --tag 50% 10.0.0.5 22")
    argv = rsync_argv(target, tmp_path, PurePosixPath("/opt/x"), None)
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert "ProxyCommand=connect --tag 50%% 10.0.0.5 22" in ssh


def test_a_chain_of_jump_hosts_the_first_behind_its_proxycommand_carries_steps_and_pushes(
        sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: `ProxyJump bastion,inner` for the host in the ssh config, bastion reached through its own
    ProxyCommand (a relay, as SSM or cloudflared): three hops, each the same sshd under another name, each hop's
    host key checked; rsync's ssh nests them as ProxyCommands, each %h:%p expanded by its own ssh."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    record = tmp_path / "relayed"
    relay = _relay(record, "%h", "%p")
    user = getpass.getuser()
    (tmp_path / "ssh_config").write_text(
        f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  ProxyCommand {relay}\n"
        f"Host inner\n  HostName localhost\n  Port {sshd.port}\n"
        f"Host lab\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {user}\n  IdentityFile {sshd.client_key}\n"
        f"  ProxyJump {user}@bastion,{user}@inner\n")
    known_hosts = _known_hosts(tmp_path, sshd)
    kind, blob = sshd.host_public_key.read_text().split()[:2]
    known_hosts.write_text(known_hosts.read_text() + f"[localhost]:{sshd.port} {kind} {blob}\n")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    lab: {{ssh_config_file: ssh_config, known_hosts_file: {known_hosts}}}\n")
    target = resolve_target(load_inventory(inventory), "lab").ssh
    assert target.jump is not None
    assert [(hop.host, hop.port, hop.user) for hop in target.jump.chain] == [("127.0.0.1", sshd.port, user),
                                                                              ("localhost", sshd.port, user)]
    assert target.jump.chain[0].proxy_command == _relay(record, "127.0.0.1", str(sshd.port))
    _run_and_push(target, tmp_path)
    assert record.read_text().splitlines() == [f"127.0.0.1 {sshd.port}"] * 2  # the connection, then rsync's ssh


@pytest.mark.parametrize("written", ["proxy_jump: 'a@198.51.100.7:2022,b@10.0.0.1'",
                                     "ansible_ssh_common_args: '-J a@198.51.100.7:2022,b@10.0.0.1'",
                                     "ansible_ssh_common_args: '-o ProxyJump=a@198.51.100.7:2022,b@10.0.0.1'"])
def test_the_inventorys_chain_of_jump_hosts_is_each_hop_in_order(tmp_path: Path, written: str) -> None:
    ssh = _target(tmp_path, f"ansible_host: 10.0.0.5, ansible_user: deploy, ssh_config_file: none, {written}",
                  config=None)
    assert ssh.jump is not None
    assert [hop.address for hop in ssh.jump.chain] == ["a@198.51.100.7:2022", "b@10.0.0.1:22"]
    assert ssh.address == "deploy@10.0.0.5:22 via a@198.51.100.7:2022 -> b@10.0.0.1:22"


def test_the_first_hops_own_proxyjump_comes_before_the_chain(tmp_path: Path) -> None:
    """Input tried: `ProxyJump inner` for the host, and inner's own `ProxyJump bastion` (as `ssh -J` follows it)."""
    ssh = _target(tmp_path, "ssh_config_file: ssh_config", host="lab", config=(
        "Host bastion\n  HostName 198.51.100.7\n  User hop\nHost inner\n  HostName 10.0.0.1\n  User in\n"
        "  ProxyJump bastion\nHost lab\n  HostName 10.0.0.5\n  ProxyJump inner\n"))
    assert ssh.jump is not None
    assert [hop.address for hop in ssh.jump.chain] == ["hop@198.51.100.7:22", "in@10.0.0.1:22"]


def test_a_percent_in_the_first_hops_proxycommand_stays_literal_through_rsyncs_nested_ssh(
        sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: a first hop's (expanded) ProxyCommand naming a file `relayed-50%`: rsync's ssh meets it two
    ProxyCommands deep, and each ssh expands %-tokens once."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    record = tmp_path / "relayed-50%"
    known_hosts = _known_hosts(tmp_path, sshd)
    kind, blob = sshd.host_public_key.read_text().split()[:2]
    known_hosts.write_text(known_hosts.read_text() + f"[localhost]:{sshd.port} {kind} {blob}\n")
    first = JumpHost("127.0.0.1", sshd.port, getpass.getuser(),
                     proxy_command=_relay(record, "127.0.0.1", str(sshd.port)))
    target = replace(sshd.target(known_hosts), jump=JumpHost("localhost", sshd.port, getpass.getuser(), via=first))
    local = tmp_path / "weights"
    local.mkdir()
    (local / "config.json").write_text("{}")
    with FabricRemote(target) as remote:
        remote.push_directory(local, PurePosixPath(tmp_path / "pushed"), None)
    assert (tmp_path / "pushed" / "config.json").read_text() == "{}"
    assert record.read_text().splitlines() == [f"127.0.0.1 {sshd.port}"]
