"""Ansible inventories (YAML all / hosts / children / vars, or INI; group_vars/ and host_vars/ beside them): hosts,
their connection settings and GPU facts, with Ansible's precedence of vars."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import paramiko
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.inventory.formats import (
    expand_host_pattern,
    inventory_file,
    read_inventory_source,
    read_vars_files,
    unmatched_vars_files,
)
from deploy_lib.profile import AbsPath, Profile, SecretRef, format_validation_error
from deploy_lib.remote import SSHTarget
from deploy_lib.remote.ssh_config import (
    GivenSSH,
    SshArgsProxy,
    config_hostname,
    proxy_in_ssh_args,
    read_ssh_config,
    resolve_ssh_target,
    split_proxy_jump,
    ssh_config_path,
)

_GROUP_KEYS = {"hosts", "children", "vars"}
ASK_BECOME_PASSWORD = "ask"  # become_password: typed once at the terminal, for every host that says so
_BECOME_PASSWORD_HELP = ("a sudo password is never written in the inventory: write `become_password: ask` (typed at "
                         "the terminal) or `become_password: {env: VAR}` (or `{file: PATH}`, `{command: [ARGV...]}`), "
                         "read on this machine")
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")


class RouterPolicy(StrEnum):
    """sglang-router's --policy choices (sglang_router/router_args.py, 0.3.2), `manual` left out."""

    cache_aware = "cache_aware"
    round_robin = "round_robin"
    power_of_two = "power_of_two"
    random = "random"


