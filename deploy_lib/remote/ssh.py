"""Reaching a host over SSH: its connection settings, host-key checks against known_hosts, the connect policy and
what a failed connect means, and the same settings as rsync's ssh options."""

from __future__ import annotations

import base64
import hashlib
import shlex
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import paramiko
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from deploy_lib.errors import ConfigError, ConnectFailed
from deploy_lib.remote.batch import SKIP_PASSWORD, SUDO_PASSWORD_END

if TYPE_CHECKING:  # the connection's type only: reading a host's settings loads no Fabric
    import fabric


@dataclass(frozen=True)
class JumpHost:
    """A host the connection goes through (OpenSSH's ProxyJump), e.g. the Proxmox node in front of its VM; `via` is
    the hop before it in a chain (`ProxyJump a,b`: b via a), and the first hop may be reached through its own
    ProxyCommand (tokens expanded), as a bastion behind SSM or cloudflared is."""

    host: str
    port: int = 22
    user: str = "root"
    via: JumpHost | None = None
    proxy_command: str | None = None

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def chain(self) -> tuple[JumpHost, ...]:
        """Every hop up to this one, the first (reached from this machine) first."""
        return (*(self.via.chain if self.via is not None else ()), self)


@dataclass(frozen=True)
class SudoPassword:
    """The login user's password for sudo on the host, where its sudoers rule is not NOPASSWD; `source` says where it
    came from (a message names it, never the value)."""

    value: str = field(repr=False)
    source: str

    def __post_init__(self) -> None:
        if not self.value or any(c in self.value for c in "\x00\n\r"):
            # sudo reads a password up to its first newline (or return); the rest would reach a step's stdin
            raise ConfigError(f"the sudo password from {self.source} is empty or has a newline, return or NUL")


@dataclass(frozen=True)
class SSHTarget:
    """Connection settings of one host, as the inventory and the user's ssh config give them (resolved once, see
    ssh_config.py): each key file is tried, then the ssh agent's keys unless `identities_only` (OpenSSH's
    IdentitiesOnly), then with no key file the default ~/.ssh keys.

    A jump host is reached with the same keys and known_hosts file as the target; each hop's host key is checked.
    A ProxyCommand (tokens expanded) is run locally and the connection speaks over its stdin and stdout, as OpenSSH's.
    With `sudo_password`, root steps (and rsync's far side) run through `sudo -S`, which reads it on stdin
    (remote/batch.py); without it through `sudo -n`, which never asks.
    """

    host: str
    port: int = 22
    user: str = "root"
    key_files: tuple[Path, ...] = ()
    identities_only: bool = False
    known_hosts_file: Path = field(default_factory=lambda: Path("~/.ssh/known_hosts"))
    connect_timeout_s: float = 10
    accept_new_host_key: bool = False
    jump: JumpHost | None = None
    proxy_command: str | None = None
    sudo_password: SudoPassword | None = None
    # unlocks encrypted key files for the paramiko connection (typed at the terminal: keys_needing_passphrase)
    key_passphrase: str | None = field(default=None, repr=False)

    @property
    def password_for_sudo(self) -> SudoPassword | None:
        """The sudo password where it is used: root steps of a login user other than root."""
        return self.sudo_password if self.user != "root" else None

    @property
    def known_hosts_path(self) -> Path:
        return self.known_hosts_file.expanduser()

    @property
    def address(self) -> str:
        direct = f"{self.user}@{self.host}:{self.port}"
        if self.proxy_command is not None:
            return f"{direct} via ProxyCommand {self.proxy_command!r}"
        return f"{direct} via {' -> '.join(hop.address for hop in self.jump.chain)}" if self.jump else direct


def host_key_fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a host key, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# Errors that mean "the host is not reachable yet"; host key, authentication and DNS errors are final.
TRANSIENT_SSH: tuple[type[BaseException], ...] = (
    paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError, ConnectionResetError,
    TimeoutError,
)

SSH_CONNECT = Retrying(
    stop=stop_after_attempt(4) | stop_after_delay(30),
    wait=wait_exponential_jitter(max=5),
    retry=retry_if_exception_type(TRANSIENT_SSH),
    reraise=True,
    name="ssh-connect",
)

# After a connection dropped mid-command: how often, and how long, a new one is tried before the steps that are safe to
# repeat are sent again (`FabricRemote.run`; which steps: `steps.repeatable`). Each attempt opens through SSH_CONNECT.
# A partition of about a minute is ridden out here; the readiness ladder rides out a longer one up to its deadline.
SSH_RECONNECT = Retrying(
    stop=stop_after_attempt(6) | stop_after_delay(60),
    wait=wait_exponential_jitter(initial=1, max=10),
    reraise=True,
    name="ssh-reconnect",
)
# Seconds between SSH keepalives on an open connection: a connection the host dropped while we only waited is found
# dead when the network returns (its reset answers the keepalive), not at our next write.
KEEPALIVE_S = 10
# How long a round trip's channel may take to open and start its command. paramiko waits up to an hour for the open
# (Transport.channel_timeout) and without end for the exec's reply (Channel.exec_command), and the silence bound
# starts only once the command runs: a link that died just before a round trip would hang it there.
CHANNEL_OPEN_S = 30.0


