"""A server run by hand, as `invoke adopt` reads it (pure): its process from /proc, the venv its interpreter belongs
to, and the profile that reproduces it.

Its arguments go back to profile keys through the same table the renderer writes them from (server_args.ARGS, with
the versioned spellings), matched by the installed parser's own destinations, so `--model`, `--tp 8` and a
deprecated spelling land on the right key; what no key models stays in extra_args as written. A `--config FILE`
command is read as SGLang reads it (facts/sglang_config.py), and a repeated option keeps its last value. Secret-looking
environment values and `--api-key` become `{env: NAME}` references. deploy_lib/commands/adopt.py reads the host and
records release 0.
"""


from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.profile import NCCL_ENV, SECRET_NAME_RE, Profile
from deploy_lib.profile.credentials import looks_like_credential
from deploy_lib.release.argv_check import ParsedArg, convert_value, find_option, parse_argv
from deploy_lib.release.model import argv_options
from deploy_lib.release.server_args import API_KEY_ENV, ARGS, Arg, arg_tokens
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Fact, Readings
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

STEP_EXISTS = "adopt: process exists"
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


def _nul_separated(text: str) -> list[str]:
    return text.split("\0")[:-1] if text.endswith("\0") else text.split("\0")


def _environment(result: StepResult) -> dict[str, str]:
    return dict(item.split("=", 1) for item in _nul_separated(result.stdout) if "=" in item)


def _line(result: StepResult) -> str:
    return result.stdout.strip()


@dataclass(frozen=True)
class ProcessFacts:
    """The /proc reads of one process, one round trip: whether it exists, its argv, environment (secret: never
    shown), working directory and user. A read of a process that is gone finds nothing (not an error), and
    `process` says so."""

    pid: int

    @property
    def exists(self) -> Fact[bool]:
        return Fact(Step(STEP_EXISTS, ("test", "-r", f"/proc/{self.pid}/cmdline"), ok=ABSENT_OK),
                    lambda result: result.exit_code == 0)

    @property
    def cmdline(self) -> Fact[tuple[str, ...]]:
        return Fact(self._read(STEP_CMDLINE, ("cat", "--", f"/proc/{self.pid}/cmdline")),
                    lambda result: tuple(_nul_separated(result.stdout)))

    @property
    def environ(self) -> Fact[dict[str, str]]:
        return Fact(self._read(STEP_ENVIRON, ("cat", "--", f"/proc/{self.pid}/environ"), secret=True), _environment)

    @property
    def cwd(self) -> Fact[str]:
        return Fact(self._read(STEP_CWD, ("readlink", "--", f"/proc/{self.pid}/cwd")), _line)

    @property
    def user(self) -> Fact[str]:
        return Fact(self._read(STEP_USER, ("stat", "-c", "%U", "--", f"/proc/{self.pid}")), _line)

    def facts(self) -> list[Fact[Any]]:
        return [self.exists, self.cmdline, self.environ, self.cwd, self.user]

    def process(self, found: Readings, where: str) -> HandProcess:
        if not found.value(self.exists):
            raise PreflightError(f"{where}: no process {self.pid} on the host",
                                 "`pgrep -af sglang.launch_server` on the host lists the running servers")
        return HandProcess(self.pid, found.value(self.cmdline), found.value(self.environ), found.value(self.cwd),
                           found.value(self.user))

    @staticmethod
    def _read(name: str, argv: tuple[str, ...], secret: bool = False) -> Step:
        return Step(name, argv, sudo=True, ok=ABSENT_OK, secret=secret)


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


def interpreter_fact(candidates: Sequence[str], where: str) -> Fact[tuple[str, str]]:
    """Which candidates exist, and which of their directories' parents are venvs (pyvenv.cfg): `choose_venv`."""
    venvs = [posixpath.join(posixpath.dirname(posixpath.dirname(c)), "pyvenv.cfg") for c in candidates]
    return Fact(Step(STEP_INTERPRETER, ("ls", "-d", "--", *candidates, *venvs), sudo=True, ok=frozenset({0, 1, 2})),
                lambda result: choose_venv(candidates, result.stdout, where))


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
        elif SECRET_NAME_RE.search(name) or looks_like_credential(value) is not None:
            secrets[name] = value  # by its name or by its value: the profile refuses either in env
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


# argparse actions that add up over repeats; every other option keeps its last value
ACCUMULATING_ACTIONS = frozenset({"append", "append_const", "count", "extend"})


def last_wins(parsed: Sequence[ParsedArg]) -> list[ParsedArg]:
    """The arguments without those a later one of the same option overrides, as argparse reads them."""
    last = {str(p.record["dest"]): index for index, p in enumerate(parsed)
            if p.record is not None and p.record.get("action") not in ACCUMULATING_ACTIONS}
    return [p for index, p in enumerate(parsed)
            if p.record is None or last.get(str(p.record["dest"]), index) == index]


def adopt_profile(process: HandProcess, launch: Launch, venv: str, options: Mapping[str, dict[str, Any]],
                  sglang_version: str, description: str, service: str = "sglang",
                  merged_args: Sequence[str] | None = None) -> AdoptedProfile:
    """The profile that reproduces the process (pure): a key per modelled argument, the rest in extra_args.
    `merged_args`: what SGLang parsed when the command names a `--config` file (facts/sglang_config.py); release 0
    still runs the command as written."""
    as_written, _ = parse_argv(dict(options), list(launch.args))
    parsed = last_wins(as_written if merged_args is None else parse_argv(dict(options), list(merged_args))[0])
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
    launch_args = tuple(token for p in _api_key(as_written)[1] for token in p.tokens)
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

def profile_yaml(profile: Profile, header: str) -> str:
    body = yaml.safe_dump(profile.model_dump(mode="json", exclude_defaults=True), sort_keys=False, width=100)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body
