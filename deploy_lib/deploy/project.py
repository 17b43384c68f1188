"""Where a project's profiles and inventories are, and how a (profile, inventory, host) choice resolves."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.inventory.model import Host, Inventory, check_profile_fits_host, load_inventory, ssh_target
from deploy_lib.profile import LoadedProfile, Profile, load_profile, profile_path
from deploy_lib.profile.overrides import from_command_line
from deploy_lib.release.model import read_secret
from deploy_lib.remote import SSHTarget
from deploy_lib.remote.ssh import SudoPassword
from deploy_lib.store import StoreLayout

DEFAULT_INVENTORY = "inventory/hosts.yaml"
SANDBOX_INVENTORY = "inventory/sandbox.yaml"
PROFILE_SUFFIX = ".yaml"
PROJECT_ENV = "SGLANG_DEPLOY_PROJECT"
PATCHES_FOLDER = "patches"  # beside inventory/: the project's own patch sets, laid out as the bundled ones


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def find(cls, working_directory: Path, environ: Mapping[str, str]) -> Project:
        """The user's project: $SGLANG_DEPLOY_PROJECT (set by `--project DIR`), else the nearest directory from the
        working directory upwards that holds `inventory/`, else the working directory itself (its missing
        inventory is then named by the command that reads it). Never the tool's own install location."""
        given = environ.get(PROJECT_ENV)
        if given:
            root = _from_working_directory(given)
            if not root.is_dir():
                raise ConfigError(f"project directory {root} (${PROJECT_ENV} or --project) does not exist",
                                  "give the directory holding inventory/, or run `sglang-deploy init` in a new one")
            return cls(root)
        start = working_directory.resolve()
        return cls(next((d for d in (start, *start.parents) if (d / "inventory").is_dir()), start))

    @property
    def profiles_dir(self) -> Path:
        return self.root / "inventory" / "profiles"

    @property
    def patches_dir(self) -> Path:
        """The project's own patch sets (one folder each, as the bundled roles/<name>/); it need not exist."""
        return self.root / PATCHES_FOLDER

    @property
    def workloads_dir(self) -> Path:
        """Recorded workloads (`workload`): one YAML file each, named by the workload."""
        return self.root / "inventory" / "workloads"

    def inventory_path(self, given: str | None) -> Path:
        """A given path as the user typed it (relative: to the working directory); by default the project's."""
        return _from_working_directory(given) if given else self.root / DEFAULT_INVENTORY

    def profile_location(self, given: str) -> tuple[Path, str]:
        """(directory, name) of a profile given by name (under profiles_dir) or by path to its .yaml file."""
        if "/" in given or given.endswith(PROFILE_SUFFIX):
            path = _from_working_directory(given)
            if path.suffix != PROFILE_SUFFIX:
                raise ConfigError(f"profile {given!r}: a profile file ends in {PROFILE_SUFFIX}")
            named = self.profiles_dir / path.name
            if not path.exists() and "/" not in given and named.is_file():  # the name, typed as its file's name
                raise ConfigError(f"profile {given!r}: no file {path}; did you mean `{path.stem}`?",
                                  f"a profile is given by its name ({path.stem}: {named}) or by a path to its file")
            return path.parent, path.stem
        return self.profiles_dir, given

    def profile(self, given: str, overrides: Sequence[str] = ()) -> LoadedProfile:
        """The profile (a name or a path; `extends:` looks beside it) with `--set path=value` overrides applied, and
        a venv_build's relative lock and wheelhouse paths made absolute from the project root."""
        loaded = self._with_workload(from_command_line(load_profile(*self.profile_location(given)), overrides))
        spec = loaded.profile.service.venv_build
        if spec is None:
            return loaded
        spec = spec.model_copy(update={"lock": self.root / spec.lock,
                                       "wheelhouse": self.root / spec.wheelhouse if spec.wheelhouse else None})
        service = loaded.profile.service.model_copy(update={"venv_build": spec})
        return loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"service": service})})

    def _with_workload(self, loaded: LoadedProfile) -> LoadedProfile:
        """A profile whose bench: names a workload, with its lengths read from the workload's file."""
        from deploy_lib.metrics.workload import bench_with_workload
        bench = bench_with_workload(loaded.profile.bench, self.workloads_dir, str(loaded.path))
        if bench is loaded.profile.bench:
            return loaded
        return loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"bench": bench})})

    def inventory(self, given: str | None) -> Inventory:
        return load_inventory(self.inventory_path(given))


def _from_working_directory(given: str) -> Path:
    path = Path(given).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