class ChannelWatch:
    """Closes `transport` (the waits in paramiko then raise) unless `started` comes within CHANNEL_OPEN_S."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.fired, self.bound_s = False, CHANNEL_OPEN_S
        self._timer = threading.Timer(self.bound_s, self._fire, (transport,))
        self._timer.daemon = True

    def _fire(self, transport: paramiko.Transport) -> None:
        self.fired = True
        transport.close()

    def start(self) -> ChannelWatch:
        self._timer.start()
        return self

    def started(self) -> None:
        self._timer.cancel()


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for hosts absent from known_hosts: refuse, or record and accept on opt-in."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = self.known_hosts.read_bytes() if self.known_hosts.exists() else b""
        separator = b"" if not existing or existing.endswith(b"\n") else b"\n"
        with self.known_hosts.open("ab") as known:
            known.write(separator + f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
        if not existing:
            self.known_hosts.chmod(0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)


# rsync's stdin and stdout are its protocol: with a sudo password, its remote shell is this relay, which sends the
# password (from its environment, where rsync_env puts it; never an argument) and SUDO_PASSWORD_END ahead of rsync's
# stream, for `sudo -S` on the far side to read as a root step's does. Ansible's synchronize takes no sudo password.
# The `cat` relaying rsync's stream is ended with ssh: rsync closes its end only once its remote shell has exited.
SUDO_PASSWORD_ENV = "SGLANG_DEPLOY_SUDO_PASSWORD"
_RSYNC_RELAY = (f'pw=${SUDO_PASSWORD_ENV}; unset {SUDO_PASSWORD_ENV}; '
                f'"$@" < <(printf "%s\\n%s\\n" "$pw" {SUDO_PASSWORD_END}; exec cat); rc=$?; '
                'kill "$!" 2>/dev/null; exit "$rc"')


def rsync_env(target: SSHTarget, environ: dict[str, str]) -> dict[str, str]:
    """The environment rsync runs in: this process's, plus the sudo password for its relay where it has one."""
    password = target.password_for_sudo
    return environ if password is None else {**environ, SUDO_PASSWORD_ENV: password.value}


def rsync_argv(target: SSHTarget, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None) -> list[str]:
    """rsync over ssh with this target's keys and host-key checking (its known_hosts, strict), as root on the host
    (sudo -n for another user, or with a sudo password sudo -S through _RSYNC_RELAY); a dead link given up within
    CHANNEL_OPEN_S; unchanged files hard-linked from link_dest; partial files kept for a resume. The ssh config is
    not read again (-F /dev/null): its values are already in the target, as for the paramiko connection."""
    checks = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
              "-o", f"UserKnownHostsFile={target.known_hosts_path}",
              "-o", f"ConnectTimeout={max(1, round(target.connect_timeout_s))}",
              # a link that dies once the handshake is done ends the push within CHANNEL_OPEN_S, as an SFTP upload's
              # channel (sftp.open_sftp) and a round trip's do: ConnectTimeout bounds only the connect and handshake.
              # ssh gives up at the check after the CountMax-th unanswered one (OpenSSH clientloop.c server_alive_check)
              "-o", f"ServerAliveInterval={KEEPALIVE_S}",
              "-o", f"ServerAliveCountMax={max(1, round(CHANNEL_OPEN_S / KEEPALIVE_S) - 1)}"]
    for key_file in target.key_files:
        checks += ["-i", str(key_file.expanduser())]
    if target.identities_only:
        checks += ["-o", "IdentitiesOnly=yes"]
    ssh = ["ssh", "-p", str(target.port), *checks]
    if target.jump is not None:  # each hop gets the same key and host-key checks (ProxyJump would not pass -o)
        ssh += ["-o", f"ProxyCommand={_through(target.jump, checks)}"]
    elif target.proxy_command is not None:  # expanded already: a % left in it is a literal one to ssh
        ssh += ["-o", f"ProxyCommand={_literal(target.proxy_command)}"]
    if target.password_for_sudo is not None:
        ssh = ["bash", "-c", _RSYNC_RELAY, "sglang-deploy", *ssh]
    argv = ["rsync", "-a", "--partial", "--protect-args", "--info=progress2", "--no-inc-recursive",
            "-e", shlex.join(ssh)]
    if target.password_for_sudo is not None:
        argv += ["--rsync-path", shlex.join(("sudo", "-S", "-p", "", "--", "bash", "-c", SKIP_PASSWORD,
                                             "sglang-deploy", "rsync"))]
    elif target.user != "root":
        argv += ["--rsync-path", "sudo -n rsync"]
    if link_dest is not None:
        argv.append(f"--link-dest={link_dest}")
    return [*argv, f"{local_dir}/", f"{target.user}@{target.host}:{dest}/"]


