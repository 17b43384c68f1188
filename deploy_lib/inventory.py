"""Ansible-style YAML inventory (all / hosts / children / vars): hosts, their connection settings and GPU facts."""

from __future__ import annotations

import getpass
import os
import re
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.profile import AbsPath, Profile, format_validation_error
from deploy_lib.remote import JumpHost
from deploy_lib.yaml_io import load_yaml_mapping

_GROUP_KEYS = {"hosts", "children", "vars"}
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")
# OpenSSH's ProxyJump destination: [ssh://][user@]host[:port], an IPv6 address in brackets.
_JUMP_RE = re.compile(r"^(?:ssh://)?(?:(?P<user>[a-z_][a-z0-9_\-]{0,31})@)?"
                      r"(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]{0,253}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?$")
_SSH_ARGS_HELP = ("sglang-deploy connects with Paramiko, not the ssh binary, and honours only a jump host here: "
                  "`-o ProxyJump=user@host[:port]` or `-J user@host[:port]` (or the `proxy_jump` var)")


def parse_proxy_jump(value: str) -> JumpHost | None:
    """`[user@]host[:port]` (OpenSSH's ProxyJump; `none` means no jump); ValueError says what is wrong.

    Without `user@` the jump host is logged in as the local user, as OpenSSH does.
    """
    if value == "none":
        return None
    if "," in value:
        raise ValueError(f"{value!r} is a chain of jump hosts; one jump host is supported")
    match = _JUMP_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a jump host; write user@host or user@host:port")
    port = int(match.group("port") or 22)
    if not 1 <= port <= 65535:
        raise ValueError(f"{value!r}: port {port} is not in 1-65535")
    return JumpHost(host=match.group("host").strip("[]"), port=port, user=match.group("user") or getpass.getuser())


def proxy_jump_in_ssh_args(args: str) -> str | None:
    """The ProxyJump value of an `ansible_ssh_common_args` string; ValueError for anything else in it."""
    try:
        words = shlex.split(args)
    except ValueError as error:
        raise ValueError(f"cannot split {args!r} like a shell: {error}") from None
    found: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("-o", "-J") and index + 1 < len(words):
            flag, value, index = word, words[index + 1], index + 2
        elif word.startswith(("-o", "-J")) and len(word) > 2:
            flag, value, index = word[:2], word[2:], index + 1
        else:
            raise ValueError(f"{word!r} cannot be honoured. {_SSH_ARGS_HELP}")
        if flag == "-o":
            key, _, rest = value.replace("=", " ", 1).partition(" ")
            if key.lower() != "proxyjump" or not rest.strip():
                raise ValueError(f"-o {value!r} cannot be honoured. {_SSH_ARGS_HELP}")
            value = rest.strip()
        found.append(value)
    if len(set(found)) > 1:
        raise ValueError(f"gives {len(found)} different jump hosts: {', '.join(found)}")
    return found[0] if found else None


class RouterPolicy(StrEnum):
    """sglang-router's --policy choices (sglang_router/router_args.py, 0.3.2), `manual` left out."""

    cache_aware = "cache_aware"
    round_robin = "round_robin"
    power_of_two = "power_of_two"
    random = "random"