class HostVars(BaseModel):
    """The vars this tool reads; an Ansible inventory may carry others, which are kept but not used."""

    model_config = ConfigDict(defer_build=True, extra="ignore", frozen=True)

    ansible_host: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\-\[\]]+$", max_length=255)] | None = None
    ansible_user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_\-]{0,31}$")] | None = Field(
        None, description="login user; default: the ssh config's User, else the local user (as Ansible)")
    ansible_port: Annotated[int, Field(ge=1, le=65535)] | None = Field(
        None, description="SSH port; default: the ssh config's Port, else 22")
    ansible_ssh_private_key_file: str | None = Field(None, description="key file; default: the ssh config's "
                                                                       "IdentityFile, else the agent and ~/.ssh keys")
    known_hosts_file: str | None = Field(None, description="known_hosts to check the host key against; default: the "
                                                           "ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts")
    ssh_config_file: str | None = Field(None, description="OpenSSH client config read for this host (relative to "
                                                          "the inventory; `none`: none); default "
                                                          "$SGLANG_DEPLOY_SSH_CONFIG, else ~/.ssh/config")
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
    notify_webhook: Annotated[str, StringConstraints(pattern=r"^https?://[^\s]+$", max_length=2048)] | None = Field(
        None, description="URL that receives a JSON notification (Slack-compatible `text`) on a rollback, a gate "
                          "failure, a crash loop given up and a deploy done")
    proxmox_node: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")] | None = Field(
        None, description="inventory host of the Proxmox VE node this VM runs on; gpu-check reads it, read-only")
    proxmox_vmid: Annotated[int, Field(ge=100, le=999999999)] | None = Field(
        None, description="this VM's id on proxmox_node (`qm config` reads its passthrough)")
    proxy_jump: str | None = Field(None, description="jump host, [user@]host[:port] as OpenSSH's ProxyJump; a chain "
                                                     "a,b reaches a first")
    ansible_ssh_common_args: str | None = Field(
        None, description="only -o ProxyJump=... / -J ... or -o ProxyCommand=... is honoured")
    ansible_ssh_extra_args: str | None = Field(
        None, description="only -o ProxyJump=... / -J ... or -o ProxyCommand=... is honoured")
    become_password: SecretRef | Literal["ask"] | None = Field(
        None, description="ansible_user's sudo password where its sudoers rule is not NOPASSWD: `ask` (typed once at "
                          "the terminal), {env: VAR}, {file: PATH} or {command: [ARGV...]}, read on this machine")
    ansible_become_password: Any = Field(None, description="refused: a password in clear; use become_password")
    ansible_become_pass: Any = Field(None, description="refused: a password in clear; use become_password")

    @field_validator("become_password", mode="before")
    @classmethod
    def _become_password(cls, value: Any) -> Any:
        if isinstance(value, str | int | float) and value != ASK_BECOME_PASSWORD:
            raise ValueError(_BECOME_PASSWORD_HELP)
        return value

    @field_validator("ansible_become_password", "ansible_become_pass")
    @classmethod
    def _no_password_in_clear(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(f"Ansible's become password is not read; {_BECOME_PASSWORD_HELP}")
        return value

    @field_validator("proxy_jump")
    @classmethod
    def _proxy_jump(cls, value: str | None) -> str | None:
        if value is not None:
            split_proxy_jump(value)
        return value

    @field_validator("ansible_ssh_common_args", "ansible_ssh_extra_args")
    @classmethod
    def _ssh_args(cls, value: str | None) -> str | None:
        if value is not None:
            jump = proxy_in_ssh_args(value).jump
            if jump is not None:
                split_proxy_jump(jump)
        return value

    @model_validator(mode="after")
    def _proxmox_pair(self) -> HostVars:
        if (self.proxmox_node is None) != (self.proxmox_vmid is None):
            raise ValueError("proxmox_node and proxmox_vmid go together: the node and this VM's id on it")
        return self

    @model_validator(mode="after")
    def _one_way_to_the_host(self) -> HostVars:
        given = {key: value for key, value in self._jump_values().items() if value is not None}
        if len(set(given.values())) > 1:
            raise ValueError("different jump hosts in " + ", ".join(f"{k} ({v})" for k, v in given.items()))
        commands = {key: value for key, value in self._proxy_commands().items() if value is not None}
        if len(set(commands.values())) > 1:
            raise ValueError("different ProxyCommands in " + ", ".join(commands))
        if given and commands:
            raise ValueError(f"a jump host ({', '.join(given)}) and a ProxyCommand ({', '.join(commands)}) are both "
                             "given; keep one")
        return self

    def _parsed_ssh_args(self) -> dict[str, SshArgsProxy]:
        return {key: proxy_in_ssh_args(args) for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
                if (args := getattr(self, key)) is not None}

    def _jump_values(self) -> dict[str, str | None]:
        return {"proxy_jump": self.proxy_jump, **{key: args.jump for key, args in self._parsed_ssh_args().items()}}

    def _proxy_commands(self) -> dict[str, str | None]:
        return {key: args.command for key, args in self._parsed_ssh_args().items()}

    @property
    def proxy_command_value(self) -> str | None:
        """The ProxyCommand the ssh args give (tokens unexpanded); None when they give none."""
        return next((v for v in self._proxy_commands().values() if v is not None), None)

    @property
    def proxy_jump_value(self) -> str | None:
        """The ProxyJump the inventory gives (proxy_jump or the ssh args, validated to agree; `none` for a direct
        connection whatever the ssh config says); None when it gives none."""
        return next((v for v in self._jump_values().values() if v is not None), None)



READ_VARS = tuple(HostVars.model_fields)


class Host(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True)
    name: str
    groups: tuple[str, ...]
    vars: HostVars
    warnings: tuple[str, ...] = ()  # vars that look meant for this tool but are not read (typos, other ansible_*)
    var_files: dict[str, Path] = {}  # each var -> the file its value came from (inventory, group_vars/, host_vars/)
    config_hostname: str | None = None  # the ssh config's HostName for ssh_alias, where it has one

    @property
    def ssh_alias(self) -> str:
        """What ssh is asked to reach, as Ansible hands it to ssh: ansible_host, else the inventory name."""
        return self.vars.ansible_host or self.name

    @property
    def address(self) -> str:
        """Where the host is reached (endpoints, a multi-node release's dist-init address): the ssh config's
        HostName for ssh_alias, else ssh_alias itself."""
        return self.config_hostname or self.ssh_alias


class Inventory(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True)
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]] = {}  # group -> its hosts, children's included, in inventory order

    def group(self, name: str) -> list[Host]:
        """The hosts of a group (its children's too), as Ansible resolves it; ConfigError naming the known groups."""
        if name not in self.groups:
            raise ConfigError(f"{self.path}: unknown group {name!r}" + (
                f"; {name} is a host: --host {name}" if name in self.hosts else did_you_mean(name, self.groups)),
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
            raise ConfigError(f"{self.path}: unknown host {name!r}" + (
                f"; {name} is a group: --group {name}" if name in self.groups else did_you_mean(name, self.hosts)),
                f"hosts: {', '.join(sorted(self.hosts))}")
        return self.hosts[name]


@dataclass
class _Collected:
    """An inventory file as Ansible keeps it: one group per name, whatever the number of places it is written (its
    hosts, children and vars the union of every place, a later value winning); each host's own vars likewise."""

    hosts: dict[str, list[str]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    group_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_vars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, group: str, hosts: list[str], children: list[str], group_vars: dict[str, Any]) -> None:
        for kind, names in ((self.hosts, hosts), (self.children, children)):
            known = kind.setdefault(group, [])
            known += [name for name in dict.fromkeys(names) if name not in known]
        self.group_vars[group] = {**self.group_vars.get(group, {}), **group_vars}

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

    def depth(self, group: str) -> int:
        """Ansible's group depth: 0 for all, else one more than its deepest parent (a group of no parent is all's)."""
        if group == "all":
            return 0
        parents = [name for name, children in self.children.items() if group in children and name != "all"]
        return 1 + max((self.depth(parent) for parent in parents), default=0)

    def precedence(self, groups: list[str]) -> list[str]:
        """A host's groups from weakest to strongest, as Ansible merges their vars: all first, then by depth (a child
        overrides its parent), ansible_group_priority, then name."""
        def key(group: str) -> tuple[int, int, str]:
            priority = self.group_vars.get(group, {}).get("ansible_group_priority", 1)
            return self.depth(group), priority if isinstance(priority, int) else 1, group
        return sorted(groups, key=key)


def _walk_group(path: Path, where: str, group: Any, name: str, collected: _Collected) -> None:
    if group is None:
        collected.add(name, [], [], {})
        return
    if not isinstance(group, dict):
        raise ConfigError(f"{path}: {where}: a group must be a mapping with hosts/children/vars")
    unknown = sorted(set(group) - _GROUP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: {where}.{unknown[0]}: unknown key", "a group has only hosts, children and vars")
    group_vars = group.get("vars") or {}
    if not isinstance(group_vars, dict):
        raise ConfigError(f"{path}: {where}.vars: must be a mapping")
    hosts = group.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise ConfigError(f"{path}: {where}.hosts: must be a mapping of host name to vars")
    names: list[str] = []
    for pattern, host_vars in hosts.items():
        if host_vars is not None and not isinstance(host_vars, dict):
            raise ConfigError(f"{path}: {where}.hosts.{pattern}: must be a mapping of vars")
        for host_name in _host_names(path, where, pattern):
            if not _HOST_NAME_RE.match(host_name):
                raise ConfigError(f"{path}: {where}.hosts: {host_name!r} is not a valid host name",
                                  "letters, digits, `.`, `_` and `-`; a range is written gpu[1:8]")
            collected.host_vars[host_name] = {**collected.host_vars.get(host_name, {}), **(host_vars or {})}
            names.append(host_name)
    children = group.get("children") or {}
    if not isinstance(children, dict):
        raise ConfigError(f"{path}: {where}.children: must be a mapping of group name to group")
    collected.add(name, names, [str(child_name) for child_name in children], group_vars)
    for child_name, child in children.items():
        _walk_group(path, f"{where}.children.{child_name}", child, str(child_name), collected)


def _host_names(path: Path, where: str, pattern: Any) -> list[str]:
    """The hosts a key of `hosts:` names: itself, or each host of a range (gpu[1:8])."""
    if not isinstance(pattern, str):
        raise ConfigError(f"{path}: {where}.hosts: {pattern!r} is not a valid host name")
    try:
        return expand_host_pattern(pattern)
    except ValueError as error:
        raise ConfigError(f"{path}: {where}.hosts: {error}") from None


def _vars_layers(path: Path, collected: _Collected, group_files: dict[str, list[tuple[Path, dict[str, Any]]]],
                 host: str, member_of: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    """A host's vars with the file each came from, in Ansible's precedence, weakest first: the inventory file's group
    vars, group_vars/ files (all, then the host's groups), the inventory file's host vars, host_vars/ files."""
    ordered = collected.precedence(member_of)
    return [*((path, collected.group_vars.get(group, {})) for group in ordered),
            *(layer for group in ordered for layer in group_files[group]),
            (path, collected.host_vars[host]), *read_vars_files(path.parent / "host_vars", host)]


def _host_vars(source: str, layers: list[tuple[Path, dict[str, Any]]]
               ) -> tuple[dict[str, Any], dict[str, Path], HostVars]:
    """The merged vars, the file each came from, and what this tool reads of them; ConfigError names the file the
    wrong value came from."""
    merged: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for file, layer in layers:
        merged |= layer
        origin |= dict.fromkeys(layer, file)
    try:
        return merged, origin, HostVars.model_validate(merged)
    except ValidationError as err:
        first_key = str(err.errors()[0]["loc"][0]) if err.errors()[0]["loc"] else ""
        raise ConfigError(format_validation_error(f"{origin.get(first_key, layers[0][0])}: {source}", err)) \
            from None


def load_inventory(path: Path, environ: Mapping[str, str] = os.environ) -> Inventory:
    """An Ansible inventory (YAML, or INI for any other file name) with the group_vars/ and host_vars/ beside it;
    each host's address through the ssh config (`ssh_target`). A directory is its hosts file (`inventory_file`)."""
    path = inventory_file(path)
    raw = read_inventory_source(path)
    if set(raw) != {"all"}:
        extra = sorted(set(raw) - {"all"})
        raise ConfigError(f"{path}: top level must be `all:` only" + (f", found {extra[0]!r}" if extra else ""),
                          "Ansible YAML inventory: all: {hosts:, children:, vars:}")
    collected = _Collected()
    _walk_group(path, "all", raw["all"], "all", collected)
    collected.add("all", list(collected.host_vars), [], {})  # `all` holds every host, wherever it was written
    groups = collected.resolve(path)
    group_files = {group: read_vars_files(path.parent / "group_vars", group) for group in groups}
    configs: dict[Path | None, paramiko.SSHConfig] = {}
    hosts = {}
    for name in collected.host_vars:
        member_of = [group for group, members in groups.items() if name in members]
        host_vars, origin, parsed = _host_vars(f"host {name}",
                                               _vars_layers(path, collected, group_files, name, member_of))
        if parsed.profile and ("/" in parsed.profile or parsed.profile.endswith(".yaml")):
            parsed = parsed.model_copy(update={"profile": str(expand_local_path(parsed.profile, path))})
        config_path = ssh_config_path(parsed.ssh_config_file, path, environ)
        alias = parsed.ansible_host or name
        hostname = config_hostname(configs.setdefault(config_path, read_ssh_config(config_path)), alias, config_path)
        hosts[name] = Host(name=name, groups=tuple(member_of), vars=parsed,
                           warnings=_ignored_vars(origin, name, host_vars), var_files=origin,
                           config_hostname=hostname if hostname != alias else None)
    if not hosts:
        raise ConfigError(f"{path}: no hosts defined")
    unmatched = _unmatched_vars(path, groups, hosts)
    hosts = {name: host.model_copy(update={"warnings": (*host.warnings, *unmatched)}) for name, host in hosts.items()}
    return Inventory(path=path, hosts=hosts, groups=groups)


def _unmatched_vars(path: Path, groups: Mapping[str, Any], hosts: Mapping[str, Any]) -> tuple[str, ...]:
    """A group_vars/ or host_vars/ file of no group or host of the inventory: its vars apply to nothing."""
    return tuple(f"{file}: {path} has no {kind} {name!r}, so these vars apply to no host{did_you_mean(name, known)}"
                 for kind, folder, known in (("group", "group_vars", groups), ("host", "host_vars", hosts))
                 for file, name in unmatched_vars_files(path.parent / folder, known))


def _ignored_vars(origin: dict[str, Path], host: str, host_vars: dict[str, Any]) -> tuple[str, ...]:
    """An ansible_* var this tool does not read, or any var close to one it does, is most likely a typo: named with
    the file it is written in."""
    warnings = []
    for name in sorted(set(host_vars) - set(READ_VARS)):
        suggestion = did_you_mean(name, READ_VARS, cutoff=0.85)  # ansible_ names share a long prefix
        if name.startswith("ansible_") or suggestion:
            warnings.append(f"{origin[name]}: host {host}: {name} is not a var sglang-deploy reads, so it is ignored"
                            f"{suggestion}")
    return tuple(warnings)


def expand_local_path(value: str, relative_to: Path) -> Path:
    """A path from the inventory on this machine: ~ expanded, relative to the inventory file."""
    expanded = Path(os.path.expanduser(value))
    return expanded if expanded.is_absolute() else (relative_to.parent / expanded)


def ssh_target(inventory_path: Path, host: Host, accept_new_host_key: bool, environ: Mapping[str, str]) -> SSHTarget:
    """How to reach the host: its inventory vars (paths relative to the inventory), over what the ssh config says
    for its address (remote/ssh_config.py)."""
    hv = host.vars
    config_path = ssh_config_path(hv.ssh_config_file, inventory_path, environ)
    given = GivenSSH(
        user=hv.ansible_user, port=hv.ansible_port, proxy_jump=hv.proxy_jump_value,
        proxy_command=hv.proxy_command_value,
        key_file=expand_local_path(hv.ansible_ssh_private_key_file, inventory_path)
        if hv.ansible_ssh_private_key_file else None,
        known_hosts_file=expand_local_path(hv.known_hosts_file, inventory_path) if hv.known_hosts_file else None,
        connect_timeout_s=hv.connect_timeout_s, accept_new_host_key=accept_new_host_key)
    return resolve_ssh_target(host.ssh_alias, given, read_ssh_config(config_path), config_path)


def check_profile_fits_host(profile: Profile, host: Host, profile_source: Path) -> None:
    """What can be checked before SSH: the GPU count the inventory declares (named where it is written) against the
    GPUs the profile's layout needs on each node (tp x dp x pp, over its nodes)."""
    declared = host.vars.gpu_count
    if declared is None:
        return
    parallel = profile.parallel
    needed = parallel.gpus_per_node
    where = f"{host.var_files.get('gpu_count', 'the inventory')}: host {host.name}: gpu_count"
    if declared == 0:
        raise ConfigError(f"{where}: 0 declares a host without GPUs, and {profile_source} needs {needed}",
                          "set gpu_count to the host's GPUs (`nvidia-smi -L` lists them), or deploy to a host with "
                          "GPUs")
    if needed <= declared:
        return
    raise ConfigError(f"{profile_source}: parallel: {parallel.shape} needs {needed} GPUs per node, host "
                      f"{host.name} has {declared} ({where})", parallel.fitting(declared))