def _literal(command: str) -> str:
    """A command as ssh's ProxyCommand, which expands %-tokens once before it runs it: its % kept."""
    return command.replace("%", "%%")


def _through(hop: JumpHost, checks: list[str]) -> str:
    """rsync's ssh ProxyCommand through `hop` (`ssh -W %h:%p hop`, %h:%p for the ssh that runs it to expand): the hop
    before it nested as its own ProxyCommand, one expansion deeper, and a first hop's own command literal through the
    two expansions it meets (the ssh that runs this command, then this command's ssh)."""
    inner: list[str] = []
    if hop.via is not None:
        inner = ["-o", f"ProxyCommand={_literal(_through(hop.via, checks))}"]
    elif hop.proxy_command is not None:
        inner = ["-o", f"ProxyCommand={_literal(_literal(hop.proxy_command))}"]
    return shlex.join(["ssh", "-p", str(hop.port), *checks, *inner, "-W", "%h:%p", f"{hop.user}@{hop.host}"])


def known_hosts_name(hop: JumpHost) -> str:
    return hop.host if hop.port == 22 else f"[{hop.host}]:{hop.port}"


def unreachable(error: ConnectFailed) -> bool:
    """A connect that failed on the network (no route, timed out, refused, reset, no SSH banner), which a later
    attempt may get past; a host key or authentication refusal is final."""
    cause = error.__cause__
    final = (UnknownHostKey, paramiko.BadHostKeyException, paramiko.AuthenticationException)
    return isinstance(cause, OSError | EOFError | paramiko.SSHException) and not isinstance(cause, final)


def connect_kwargs(target: SSHTarget) -> dict[str, Any]:
    """paramiko's connect arguments for every hop of `target`: its timeouts and the keys to offer."""
    # Fabric truncates its own connect_timeout to an int; paramiko's timeouts take the float as given.
    kwargs: dict[str, Any] = {"timeout": target.connect_timeout_s, "banner_timeout": target.connect_timeout_s,
                              "auth_timeout": target.connect_timeout_s}
    # OpenSSH's order: the key files given, the agent's keys (unless IdentitiesOnly), the default keys only
    # when no key file is given
    kwargs |= {"allow_agent": not target.identities_only, "look_for_keys": not target.key_files}
    if target.key_files:
        kwargs["key_filename"] = [str(key.expanduser()) for key in target.key_files]
    if target.key_passphrase is not None:
        kwargs["passphrase"] = target.key_passphrase
    return kwargs


def keys_needing_passphrase(target: SSHTarget) -> tuple[Path, ...]:
    """The target's key files that are encrypted and that no ssh agent key stands for (the agent counts unless
    IdentitiesOnly): what a passphrase would unlock. A key is matched by its public half beside it (KEY.pub); without
    one, any agent key may be it, so only an empty agent leaves it locked."""
    encrypted = []
    for key in target.key_files:
        try:
            paramiko.PKey.from_path(key.expanduser())
        except (paramiko.PasswordRequiredException, TypeError):  # cryptography's word for an OpenSSH-format one
            encrypted.append(key.expanduser())
        except (OSError, ValueError, paramiko.SSHException):
            continue  # unreadable or not a key: the connect says so
    if not encrypted:
        return ()
    agent = paramiko.Agent()
    try:
        held = set() if target.identities_only else {key.asbytes() for key in agent.get_keys()}
    finally:
        agent.close()

    def unlocked(key: Path) -> bool:
        public = key.with_name(key.name + ".pub")
        try:
            return base64.b64decode(public.read_text().split()[1]) in held
        except (OSError, IndexError, ValueError):
            return bool(held)
    return tuple(key for key in encrypted if not unlocked(key))


def unlocked_with(target: SSHTarget, keys: tuple[Path, ...], passphrase: str) -> SSHTarget:
    """The target with the passphrase that opens its encrypted `keys`; ConfigError naming a key it does not open,
    before any connection."""
    for key in keys:
        try:
            paramiko.PKey.from_path(key, passphrase.encode())  # type: ignore[arg-type, unused-ignore]  # bytes, as cryptography wants; stubs before 5 say str
        except (paramiko.SSHException, ValueError, TypeError):
            raise ConfigError(f"the passphrase typed does not unlock the key file {key}",
                              hint=f"run the command again and type it again, or load the key into your ssh agent "
                                   f"(`ssh-add {shlex.quote(str(key))}`)") from None
    return replace(target, key_passphrase=passphrase)