class HostVars(BaseModel):
    """The vars this tool reads; an Ansible inventory may carry others, which are kept but not used."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ansible_host: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\-\[\]]+$", max_length=255)] | None = None
    ansible_user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_\-]{0,31}$")] = "root"
    ansible_port: Annotated[int, Field(ge=1, le=65535)] = 22
    ansible_ssh_private_key_file: str | None = None
    known_hosts_file: str | None = Field(None, description="known_hosts to check the host key against")
    connect_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10
    gpu_count: Annotated[int, Field(ge=0, le=64)] | None = Field(None, description="declared; preflight reads it")
    gpu_arch: Annotated[str, StringConstraints(pattern=r"^sm[0-9]{2,3}[a-z]?$")] | None = Field(
        None, description="declared compute architecture, e.g. sm120")
    deploy_root: AbsPath = "/opt/sglang-deploy"
    node_rank: Annotated[int, Field(ge=0, le=63)] | None = Field(
        None, description="this host's node rank in a multi-node release (default: its place in the group)")
    venv: AbsPath | None = Field(None, description="overrides the profile's service.venv on this host")
    profile: str | None = Field(None, description="the host's profile when none is given: a name, or a path "
                                                  "relative to the inventory file")
    hf_home: AbsPath | None = Field(None, description="HF cache for staged weights; overrides env.HF_HOME")
    hf_endpoint: Annotated[str, StringConstraints(pattern=r"^https?://[A-Za-z0-9.:\-\[\]/_]+$", max_length=512)] | \
        None = Field(None, description="hub the host stages weights from (HF_ENDPOINT), e.g. a mirror")
    router: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")] | None = Field(
        None, description="inventory host that runs the SGLang router in front of this host's server (set it on the "
                          "group: every host of a group names the same router)")
    router_port: Annotated[int, Field(ge=1, le=65535)] = Field(30080, description="the router's port")
    router_policy: RouterPolicy = Field(RouterPolicy.cache_aware, description="the router's load-balancing policy")
    router_lock: str | None = Field(None, description="hashed lock of sglang-router and its dependencies, relative "
                                                      "to the inventory; default: the tool's lock of 0.3.2")
    router_wheelhouse: str | None = Field(None, description="local directory of the lock's wheels (and uv's), "
                                                            "relative to the inventory, for a router host without "
                                                            "internet")
    router_index: Annotated[str, StringConstraints(pattern=r"^https?://[^\s]+$")] | None = Field(
        None, description="package index the router host downloads the lock's wheels from (default PyPI)")
    proxmox_node: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")] | None = Field(
        None, description="inventory host of the Proxmox VE node this VM runs on; gpu-check reads it, read-only")
    proxmox_vmid: Annotated[int, Field(ge=100, le=999999999)] | None = Field(
        None, description="this VM's id on proxmox_node (`qm config` reads its passthrough)")
    proxy_jump: str | None = Field(None, description="jump host, [user@]host[:port] as OpenSSH's ProxyJump")
    ansible_ssh_common_args: str | None = Field(None, description="only -o ProxyJump=... / -J ... is honoured")
    ansible_ssh_extra_args: str | None = Field(None, description="only -o ProxyJump=... / -J ... is honoured")

    @field_validator("proxy_jump")
    @classmethod
    def _proxy_jump(cls, value: str | None) -> str | None:
        if value is not None:
            parse_proxy_jump(value)
        return value

    @field_validator("ansible_ssh_common_args", "ansible_ssh_extra_args")
    @classmethod
    def _ssh_args(cls, value: str | None) -> str | None:
        if value is not None:
            jump = proxy_jump_in_ssh_args(value)
            if jump is not None:
                parse_proxy_jump(jump)
        return value

    @model_validator(mode="after")
    def _proxmox_pair(self) -> HostVars:
        if (self.proxmox_node is None) != (self.proxmox_vmid is None):
            raise ValueError("proxmox_node and proxmox_vmid go together: the node and this VM's id on it")
        return self

    @model_validator(mode="after")
    def _one_jump_host(self) -> HostVars:
        given = {key: value for key, value in self._jump_values().items() if value is not None}
        if len(set(given.values())) > 1:
            raise ValueError("different jump hosts in " + ", ".join(f"{k} ({v})" for k, v in given.items()))
        return self

    def _jump_values(self) -> dict[str, str | None]:
        return {"proxy_jump": self.proxy_jump,
                **{key: proxy_jump_in_ssh_args(args) for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
                   if (args := getattr(self, key)) is not None}}

    @property
    def jump(self) -> JumpHost | None:
        """The jump host from proxy_jump or the ssh args (validated to agree); None connects directly."""
        value = next((v for v in self._jump_values().values() if v is not None), None)
        return parse_proxy_jump(value) if value is not None else None


READ_VARS = tuple(HostVars.model_fields)


class Host(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    groups: tuple[str, ...]
    vars: HostVars
    warnings: tuple[str, ...] = ()  # vars that look meant for this tool but are not read (typos, other ansible_*)

    @property
    def address(self) -> str:
        return self.vars.ansible_host or self.name


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]] = {}  # group -> its hosts, children's included, in inventory order

    def group(self, name: str) -> list[Host]:
        """The hosts of a group (its children's too), as Ansible resolves it; ConfigError naming the known groups."""
        if name not in self.groups:
            raise ConfigError(f"{self.path}: unknown group {name!r}{did_you_mean(name, self.groups)}",
                              f"groups: {', '.join(sorted(self.groups))}")
        if not self.groups[name]:
            raise ConfigError(f"{self.path}: group {name!r} has no hosts",
                              "add hosts under its `hosts:` or a child group's")
        return [self.hosts[host] for host in self.groups[name]]

    def host(self, name: str | None) -> Host:
        """The named host, or the only host when there is one; ConfigError listing the hosts otherwise."""
        if name is None:
            if len(self.hosts) == 1:
                return next(iter(self.hosts.values()))
            raise ConfigError(f"{self.path}: {len(self.hosts)} hosts; say which with --host",
                              f"hosts: {', '.join(sorted(self.hosts))}")
        if name not in self.hosts:
            raise ConfigError(f"{self.path}: unknown host {name!r}", f"hosts: {', '.join(sorted(self.hosts))}")
        return self.hosts[name]


@dataclass
class _GroupGraph:
    """Groups as Ansible keeps them: one group per name, whatever the number of places it is written; a group's hosts
    and children are the union of every place."""

    hosts: dict[str, list[str]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)

    def add(self, group: str, hosts: list[str], children: list[str]) -> None:
        for kind, names in ((self.hosts, hosts), (self.children, children)):
            known = kind.setdefault(group, [])
            known += [name for name in names if name not in known]

    def members(self, path: Path, group: str, chain: tuple[str, ...] = ()) -> list[str]:
        """The group's own hosts, then each child's in the order written; a group among its own children is an error
        (Ansible: a recursive dependency loop)."""
        if group in chain:
            loop = (*chain[chain.index(group):], group)
            raise ConfigError(f"{path}: group {group!r} is its own child: {' -> '.join(loop)}",
                              "a group may not contain itself, directly or through its children")
        found = list(self.hosts.get(group, []))
        for child in self.children.get(group, []):
            found += [host for host in self.members(path, child, (*chain, group)) if host not in found]
        return found

    def resolve(self, path: Path) -> dict[str, tuple[str, ...]]:
        groups = {name: tuple(self.members(path, name)) for name in self.hosts}
        grouped = {host for name, hosts in groups.items() if name != "all" for host in hosts}
        # Ansible's implicit group: hosts that belong to no group but `all`
        groups.setdefault("ungrouped", tuple(host for host in self.hosts["all"] if host not in grouped))
        return groups


def _walk_group(path: Path, where: str, group: Any, inherited: dict[str, Any], name: str,
                found: dict[str, dict[str, Any]], graph: _GroupGraph) -> None:
    if group is None:
        graph.add(name, [], [])
        return
    if not isinstance(group, dict):
        raise ConfigError(f"{path}: {where}: a group must be a mapping with hosts/children/vars")
    unknown = sorted(set(group) - _GROUP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: {where}.{unknown[0]}: unknown key", "a group has only hosts, children and vars")
    group_vars = group.get("vars") or {}
    if not isinstance(group_vars, dict):
        raise ConfigError(f"{path}: {where}.vars: must be a mapping")
    scope = {**inherited, **group_vars}
    hosts = group.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise ConfigError(f"{path}: {where}.hosts: must be a mapping of host name to vars")
    for host_name, host_vars in hosts.items():
        if not isinstance(host_name, str) or not _HOST_NAME_RE.match(host_name):
            raise ConfigError(f"{path}: {where}.hosts: {host_name!r} is not a valid host name")
        if host_vars is not None and not isinstance(host_vars, dict):
            raise ConfigError(f"{path}: {where}.hosts.{host_name}: must be a mapping of vars")
        found[host_name] = {**found.get(host_name, {}), **scope, **(host_vars or {})}
    children = group.get("children") or {}
    if not isinstance(children, dict):
        raise ConfigError(f"{path}: {where}.children: must be a mapping of group name to group")
    graph.add(name, list(hosts), [str(child_name) for child_name in children])
    for child_name, child in children.items():
        _walk_group(path, f"{where}.children.{child_name}", child, scope, str(child_name), found, graph)


def load_inventory(path: Path) -> Inventory:
    raw = load_yaml_mapping(path)
    if set(raw) != {"all"}:
        extra = sorted(set(raw) - {"all"})
        raise ConfigError(f"{path}: top level must be `all:` only" + (f", found {extra[0]!r}" if extra else ""),
                          "Ansible YAML inventory: all: {hosts:, children:, vars:}")
    found: dict[str, dict[str, Any]] = {}
    graph = _GroupGraph()
    _walk_group(path, "all", raw["all"], {}, "all", found, graph)
    graph.add("all", list(found), [])  # `all` holds every host, wherever it was written
    groups = graph.resolve(path)
    hosts = {}
    for name, host_vars in found.items():
        try:
            parsed = HostVars.model_validate(host_vars)
        except ValidationError as err:
            raise ConfigError(format_validation_error(f"{path}: host {name}", err)) from None
        if parsed.profile and ("/" in parsed.profile or parsed.profile.endswith(".yaml")):
            parsed = parsed.model_copy(update={"profile": str(expand_local_path(parsed.profile, path))})
        member_of = tuple(group for group, members in groups.items() if name in members)
        hosts[name] = Host(name=name, groups=member_of, vars=parsed, warnings=_ignored_vars(path, name, host_vars))
    if not hosts:
        raise ConfigError(f"{path}: no hosts defined")
    return Inventory(path=path, hosts=hosts, groups=groups)


def _ignored_vars(path: Path, host: str, host_vars: dict[str, Any]) -> tuple[str, ...]:
    """An ansible_* var this tool does not read, or any var close to one it does, is most likely a typo."""
    warnings = []
    for name in sorted(set(host_vars) - set(READ_VARS)):
        suggestion = did_you_mean(name, READ_VARS, cutoff=0.85)  # ansible_ names share a long prefix
        if name.startswith("ansible_") or suggestion:
            warnings.append(f"{path}: host {host}: {name} is not a var sglang-deploy reads, so it is ignored"
                            f"{suggestion}")
    return tuple(warnings)


def expand_local_path(value: str, relative_to: Path) -> Path:
    """A path from the inventory on this machine: ~ expanded, relative to the inventory file."""
    expanded = Path(os.path.expanduser(value))
    return expanded if expanded.is_absolute() else (relative_to.parent / expanded)


def check_profile_fits_host(profile: Profile, host: Host, profile_source: Path) -> None:
    """What can be checked before SSH: the declared GPU count and architecture against the profile."""
    needed = profile.parallel.gpus_per_node
    declared = host.vars.gpu_count
    if declared is not None and needed > declared:
        raise ConfigError(
            f"{profile_source}: parallel.tp: needs {needed} GPUs per node, host {host.name} has {declared}",
            f"use tp <= {declared} or a host with more GPUs")
