"""What `sglang-deploy init` writes: a project for the user's own model and host (a profile of only what differs
from SGLang's defaults, an inventory of one host), or a bundled example. Pure but for `write_project`; nothing is
looked up on a host or a model hub."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from deploy_lib.deploy.project import DEFAULT_INVENTORY
from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.inventory.model import HostVars
from deploy_lib.profile import Profile

HOST_NAME = "gpu1"  # the inventory's one host: `--host gpu1`, or no --host at all while it is the only one
EXAMPLES = ("glm5-nvfp4",)  # the bundled example projects: the reference rig's profile and inventory
PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

GITIGNORE = """\
# local state of this sglang-deploy project, never shared
.env
.venv/
__pycache__/
"""
PROFILE_HEADER = ("# An SGLang server for sglang-deploy. Only what differs from SGLang's defaults; every key:\n"
                  "# `sglang-deploy schema`. `sglang-deploy render {name}` shows the command line it becomes.\n")
INVENTORY_HEADER = ("# Your GPU hosts, as an Ansible inventory (YAML). `profile` is what a host runs when a command\n"
                    "# names no --profile.\n")
HOST_NEEDS = ("SGLang installed in a virtual environment at {venv} (the profile's service.venv), or a lock to build "
              "one from (service.venv_build: `invoke docs venvs`); the first `invoke plan` checks it",
              "python3, systemd and nvidia-smi",
              "SSH login with a key, as root or as a user with passwordless sudo")


@dataclass(frozen=True)
class ModelRequest:
    """`init --model M --gpus N --host ADDRESS [--user U] [--venv PATH] [--name NAME]`, as given (None: not given)."""

    model: str | None
    gpus: int
    address: str | None
    user: str | None = None
    venv: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class NewProject:
    """The files of a new project by path under its root, the profile it is for, and what its host must have."""

    files: dict[str, str]
    profile: str
    host_needs: tuple[str, ...]


def _refused(err: ValidationError, flags: dict[str, str]) -> ConfigError:
    """A pydantic error on what init composed, told as the option the value came from."""
    lines = []
    for item in err.errors():
        key = ".".join(str(part) for part in item["loc"])
        flag = flags.get(key, key)
        lines.append(f"init {flag} {item['input']!r}: {item['msg'].removeprefix('Value error, ')}")
    return ConfigError("\n".join(lines), "sglang-deploy init --help lists what each option takes")


def _validated(model: type[BaseModel], data: dict[str, Any], flags: dict[str, str]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _refused(err, flags) from None


def profile_name(model: str) -> str:
    """A profile's name from its model: the repo's (or the directory's) last part, in lower case."""
    last = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9._-]+", "-", last).strip("-._") or "model"


def new_project(example: str | None, request: ModelRequest) -> NewProject:
    """`init`: the example asked for, else the user's model on their host; both, or neither, is refused."""
    if example is not None:
        if request.model is not None or request.address is not None:
            raise ConfigError("init takes --model or --example, not both",
                              "sglang-deploy init --example glm5-nvfp4 writes the example as it is")
        return for_example(example)
    return for_model(request)


def for_model(request: ModelRequest) -> NewProject:
    """A profile of the model on `gpus` GPUs (tensor parallelism) and an inventory with the host at `address`;
    every value is checked by the same models that read the files back, so what is written loads."""
    if request.model is None or request.address is None:
        raise ConfigError("init needs your model and your host: --model and --host",
                          "sglang-deploy init --model Qwen/Qwen3-8B --gpus 1 --host 192.0.2.10 "
                          "(or init --example glm5-nvfp4 for the reference rig)")
    # metrics on: every release serves /metrics, which the watch, `workload` and `status` read (issue 42)
    profile: dict[str, Any] = {"model": {"path": request.model}, "parallel": {"tp": request.gpus},
                               "features": {"metrics": True}}
    if request.venv is not None:
        profile["service"] = {"venv": request.venv}
    checked = _validated(Profile, profile, {"model.path": "--model", "model": "--model", "parallel.tp": "--gpus",
                                            "service.venv": "--venv"})
    name = request.name if request.name is not None else profile_name(request.model)
    if not PROFILE_NAME.match(name):
        raise ConfigError(f"init --name {name!r}: a profile's name is lower-case letters, digits, '.', '_' and '-', "
                          "starting with a letter or digit", "give --name NAME, e.g. --name qwen3-8b")
    host: dict[str, Any] = {"ansible_host": request.address}
    if request.user is not None:
        host["ansible_user"] = request.user
    host |= {"gpu_count": request.gpus, "profile": name}
    _validated(HostVars, host, {"ansible_host": "--host", "ansible_user": "--user", "gpu_count": "--gpus"})
    inventory = {"all": {"hosts": {HOST_NAME: host}}}
    files = {f"inventory/profiles/{name}.yaml": PROFILE_HEADER.format(name=name) + _dump(profile),
             DEFAULT_INVENTORY: INVENTORY_HEADER + yaml.safe_dump(inventory, sort_keys=False),
             ".gitignore": GITIGNORE}
    return NewProject(files, name, tuple(need.format(venv=checked.service.venv) for need in HOST_NEEDS))


def _dump(profile: dict[str, Any]) -> str:
    """One line per section, as a person writes a short profile: `model: {path: Qwen/Qwen3-8B}`."""
    return yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=120)


def for_example(name: str) -> NewProject:
    """A bundled example: the reference rig's profile and its inventory."""
    from deploy_lib.bundled import STARTER_DIR
    if name not in EXAMPLES:
        raise ConfigError(f"init --example {name!r}: no such example{did_you_mean(name, EXAMPLES)}",
                          f"the examples: {', '.join(EXAMPLES)}")
    profile = (STARTER_DIR / "profiles" / f"{name}.yaml").read_text()
    venv = Profile.model_validate(yaml.safe_load(profile)).service.venv
    return NewProject({DEFAULT_INVENTORY: (STARTER_DIR / "hosts.example.yaml").read_text(),
                       f"inventory/profiles/{name}.yaml": profile, ".gitignore": GITIGNORE},
                      name, tuple(need.format(venv=venv) for need in HOST_NEEDS))


def write_project(root: Path, project: NewProject) -> list[Path]:
    """The project's files under `root`; refused, with nothing written, when any of them exists already."""
    files = {root / name: text for name, text in project.files.items()}
    existing = [str(path) for path in files if path.exists()]
    if existing:
        raise ConfigError(f"{', '.join(existing)} exist(s) already; init writes a new project and overwrites nothing",
                          "run `sglang-deploy init` in an empty directory, or edit the existing files")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


__all__ = ["EXAMPLES", "HOST_NAME", "ModelRequest", "NewProject", "for_example", "for_model", "new_project",
           "profile_name", "write_project"]