def open_hop(connection: fabric.Connection, hop: JumpHost, timeout_s: float, direct: bool,
             proxy_command: str | None = None) -> None:
    """Open `connection`; a `direct` one (no jump host before it) on a TCP socket of ours with TCP_NODELAY, as
    OpenSSH's ssh sets it: with Nagle's algorithm each small SSH request waited for the peer's delayed ACK, about
    40 ms in the handshake and 40 ms for every channel a round trip opens (measured against OpenSSH 9.2 on
    loopback). Through a jump host the hop is a channel of the jump host's connection, which has it; through a
    `proxy_command`, that command's stdin and stdout (paramiko.ProxyCommand)."""
    if not direct:
        connection.open()
        return
    sock: socket.socket | paramiko.ProxyCommand
    if proxy_command is not None:
        sock = paramiko.ProxyCommand(proxy_command)
    else:
        sock = socket.create_connection((hop.host, hop.port), timeout=timeout_s)
    try:
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.connect_kwargs["sock"] = sock
        connection.open()
    except BaseException:
        sock.close()
        raise
    finally:
        connection.connect_kwargs.pop("sock", None)


def connect_error(target: SSHTarget, error: Exception, hop: JumpHost, *, through: JumpHost | None, is_jump: bool,
                  proxy_command: str | None) -> ConnectFailed:
    """What a failed connect to `hop` (a jump host or the host, `through` the hop before it, or its `proxy_command`)
    means for the user: an unknown or changed host key, authentication, the jump host, or the host not reachable;
    each with what to do."""
    known = target.known_hosts_path
    what = "jump host" if is_jump else "host"
    via = f" via jump host {through.address}" if through is not None else ""
    if isinstance(error, UnknownHostKey):
        return ConnectFailed(
            f"host key of {what} {error.hostname}{via} is not in {known}: {error.key.get_name()} "
            f"{host_key_fingerprint(error.key)}; refusing to connect",
            hint=f"compare the fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the {what}, "
                 "then rerun with --accept-new-host-key to record it (or add it to known_hosts yourself)")
    if isinstance(error, paramiko.BadHostKeyException):
        return ConnectFailed(
            f"host key of {what} {hop.host}:{hop.port}{via} CHANGED: {known} has {error.expected_key.get_name()} "
            f"{host_key_fingerprint(error.expected_key)}, the server offers {error.key.get_name()} "
            f"{host_key_fingerprint(error.key)}; refusing to connect (possible man-in-the-middle)",
            hint=f"if the {what} was reinstalled, remove the old entry with "
                 f"`ssh-keygen -R {shlex.quote(known_hosts_name(hop))} -f {shlex.quote(str(known))}` "
                 f"and connect again; --accept-new-host-key never replaces a changed key")
    if isinstance(error, paramiko.PasswordRequiredException):
        keys = " ".join(shlex.quote(str(key)) for key in target.key_files) or "KEY_FILE"
        return ConnectFailed(f"SSH authentication as {hop.user!r} on {what} {hop.host}:{hop.port}{via} failed: a key "
                             f"file is encrypted ({error}) and no ssh agent key was accepted",
                             hint=f"load the key into your ssh agent (`ssh-add {keys}`; the agent is offered with "
                                  "key files unless IdentitiesOnly is set) and rerun")
    if isinstance(error, paramiko.AuthenticationException):
        return ConnectFailed(f"SSH authentication as {hop.user!r} on {what} {hop.host}:{hop.port}{via} failed: "
                             f"{error}", hint="check the user and key file (inventory: ansible_user, "
                                  "ansible_ssh_private_key_file; ssh config: User, IdentityFile) and the ssh agent")
    if proxy_command is not None and isinstance(error, (paramiko.ProxyCommandFailure, paramiko.SSHException,
                                                         EOFError, OSError)):
        return ConnectFailed(f"cannot connect to {what} {hop.address} through its ProxyCommand {proxy_command!r}: "
                             f"{error or type(error).__name__}",
                             hint="run the command yourself: it must connect its stdin and stdout to the host's sshd "
                                  "(ssh config ProxyCommand, or -o ProxyCommand= in ansible_ssh_common_args)")
    if isinstance(error, paramiko.ChannelException) and through is not None:
        return ConnectFailed(f"jump host {through.address} cannot open a connection to {hop.host}:{hop.port}: "
                             f"{error}", hint="is the host up, at the address the jump host sees it by?")
    return ConnectFailed(f"cannot connect to {what} {hop.address}{via}: {error or type(error).__name__}",
                         hint="is the host up and sshd listening on that port?")
