"""Ansible-style YAML inventory (all / hosts / children / vars): hosts, their connection settings and GPU facts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from deploy_lib.errors import ConfigError
from deploy_lib.profile import AbsPath, Profile, format_validation_error
from deploy_lib.yaml_io import load_yaml_mapping

_GROUP_KEYS = {"hosts", "children", "vars"}
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,253}$")


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
    venv: AbsPath | None = Field(None, description="overrides the profile's service.venv on this host")


class Host(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    groups: tuple[str, ...]
    vars: HostVars

    @property
    def address(self) -> str:
        return self.vars.ansible_host or self.name


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: Path
    hosts: dict[str, Host]

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


def _walk_group(path: Path, where: str, group: Any, inherited: dict[str, Any], groups: tuple[str, ...],
                found: dict[str, tuple[tuple[str, ...], dict[str, Any]]]) -> None:
    if group is None:
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
        prev_groups, prev_vars = found.get(host_name, ((), {}))
        found[host_name] = ((*prev_groups, *groups), {**prev_vars, **scope, **(host_vars or {})})
    children = group.get("children") or {}
    if not isinstance(children, dict):
        raise ConfigError(f"{path}: {where}.children: must be a mapping of group name to group")
    for child_name, child in children.items():
        _walk_group(path, f"{where}.children.{child_name}", child, scope, (*groups, child_name), found)


def load_inventory(path: Path) -> Inventory:
    raw = load_yaml_mapping(path)
    if set(raw) != {"all"}:
        extra = sorted(set(raw) - {"all"})
        raise ConfigError(f"{path}: top level must be `all:` only" + (f", found {extra[0]!r}" if extra else ""),
                          "Ansible YAML inventory: all: {hosts:, children:, vars:}")
    found: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
    _walk_group(path, "all", raw["all"], {}, ("all",), found)
    hosts = {}
    for name, (groups, host_vars) in found.items():
        try:
            parsed = HostVars.model_validate(host_vars)
        except ValidationError as err:
            raise ConfigError(format_validation_error(f"{path}: host {name}", err)) from None
        hosts[name] = Host(name=name, groups=tuple(dict.fromkeys(groups)), vars=parsed)
    if not hosts:
        raise ConfigError(f"{path}: no hosts defined")
    return Inventory(path=path, hosts=hosts)


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
