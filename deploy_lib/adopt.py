"""`invoke adopt`: take over a server that runs by hand as release 0 and write the profile that reproduces it.

Read-only first: the process's argv, environment, working directory and user (/proc/PID), the venv its interpreter
belongs to, and the options of the SGLang installed there. Its arguments go back to profile keys through the same
table the renderer writes them from (server_args.ARGS, with the versioned spellings), matched by the installed
parser's own destinations, so `--model`, `--tp 8` and a deprecated spelling land on the right key; what no key
models stays in extra_args as written. Secret-looking environment values and `--api-key` become `{env: NAME}`
references: their values go only into release 0's env file on the host (0600), never into the profile.

Release 0 runs exactly the adopted command (its own arguments, as written) from the same venv, directory, user and
environment, under the tool's unit. While the hand-run process still holds the port, the first managed deploy
stops it (SIGTERM, as Ctrl-C or `systemctl stop` would) before starting its release; a failed deploy rolls back
to release 0.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deploy_lib.deploy import keep_replaced_unit
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts import HostFacts, parse_systemctl_show, read_host_facts
from deploy_lib.profile import NCCL_ENV, SECRET_NAME_RE, LoadedProfile, Profile
from deploy_lib.project import Target
from deploy_lib.readings import ABSENT_OK, Readings
from deploy_lib.release import argv_options, build_release
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.server_args import API_KEY_ENV, ARGS, Arg, arg_tokens
from deploy_lib.sglang_options import ParsedArg, convert_value, find_option, parse_argv
from deploy_lib.store import (
    HEALTHY,
    Tags,
    append_history,
    history_entry,
    host_lock,
    operator_name,
    release_json,
    stage_release,
    switch_current,
)
from deploy_lib.versions import SPELLINGS

RELEASE_ZERO = "0"
LAUNCH_MODULE = "sglang.launch_server"
# Set by a login shell, a terminal, SSH or systemd for the process that started the server: not the server's setup.
SESSION_ENVIRONMENT = frozenset({
    "_", "COLORTERM", "DBUS_SESSION_BUS_ADDRESS", "HOME", "INVOCATION_ID", "JOURNAL_STREAM", "LESSCLOSE", "LESSOPEN",
    "LOGNAME", "LS_COLORS", "MAIL", "MANAGERPID", "MOTD_SHOWN", "OLDPWD", "PS1", "PWD", "SHELL", "SHLVL",
    "SSH_AUTH_SOCK", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "STY", "SYSTEMD_EXEC_PID", "TERM", "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION", "TMUX", "TMUX_PANE", "USER", "WINDOW", "XDG_RUNTIME_DIR", "XDG_SESSION_CLASS",
    "XDG_SESSION_ID", "XDG_SESSION_TYPE",
})
# The venv's own activation: the profile has service.venv for it; release 0 keeps the values it ran with.
VENV_ENVIRONMENT = ("PATH", "VIRTUAL_ENV")

STEP_CMDLINE = "adopt: command line"
STEP_ENVIRON = "adopt: environment"
STEP_CWD = "adopt: working directory"
STEP_USER = "adopt: user"
STEP_INTERPRETER = "adopt: interpreter and venv"


@dataclass(frozen=True)
class HandProcess:
    """What /proc says about the running server."""

    pid: int
    argv: tuple[str, ...]
    environ: Mapping[str, str]
    cwd: str
    user: str


def process_steps(pid: int) -> list[Step]:
    proc = f"/proc/{pid}"
    return [Step(STEP_CMDLINE, ("cat", "--", f"{proc}/cmdline"), sudo=True),
            Step(STEP_ENVIRON, ("cat", "--", f"{proc}/environ"), sudo=True, secret=True),
            Step(STEP_CWD, ("readlink", "--", f"{proc}/cwd"), sudo=True),
            Step(STEP_USER, ("stat", "-c", "%U", "--", proc), sudo=True)]


def _nul_separated(text: str) -> list[str]:
    return text.split("\0")[:-1] if text.endswith("\0") else text.split("\0")


def parse_process(pid: int, results: Sequence[StepResult]) -> HandProcess:
    found = Readings.of(results)
    environ = dict(item.split("=", 1) for item in _nul_separated(found.stdout(STEP_ENVIRON)) if "=" in item)
    return HandProcess(pid, tuple(_nul_separated(found.stdout(STEP_CMDLINE))), environ,
                       found.stdout(STEP_CWD).strip(), found.stdout(STEP_USER).strip())


@dataclass(frozen=True)
class Launch:
    """The command split into interpreter and SGLang arguments."""

    interpreter: str                 # argv[0] as written
    args: tuple[str, ...]            # after `-m sglang.launch_server`
    unbuffered: bool                 # `python -u`: the profile says PYTHONUNBUFFERED=1


def split_launch(process: HandProcess, where: str) -> Launch:
    argv = process.argv
    try:
        module_at = argv.index("-m")
    except ValueError:
        module_at = -1
    options = argv[1:module_at] if module_at > 0 else ()
    if module_at < 1 or module_at + 1 >= len(argv) or argv[module_at + 1] != LAUNCH_MODULE \
            or any(option != "-u" for option in options):
        raise PreflightError(f"{where}: pid {process.pid} is not `python -m {LAUNCH_MODULE} ...`: "
                             f"{' '.join(argv)[:300]}",
                             "adopt the SGLang server process itself (`pgrep -af sglang.launch_server` lists it)")
    return Launch(argv[0], argv[module_at + 2:], "-u" in options)


def interpreter_candidates(process: HandProcess, interpreter: str) -> list[str]:
    """Where argv[0] may be: itself if it names a path (from the process's directory), else on its PATH, in order."""
    if "/" in interpreter:
        return [posixpath.normpath(posixpath.join(process.cwd, interpreter))]
    return [posixpath.join(directory or ".", interpreter)
            for directory in process.environ.get("PATH", "").split(":") if directory.startswith("/")]


def interpreter_step(candidates: Sequence[str]) -> Step:
    """Which candidates exist, and which of their directories' parents are venvs (pyvenv.cfg)."""
    venvs = [posixpath.join(posixpath.dirname(posixpath.dirname(c)), "pyvenv.cfg") for c in candidates]
    return Step(STEP_INTERPRETER, ("ls", "-d", "--", *candidates, *venvs), sudo=True, ok=frozenset({0, 1, 2}))


def choose_venv(candidates: Sequence[str], ls_out: str, where: str) -> tuple[str, str]:
    """(interpreter path, venv) the way the shell that started the server resolved argv[0]: the first that exists."""
    existing = set(ls_out.splitlines())
    interpreter = next((c for c in candidates if c in existing), None)
    if interpreter is None:
        raise PreflightError(f"{where}: cannot find the server's interpreter (looked at {', '.join(candidates)})")
    venv = posixpath.dirname(posixpath.dirname(interpreter))
    if posixpath.join(venv, "pyvenv.cfg") not in existing:
        raise PreflightError(f"{where}: the server runs {interpreter}, which is not in a venv",
                             "the tool runs SGLang from a venv; create one with SGLang and start the server from it")
    return interpreter, venv


# ---------------------------------------------------------------------------------------------------------------
# Arguments -> profile keys


@dataclass(frozen=True)
class Mapped:
    """A profile key read from the command line, and the arguments it came from."""

    key: str
    value: Any
    parsed: tuple[ParsedArg, ...]


def _dest(options: Mapping[str, dict[str, Any]], flag: str) -> str | None:
    record = find_option(dict(options), flag)
    return str(record["dest"]) if record else None


def _spellings(arg: Arg) -> list[tuple[tuple[str, str], ...]]:
    """Each way `arg` has been written, as (flag, value) pairs ('{}' for the key's value, '' for a switch)."""
    if arg.setting is None:
        return [((str(arg.flag), "" if arg.switch else "{}"),)]
    return [tuple(argv_options(spelling.argv).items()) for spelling in SPELLINGS[arg.setting]]


def map_arguments(options: Mapping[str, dict[str, Any]], parsed: Sequence[ParsedArg]
                  ) -> tuple[list[Mapped], list[ParsedArg]]:
    """Profile keys from the arguments as the installed SGLang parsed them, and what no key models (in order)."""
    by_dest = {str(p.record["dest"]): p for p in parsed if p.record is not None}
    mapped: list[Mapped] = []
    for arg in ARGS:
        for pairs in _spellings(arg):
            dests = [_dest(options, flag) for flag, _ in pairs]
            found = [by_dest.get(dest) if dest else None for dest in dests]
            if not all(found) or any(value not in ("{}", "", " ".join(p.values)) for (_, value), p in
                                     zip(pairs, found, strict=True) if p is not None):
                continue
            given = [p for p in found if p is not None]
            if arg.switch:
                mapped.append(Mapped(arg.key, arg.on, tuple(given)))
            else:
                value = convert_value(" ".join(given[0].values), (given[0].record or {}).get("type"))
                mapped.append(Mapped(arg.key, value, tuple(given)))
            break
    used = {id(p) for m in mapped for p in m.parsed}
    return mapped, [p for p in parsed if id(p) not in used]


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    *sections, last = key.split(".")
    for section in sections:
        data = data.setdefault(section, {})
    data[last] = value


@dataclass(frozen=True)
class Environment:
    env: dict[str, str]
    nccl: dict[str, str]
    secrets: dict[str, str]          # name -> value (the value goes only to the host's env file)
    venv: dict[str, str]             # PATH, VIRTUAL_ENV as the process had them


def split_environment(environ: Mapping[str, str], unbuffered: bool) -> Environment:
    nccl_keys = {name: key for key, name in NCCL_ENV.items()}
    env, nccl, secrets, venv = {}, {}, {}, {}
    for name, value in environ.items():
        if name in SESSION_ENVIRONMENT:
            continue
        if name in VENV_ENVIRONMENT:
            venv[name] = value
        elif SECRET_NAME_RE.search(name):
            secrets[name] = value
        elif name in nccl_keys:
            nccl[nccl_keys[name]] = value
        else:
            env[name] = value
    if unbuffered:
        env.setdefault("PYTHONUNBUFFERED", "1")
    return Environment(env, nccl, secrets, venv)


@dataclass(frozen=True)
class AdoptedProfile:
    profile: Profile
    launch_args: tuple[str, ...]     # release 0's arguments: as written, without --api-key
    secrets: dict[str, str]          # env name -> value, for release 0's env file only
    venv_environment: dict[str, str]
    notes: tuple[str, ...]           # how the profile's render differs from the command as written


def _api_key(parsed: Sequence[ParsedArg]) -> tuple[str | None, list[ParsedArg]]:
    key = next((" ".join(p.values) for p in parsed if p.record and p.record["dest"] == "api_key"), None)
    return key, [p for p in parsed if not (p.record and p.record["dest"] == "api_key")]


def adopt_profile(process: HandProcess, launch: Launch, venv: str, options: Mapping[str, dict[str, Any]],
                  sglang_version: str, description: str, service: str = "sglang") -> AdoptedProfile:
    """The profile that reproduces the process (pure): a key per modelled argument, the rest in extra_args."""
    parsed, _ = parse_argv(dict(options), list(launch.args))
    mapped, rest = map_arguments(options, parsed)
    api_key, rest = _api_key(rest)
    environment = split_environment(process.environ, launch.unbuffered)
    secrets = dict(environment.secrets)
    data: dict[str, Any] = {"description": description,
                            "service": {"name": service, "venv": venv, "user": process.user,
                                        "working_directory": process.cwd}}
    for item in mapped:
        _set(data, item.key, item.value)
    if api_key is not None:
        data.setdefault("server", {})["api_key"] = {"env": API_KEY_ENV}
        secrets[API_KEY_ENV] = api_key
    data["env"] = environment.env
    data["nccl"] = environment.nccl
    data["secrets"] = {name: {"env": name} for name in environment.secrets}
    notes: list[str] = []
    for _ in range(len(mapped) + len(environment.nccl) + 1):  # each round moves one refused setting out
        data["extra_args"] = [token for p in rest for token in p.tokens]
        try:
            profile = Profile.model_validate(data)
        except ValidationError as err:
            location = tuple(str(part) for part in err.errors()[0]["loc"])
            moved = _move_refused(data, location, mapped, rest)
            if moved is None:
                raise ConfigError(f"pid {process.pid}: the adopted setup is not a valid profile: "
                                  f"{'.'.join(location)}: {err.errors()[0]['msg']}") from None
            notes.append(moved)
            continue
        # a value the model reads differently from NCCL (`yes` is a bool to pydantic, 0 to NCCL) stays as written
        changed = next((key for key, value in environment.nccl.items() if key in data["nccl"]
                        and profile.nccl.environment().get(NCCL_ENV[key]) != value), None)
        if changed is None:
            break
        notes.append(_move_refused(data, ("nccl", changed), mapped, rest) or "")
    else:  # pragma: no cover - every round removes a setting, so validation passes or raises first
        raise AssertionError("unreachable")
    by_key = {arg.key: arg for arg in ARGS}
    for item in mapped:
        written = tuple(token for p in item.parsed for token in p.tokens)
        rendered = arg_tokens(profile, by_key[item.key], sglang_version)
        if written != rendered:
            notes.append(f"{' '.join(written)} is written {' '.join(rendered) or '(default, not written)'}")
    launch_args = tuple(token for p in _api_key(parsed)[1] for token in p.tokens)
    return AdoptedProfile(profile, launch_args, secrets, environment.venv, tuple(notes))


def _move_refused(data: dict[str, Any], location: tuple[str, ...], mapped: list[Mapped], rest: list[ParsedArg]
                  ) -> str | None:
    """Take a setting the profile model refuses back out: an argument to extra_args, an NCCL value to env."""
    key = ".".join(location[:2])
    item = next((m for m in mapped if m.key == key), None)
    if item is not None:
        mapped.remove(item)
        section = data[location[0]]
        section.pop(location[1], None)
        rest.extend(item.parsed)
        return f"{key}: {' '.join(t for p in item.parsed for t in p.tokens)} kept in extra_args (not a value the " \
               "profile models)"
    if location[0] == "nccl" and len(location) > 1 and location[1] in data["nccl"]:
        name = NCCL_ENV[location[1]]
        data["env"][name] = data["nccl"].pop(location[1])
        return f"{name} kept in env as written (nccl.{location[1]} would not write it the same)"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Acting: read the host, record release 0


@dataclass(frozen=True)
class Adopted:
    """What `invoke adopt` did: release 0 on the host, and the profile text to write on this machine."""

    host: str
    pid: int
    release_id: str
    profile_name: str
    profile_text: str
    sglang_version: str
    venv: str
    notes: tuple[str, ...]
    secret_names: tuple[str, ...]


def read_process(remote: Remote, pid: int, where: str) -> HandProcess:
    results = remote.run([Step("adopt: process exists", ("test", "-r", f"/proc/{pid}/cmdline"), ok=ABSENT_OK)])
    if results[0].exit_code != 0:
        raise PreflightError(f"{where}: no process {pid} on the host",
                             "`pgrep -af sglang.launch_server` on the host lists the running servers")
    return parse_process(pid, remote.run(process_steps(pid)))


def _refuse_managed(facts: HostFacts, target: Target, service: str, from_unit: bool) -> None:
    layout = target.layout(service)
    if facts.store.current or facts.store.releases:
        raise ConfigError(f"{target.host.name}: service {service} is already managed (current release "
                          f"{facts.store.current or 'none'})", "adopt under another --service name, or "
                          "`invoke uninstall` first")
    if not from_unit and (facts.unit_link is not None or facts.unit.load_state == "loaded"):
        raise PreflightError(f"{target.host.name}: a unit {layout.unit_name} already exists ({layout.unit_link})",
                             f"adopt that unit with --unit {layout.service}, or give --service a name no unit uses")


STEP_UNIT = "adopt: unit"


def read_unit(remote: Remote, unit_name: str, where: str) -> tuple[int, str, str]:
    """(main pid, unit file path, its text) of a running hand-written unit."""
    [shown] = remote.run([Step(STEP_UNIT, ("systemctl", "show", "-p", "MainPID,FragmentPath,ActiveState", "--",
                                           unit_name))])
    props = parse_systemctl_show(shown.stdout)
    pid, fragment = props.get("MainPID", "0"), props.get("FragmentPath", "")
    if props.get("ActiveState") != "active" or not pid.isdigit() or pid == "0" or not fragment:
        raise PreflightError(f"{where}: unit {unit_name} is not running (ActiveState={props.get('ActiveState')}, "
                             f"MainPID={pid})", "start it first, or adopt a hand-run process with --pid")
    [text] = remote.run([Step("adopt: unit file", ("cat", "--", fragment), sudo=True)])
    return int(pid), fragment, text.stdout


def profile_yaml(profile: Profile, header: str) -> str:
    body = yaml.safe_dump(profile.model_dump(mode="json", exclude_defaults=True), sort_keys=False, width=100)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def adopt(target: Target, service: str, remote: Remote, profile_name: str, pid: int | None = None,
          from_unit: bool = False, now: datetime | None = None) -> Adopted:
    """Record the server running as `pid` (or as the main process of the hand-written unit `service`, `from_unit`)
    as release 0 of `service`, and return the profile that reproduces it."""
    where, layout, now = target.host.name, target.layout(service), now or datetime.now(UTC)
    unit_file = read_unit(remote, layout.unit_name, where) if from_unit else None
    pid = unit_file[0] if unit_file else pid
    if pid is None:
        raise ConfigError("adopt needs --pid PID or --unit NAME")
    process = read_process(remote, pid, where)
    launch = split_launch(process, where)
    candidates = interpreter_candidates(process, launch.interpreter)
    interpreter, venv = choose_venv(candidates, remote.run([interpreter_step(candidates)])[0].stdout, where)
    facts = read_host_facts(remote, layout, venv, port=None)
    version = facts.sglang.sglang_version
    if version is None:
        raise PreflightError(f"{where}: no SGLang found in {venv}: {facts.sglang.error}")
    _refuse_managed(facts, target, service, from_unit)
    source = f"unit {layout.unit_name} (pid {pid})" if unit_file else f"pid {pid}"
    description = f"adopted from {source} on {where} ({now.astimezone(UTC):%Y-%m-%d %H:%M} UTC)"
    adopted = adopt_profile(process, launch, venv, facts.sglang.options, version, description, service)
    loaded = LoadedProfile(name=profile_name, path=Path(f"{profile_name}.yaml"), chain=(profile_name,),
                           profile=adopted.profile)
    release = build_release(loaded, layout, version, adopted.secrets, venv=venv,
                            flashinfer_version=facts.sglang.flashinfer_version,
                            extra_environment=adopted.venv_environment, launch_args=adopted.launch_args,
                            release_id=RELEASE_ZERO, torch_version=facts.sglang.torch_version,
                            nccl_version=facts.sglang.nccl_version)
    tags = Tags(operator_name(), where, RELEASE_ZERO, profile_name, release.profile_hash,
                {"sglang": version, **({"flashinfer": release.flashinfer_version} if release.flashinfer_version
                                       else {})})
    record: dict[str, Any] = {"interpreter": interpreter, "user": process.user, "cwd": process.cwd}
    takeover: list[Step | Put] = []
    if unit_file:
        # release 0 is the hand-written unit itself; systemd stops its process when a deploy restarts the unit
        release = replace(release, unit_text=unit_file[2])
        record |= {"unit": layout.unit_name, "unit_file": unit_file[1]}
        takeover = [*keep_replaced_unit(layout, now)[0]]
    else:
        cmdline = "".join(f"{arg}\0" for arg in process.argv).encode()
        record |= {"pid": pid, "cmdline_sha256": hashlib.sha256(cmdline).hexdigest()}
    metadata = {**release.metadata(), "adopted": record}
    reload = [Step("systemd: daemon-reload", ("systemctl", "daemon-reload"), sudo=True)] if unit_file else []
    with host_lock(remote, layout, f"adopt {source}", where):
        remote.run([*stage_release(layout, RELEASE_ZERO, release.unit_text, release.env_text,
                                   release_json(metadata, tags, now)),
                    *takeover, *switch_current(layout, RELEASE_ZERO), *reload,
                    *append_history(layout, history_entry("adopt", HEALTHY, tags, now, f"adopted {source}"))])
    how = f"--unit {service}" if unit_file else f"--pid {pid}"
    header = (f"Written by `invoke adopt {how}` on {where}: SGLang {version} in {venv}.\n"
              f"Release 0 on the host runs exactly that {'unit' if unit_file else 'command'}; deploying this "
              "profile replaces it.")
    if release.secret_names:
        header += f"\nSecrets by reference: export {', '.join(release.secret_names)} before deploying."
    return Adopted(where, pid, RELEASE_ZERO, profile_name, profile_yaml(adopted.profile, header), version, venv,
                   adopted.notes, release.secret_names)
