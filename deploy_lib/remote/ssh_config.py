"""The user's OpenSSH client config (`~/.ssh/config`) read as OpenSSH reads it, through paramiko's SSHConfig: what
it says about one host (HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump, ProxyCommand,
UserKnownHostsFile), checked like the inventory's own values. Inventory vars win over it, as Ansible's `-o User=...`
does over ssh_config.

Fabric would read the file itself (fabric.Config `ssh_config`), but only for its own connection: the values are
resolved here instead, once, so that the paramiko connection, rsync's ssh (run with `-F /dev/null`), error messages
and known_hosts all see the same host, user, port and keys.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import paramiko

from deploy_lib.errors import ConfigError
from deploy_lib.remote.ssh import JumpHost, SSHTarget
from deploy_lib.yaml_io import read_text_file

SSH_CONFIG_ENV = "SGLANG_DEPLOY_SSH_CONFIG"  # a path, or `none` to read no ssh config
DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
NO_SSH_CONFIG = "none"
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9\[][A-Za-z0-9.:\-\[\]_]{0,254}$")  # never an option: no leading -
_USER_RE = re.compile(r"^[a-z_][a-z0-9_\-]{0,31}$")
_INCLUDE_RE = re.compile(r"^\s*include\s+(?P<patterns>.+?)\s*$", re.IGNORECASE)
# OpenSSH's ProxyJump destination: [ssh://][user@]host[:port], an IPv6 address in brackets.
_JUMP_RE = re.compile(r"^(?:ssh://)?(?:(?P<user>[a-z_][a-z0-9_\-]{0,31})@)?"
                      r"(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]{0,253}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?$")
_SSH_ARGS_HELP = ("sglang-deploy connects with Paramiko, not the ssh binary, and honours only the way to the host "
                  "here: `-o ProxyJump=user@host[:port]` or `-J user@host[:port]` (or the `proxy_jump` var), or "
                  "`-o ProxyCommand=...`")
_UNSUPPORTED = {"remotecommand": "remove it for that host (sglang-deploy runs its own commands)"}
# the tokens OpenSSH expands in a ProxyCommand that this tool knows at connect time (ssh_config(5) TOKENS)
_PROXY_TOKENS = re.compile(r"%(.)")


@dataclass(frozen=True)
class SSHConfigHost:
    """What the ssh config says about one host; None or empty where it says nothing."""

    hostname: str
    user: str | None = None
    port: int | None = None
    identity_files: tuple[Path, ...] = ()
    identities_only: bool = False
    proxy_jump: str | None = None
    proxy_command: str | None = None  # its tokens already expanded by paramiko, with this Host's own values
    known_hosts_file: Path | None = None


@dataclass(frozen=True)
class SshArgsProxy:
    """The way to the host an `ansible_ssh_common_args`/`ansible_ssh_extra_args` string gives; None where it gives
    none."""

    jump: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class JumpSpec:
    """One hop of a ProxyJump as written: [user@]host[:port], the host an ssh config alias or an address."""

    user: str | None
    host: str
    port: int | None


def split_proxy_jump(value: str) -> tuple[JumpSpec, ...] | None:
    """The hops of OpenSSH's ProxyJump `[user@]host[:port][,...]`, the first (reached from this machine) first;
    None for `none` (no jump); ValueError says what is wrong."""
    if value == "none":
        return None
    hops = []
    for written in value.split(","):
        match = _JUMP_RE.fullmatch(written)
        if match is None:
            raise ValueError(f"{written!r} is not a jump host; write user@host or user@host:port (a chain: "
                             "a,b with a reached first)")
        port = int(match.group("port")) if match.group("port") else None
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"{written!r}: port {port} is not in 1-65535")
        hops.append(JumpSpec(match.group("user"), match.group("host").strip("[]"), port))
    return tuple(hops)


def proxy_in_ssh_args(args: str) -> SshArgsProxy:
    """The ProxyJump (`-J`, `-o ProxyJump=`) or ProxyCommand (`-o ProxyCommand=`) of an `ansible_ssh_common_args`
    string; ValueError for anything else in it, for two different values, or for both."""
    try:
        words = shlex.split(args)
    except ValueError as error:
        raise ValueError(f"cannot split {args!r} like a shell: {error}") from None
    found: dict[str, set[str]] = {"proxyjump": set(), "proxycommand": set()}
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("-o", "-J") and index + 1 < len(words):
            flag, value, index = word, words[index + 1], index + 2
        elif word.startswith(("-o", "-J")) and len(word) > 2:
            flag, value, index = word[:2], word[2:], index + 1
        else:
            raise ValueError(f"{word!r} cannot be honoured. {_SSH_ARGS_HELP}")
        key = "proxyjump"
        if flag == "-o":
            key, _, rest = value.replace("=", " ", 1).partition(" ")
            key = key.lower()
            if key not in found or not rest.strip():
                raise ValueError(f"-o {value!r} cannot be honoured. {_SSH_ARGS_HELP}")
            value = rest.strip()
        found[key].add(value)
    for key, values in found.items():
        if len(values) > 1:
            raise ValueError(f"gives {len(values)} different values of {key}: {', '.join(sorted(values))}")
    if found["proxyjump"] and found["proxycommand"]:
        raise ValueError("gives both ProxyJump and ProxyCommand; keep one")
    return SshArgsProxy(jump=next(iter(found["proxyjump"]), None), command=next(iter(found["proxycommand"]), None))


def expand_proxy_command(command: str, host: str, port: int, user: str, alias: str) -> str:
    """An inventory's ProxyCommand with OpenSSH's tokens %h %p %r %n %% expanded as ssh would expand them;
    ValueError for another token (this tool cannot know its value)."""
    values = {"h": host, "p": str(port), "r": user, "n": alias, "%": "%"}

    def token(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise ValueError(f"ProxyCommand {command!r}: %{match.group(1)} cannot be expanded here; "
                             "use %h, %p, %r, %n or %%")
        return values[match.group(1)]
    return _PROXY_TOKENS.sub(token, command)


def ssh_config_path(inventory_value: str | None, inventory_path: Path, environ: Mapping[str, str]) -> Path | None:
    """The ssh config to read: the inventory's `ssh_config_file` (relative to the inventory), else $SGLANG_DEPLOY_SSH_
    CONFIG, else ~/.ssh/config; None for `none` (or no such default file)."""
    given = inventory_value if inventory_value is not None else environ.get(SSH_CONFIG_ENV)
    if given == NO_SSH_CONFIG:
        return None
    if given is None:
        default = DEFAULT_SSH_CONFIG.expanduser()
        return default if default.is_file() else None
    path = Path(given).expanduser()
    path = path if path.is_absolute() else inventory_path.parent / path
    if not path.is_file():
        where = f"{inventory_path}: ssh_config_file" if inventory_value is not None else f"${SSH_CONFIG_ENV}"
        raise ConfigError(f"{where}: {path} is not a file",
                          f"name an OpenSSH client config, or `{NO_SSH_CONFIG}` to read none")
    return path


def _text_with_includes(path: Path, depth: int = 0) -> str:
    """The config's text with each `Include` replaced by the files it names (paramiko does not read Include); a
    relative pattern is under ~/.ssh, as OpenSSH takes it for a user config."""
    if depth > MAX_INCLUDE_DEPTH:
        raise ConfigError(f"{path}: Include nested more than {MAX_INCLUDE_DEPTH} deep", "is an Include a loop?")
    lines = read_text_file(path).splitlines()
    out: list[str] = []
    for line in lines:
        include = _INCLUDE_RE.match(line)
        if include is None:
            out.append(line)
            continue
        for pattern in include.group("patterns").split():
            pattern = os.path.expanduser(pattern)
            pattern = pattern if os.path.isabs(pattern) else str(DEFAULT_SSH_CONFIG.expanduser().parent / pattern)
            out += [_text_with_includes(Path(name), depth + 1) for name in sorted(glob.glob(pattern))]
    return "\n".join(out)


def read_ssh_config(path: Path | None) -> paramiko.SSHConfig:
    """The parsed config (empty for None); ConfigError names the file when paramiko cannot parse it."""
    if path is None:
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_text(_text_with_includes(path))
    except (paramiko.ConfigParseError, ValueError) as error:
        raise ConfigError(f"{path}: cannot parse the ssh config: {error}") from None


def config_hostname(config: paramiko.SSHConfig, alias: str, source: Path | None) -> str:
    """The address `alias` stands for (its HostName, else itself); ConfigError for one unsafe in a command line."""
    hostname = config.lookup(alias).get("hostname", alias)
    if not _HOSTNAME_RE.match(hostname):
        raise ConfigError(f"{source}: Host {alias}: HostName {hostname!r} is not a host name or address",
                          "write one name or address, without spaces or options")
    return hostname


def lookup_host(config: paramiko.SSHConfig, alias: str, source: Path | None) -> SSHConfigHost:
    """What `config` says for `alias`; ConfigError naming the file, the Host and the key of a value this tool cannot
    honour or that would not be safe in a command line."""
    found = config.lookup(alias)
    where = f"{source}: Host {alias}"
    for key, fix in _UNSUPPORTED.items():
        if key in found:
            raise ConfigError(f"{where}: {key} cannot be honoured (sglang-deploy connects with paramiko)", fix)
    hostname = config_hostname(config, alias, source)
    user = found.get("user")
    if user is not None and not _USER_RE.match(user):
        raise ConfigError(f"{where}: User {user!r} is not a login name", "write a login name such as deploy")
    port = found.get("port")
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ConfigError(f"{where}: Port {port!r} is not in 1-65535")
    known_hosts = found.get("userknownhostsfile", "").split()
    jump, command = found.get("proxyjump"), found.get("proxycommand")
    if jump is not None and jump.lower() != "none" and command is not None and command.lower() != "none":
        raise ConfigError(f"{where}: both ProxyJump and ProxyCommand apply to it",
                          "keep one of them for that host (OpenSSH would use whichever comes first)")
    return SSHConfigHost(
        hostname=hostname, user=user, port=int(port) if port is not None else None,
        identity_files=tuple(Path(name) for name in found.get("identityfile", [])),
        identities_only=found.get("identitiesonly", "no").lower() == "yes",
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=None if command is None or command.lower() == "none" else command,
        known_hosts_file=Path(os.path.expanduser(known_hosts[0])) if known_hosts else None)


@dataclass(frozen=True)
class GivenSSH:
    """What the inventory says about reaching a host; None where it says nothing (the ssh config, then OpenSSH's
    defaults, fill those in)."""

    user: str | None = None
    port: int | None = None
    key_file: Path | None = None
    known_hosts_file: Path | None = None
    proxy_jump: str | None = None  # `none`: connect directly whatever the ssh config says
    proxy_command: str | None = None  # OpenSSH's tokens unexpanded, as ssh takes it on its command line
    connect_timeout_s: float = 10
    accept_new_host_key: bool = False


def _jump_chain(hops: tuple[JumpSpec, ...], config: paramiko.SSHConfig, source: Path | None,
                seen: tuple[str, ...]) -> tuple[JumpHost, tuple[Path, ...]]:
    """The last of `hops` as a JumpHost (each through the one before it), each looked up in the config, and their
    IdentityFiles. As OpenSSH's `ssh -J a,b`: the first hop's own ProxyJump (a chain before it) or ProxyCommand
    from the config applies; the later hops' are replaced by the chain. A loop of ProxyJumps is a ConfigError."""
    first = lookup_host(config, hops[0].host, source)
    keys = first.identity_files
    before = None
    # `Host *` with ProxyJump names the jump host itself too: that is no chain (Fabric's get_gateway skips it)
    if first.proxy_jump not in (None, hops[0].host):
        if hops[0].host in seen:
            raise ConfigError(f"{source}: Host {hops[0].host}: ProxyJump {first.proxy_jump!r} makes a loop: "
                              f"{' -> '.join((*seen, hops[0].host))}", "reach one of them directly")
        try:
            earlier = split_proxy_jump(str(first.proxy_jump))
        except ValueError as error:
            raise ConfigError(f"{source}: Host {hops[0].host}: ProxyJump {error}") from None
        if earlier is not None:
            before, earlier_keys = _jump_chain(earlier, config, source, (*seen, hops[0].host))
            keys += earlier_keys
    jump = JumpHost(host=first.hostname, port=hops[0].port or first.port or 22,
                    user=hops[0].user or first.user or getpass.getuser(), via=before,
                    proxy_command=first.proxy_command if before is None else None)
    for spec in hops[1:]:
        hop = lookup_host(config, spec.host, source)
        keys += hop.identity_files
        jump = JumpHost(host=hop.hostname, port=spec.port or hop.port or 22,
                        user=spec.user or hop.user or getpass.getuser(), via=jump)
    return jump, tuple(dict.fromkeys(keys))