@dataclass(frozen=True)
class Target:
    """One host to act on: its inventory entry and the SSH settings derived from it."""

    host: Host
    ssh: SSHTarget
    deploy_root: PurePosixPath

    @property
    def venv_override(self) -> str | None:
        return self.host.vars.venv

    def venv_of(self, profile: Profile) -> str:
        """The venv `profile` runs from on this host (one without venv_build): the host's `venv` var, else the
        profile's service.venv; deploy, status and gpu-check all resolve it here."""
        return self.venv_override or profile.service.venv

    def layout(self, service: str) -> StoreLayout:
        """Where `service`'s releases live on this host."""
        return StoreLayout(service=service, root=self.deploy_root)


def resolve_target(inventory: Inventory, host_name: str | None, accept_new_host_key: bool = False) -> Target:
    return _target(inventory, inventory.host(host_name), accept_new_host_key)


def resolve_group(inventory: Inventory, group: str, accept_new_host_key: bool = False) -> list[Target]:
    """Every host of the group (children included), in inventory order."""
    return [_target(inventory, host, accept_new_host_key) for host in inventory.group(group)]


def _target(inventory: Inventory, host: Host, accept_new_host_key: bool) -> Target:
    ssh = ssh_target(inventory.path, host, accept_new_host_key, os.environ)
    return Target(host=host, ssh=ssh, deploy_root=PurePosixPath(host.vars.deploy_root))


def with_sudo_password(target: Target, environ: Mapping[str, str], typed: Callable[[], SudoPassword]) -> SSHTarget:
    """The target's SSH settings with the sudo password its inventory's `become_password` gives: `ask` is the one
    `typed` at the terminal (the CLI asks), a secret source is read on this machine; unchanged without one."""
    given = target.host.vars.become_password
    if given is None:
        return target.ssh
    if isinstance(given, str):  # ASK_BECOME_PASSWORD, the only word the inventory's validator lets through
        return replace(target.ssh, sudo_password=typed())
    where = f"{target.host.var_files.get('become_password', 'the inventory')}: host {target.host.name}: become_password"
    return replace(target.ssh, sudo_password=SudoPassword(read_secret(where, given, environ), where))


def profile_for_host(project: Project, given: str | None, target: Target, overrides: Sequence[str] = ()
                     ) -> LoadedProfile | None:
    """The profile given, else the host's `profile` var, with `--set` overrides; checked against the host as far as
    the inventory's declared facts allow. None when neither names one."""
    chosen = given or target.host.vars.profile
    if chosen is None:
        if overrides:
            raise ConfigError(f"--set {overrides[0]!r}: no profile to set it in for {target.host.name}",
                              "give --profile NAME, or set `profile` for the host in the inventory")
        return None
    if given is None:
        _check_named_by_inventory(project, chosen, target.host)
    loaded = project.profile(chosen, overrides)
    check_profile_fits_host(loaded.profile, target.host, loaded.path)
    return loaded


def _check_named_by_inventory(project: Project, name: str, host: Host) -> None:
    """A host's `profile` var that names no profile file is the inventory's mistake: named with the file it is
    written in."""
    where = f"{host.var_files.get('profile', 'the inventory')}: host {host.name}: profile"
    try:
        path = profile_path(*project.profile_location(name))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error.message}", error.hint) from None
    if not path.exists():
        known = sorted(each.stem for each in project.profiles_dir.glob(f"*{PROFILE_SUFFIX}"))
        raise ConfigError(f"{where}: no profile {name!r} ({path}){did_you_mean(name, known)}",
                          f"known profiles: {', '.join(known) or 'none'}; give --profile NAME or fix the var")


def load_for_host(project: Project, profile_given: str | None, inventory_given: str | None, host_name: str | None,
                  accept_new_host_key: bool = False, overrides: Sequence[str] = ()) -> tuple[LoadedProfile, Target]:
    """Profile and target: the profile given, else the one the inventory names for the host, with `--set`."""
    inventory = project.inventory(inventory_given)
    target = resolve_target(inventory, host_name, accept_new_host_key)
    return load_for_target(project, profile_given, inventory, target, overrides), target


def load_for_target(project: Project, profile_given: str | None, inventory: Inventory, target: Target,
                    overrides: Sequence[str] = ()) -> LoadedProfile:
    """The profile given, else the one the inventory names for the target's host, with `--set` overrides."""
    loaded = profile_for_host(project, profile_given, target, overrides)
    if loaded is None:
        raise ConfigError(f"which profile for {target.host.name}? none was given and {inventory.path} sets no "
                          "`profile` for the host", "give --profile NAME (or a path to its .yaml file)")
    return loaded