def resolve_ssh_target(alias: str, given: GivenSSH, config: paramiko.SSHConfig, source: Path | None) -> SSHTarget:
    """The connection settings of `alias` (ansible_host, else the inventory name, as Ansible hands it to ssh): each
    the inventory's value, else the ssh config's for that Host, else OpenSSH's default (the local user, port 22,
    ~/.ssh/known_hosts). A ProxyJump names a host the config is looked up for too. A way to the host the inventory
    gives (ProxyJump, ProxyCommand or `none`) replaces the config's."""
    found = lookup_host(config, alias, source)
    if given.proxy_jump is not None or given.proxy_command is not None:
        found = replace(found, proxy_jump=None, proxy_command=None)
    jump_value = given.proxy_jump if given.proxy_jump is not None else found.proxy_jump
    key_files = (given.key_file,) if given.key_file is not None else found.identity_files
    jump = None
    if jump_value is not None:
        try:
            hops = split_proxy_jump(jump_value)
        except ValueError as error:
            raise ConfigError(f"{source}: Host {alias}: ProxyJump {error}",
                              "[user@]host[:port], or a chain a,b") from None
        if hops is not None:
            jump, hop_keys = _jump_chain(hops, config, source, (alias,))
            key_files += tuple(key for key in hop_keys if key not in key_files)
    port, user = given.port or found.port or 22, given.user or found.user or getpass.getuser()
    proxy_command = found.proxy_command
    if given.proxy_command is not None:
        try:
            proxy_command = expand_proxy_command(given.proxy_command, found.hostname, port, user, alias)
        except ValueError as error:
            raise ConfigError(f"host {alias}: {error}", "OpenSSH's ssh_config(5), TOKENS") from None
    return SSHTarget(host=found.hostname, port=port, user=user, key_files=key_files,
                     identities_only=found.identities_only,
                     known_hosts_file=given.known_hosts_file or found.known_hosts_file or Path("~/.ssh/known_hosts"),
                     connect_timeout_s=given.connect_timeout_s, accept_new_host_key=given.accept_new_host_key,
                     jump=jump, proxy_command=proxy_command)
