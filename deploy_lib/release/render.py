"""Render a release's systemd unit and environment file from typed specs, quoting by systemd's own rules.

Rules implemented here, with where systemd states them (checked against systemd 252, Debian 12):
- ExecStart= words: systemd.service(5) "Command lines" and systemd.syntax(7) "Quoting". Each word is
  C-unescaped inside double quotes, then `%` specifiers are expanded (systemd.unit(5)), then at exec time
  `$$`, `$VAR` and `${VAR}` are substituted; so `%` is written `%%` and `$` is written `$$`. A lone `;`
  separates commands, so it is always quoted.
- EnvironmentFile=: systemd.exec(5). Inside double quotes a backslash escapes only `"`, `\\`, `` ` ``
  and `$`; no specifiers and no variables are expanded.
- Single-line settings (Description=, WorkingDirectory=, ...) are taken verbatim except `%` specifiers;
  a trailing backslash would continue the line, so backslashes and control characters are refused.
- The server's launcher (`#!/bin/sh` + `exec` of its argv): every word single-quoted by POSIX sh rules (XCU 2.2.2:
  nothing inside single quotes is special; a `'` ends the quote, so it is written `'"'"'`), as `shlex.quote` does.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING

from deploy_lib.bundled import TEMPLATES_DIR
from deploy_lib.digests import HASH_CHARS, short_hash
from deploy_lib.errors import ConfigError
from deploy_lib.profile import RestartPolicy

if TYPE_CHECKING:
    import jinja2

UNIT_TEMPLATE = "sglang.service.j2"
ENV_TEMPLATE = "sglang.env.j2"
LAUNCHER_TEMPLATE = "sglang-launch.j2"
# The digest of a unit's own text, as render_digested_unit appends it to Description= (systemctl show reads it back).
UNIT_DIGEST = re.compile(rf"\(unit ([0-9a-f]{{{HASH_CHARS}}})\)$")
REDACTED = "<redacted>"

# Linux refuses an exec whose single argument or environment string exceeds MAX_ARG_STRLEN (32 pages).
MAX_ARG_BYTES = 32 * 4096 - 1
# systemd reads a unit file line (after joining continuations) up to LONG_LINE_MAX bytes.
MAX_UNIT_LINE_BYTES = 1024 * 1024
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd's strict user/group name check (valid_user_group_name without relaxation).
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
# Words made only of these need no quotes in ExecStart= (none is special to systemd's word splitter).
BARE_EXEC_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
             "\t": "\\t", "\v": "\\v", "$": "$$", "%": "%%"}
ENV_ESCAPES = {"\\": "\\\\", '"': '\\"', "`": "\\`", "$": "\\$"}


@dataclass(frozen=True)
class UnitSpec:
    """Everything the systemd unit of one release says; paths are paths on the host."""

    description: str
    user: str
    group: str | None
    working_directory: str
    environment_file: str
    exec_argv: tuple[str, ...]  # argv[0] absolute: a server unit runs its launcher, the router the venv's python
    timeout_start_s: int
    timeout_stop_s: int
    restart: RestartPolicy
    restart_sec: int
    start_limit_burst: int
    start_limit_interval_s: int
    limit_nofile: int
    syslog_identifier: str = "sglang"


@dataclass(frozen=True)
class EnvSpec:
    """The server's environment in file order; `secret_names` are redacted in anything shown to a person."""

    values: Mapping[str, str]
    secret_names: frozenset[str] = frozenset()


def _unrepresentable(value: str) -> str | None:
    """Why no systemd file can carry `value` to a process (NUL, invalid UTF-8, too long), or None."""
    for char in value:
        code = ord(char)
        if char == "\0":
            return "contains a NUL byte, which no systemd file can carry"
        if 0xD800 <= code <= 0xDFFF or 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            return f"contains U+{code:04X}, which systemd refuses as invalid UTF-8"
    if len(value.encode()) > MAX_ARG_BYTES:
        return f"is {len(value.encode())} bytes long; Linux passes at most {MAX_ARG_BYTES} bytes per argument"
    return None


def _env_value_problem(value: str) -> str | None:
    if "\n" in value or "\r" in value:
        # EnvironmentFile= could carry it inside quotes, but line-based tools (systemctl show, drift, plan) could not.
        return "contains a line break, which is not allowed in an environment value"
    return _unrepresentable(value)


def _setting_problem(value: str) -> str | None:
    if not value:
        return "is empty"
    if value != value.strip():
        return "has leading or trailing whitespace, which systemd strips"
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        return "contains a control character"
    if "\\" in value:
        return "contains a backslash, which systemd may read as a line continuation"
    return _unrepresentable(value)


def _path_problem(value: str) -> str | None:
    if not value.startswith("/") or posixpath.normpath(value) != value or value.startswith("//"):
        return "must be an absolute, normalized path"
    return _setting_problem(value)


def _executable_problem(value: str) -> str | None:
    if any(char in value for char in "\"'$"):
        # systemd refuses quotes in the executable and never substitutes $ in it, unlike in argv[0].
        return "must not contain quotes or '$'"
    return _path_problem(value)


def _check(problem: str | None, what: str) -> None:
    if problem is not None:
        raise ConfigError(f"{what} {problem}")


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."


def systemd_exec_arg(value: str) -> str:
    """One ExecStart= word that systemd unquotes, unescapes and substitutes back to exactly `value`."""
    _check(_unrepresentable(value), f"ExecStart argument {_shown(value)}")
    if BARE_EXEC_WORD.fullmatch(value):
        return value
    escaped = "".join(
        C_ESCAPES.get(char, f"\\x{ord(char):02x}" if ord(char) < 0x20 or ord(char) == 0x7F else char)
        for char in value
    )
    return f'"{escaped}"'


def systemd_env_value(value: str) -> str:
    """The right-hand side of an EnvironmentFile= line that systemd reads back as exactly `value`."""
    _check(_env_value_problem(value), f"environment value {_shown(value)}")
    return '"' + "".join(ENV_ESCAPES.get(char, char) for char in value) + '"'


def systemd_setting(value: str) -> str:
    """A single-line setting taken verbatim apart from `%` specifiers (Description=, WorkingDirectory=)."""
    _check(_setting_problem(value), f"unit setting {_shown(value)}")
    return value.replace("%", "%%")


def _exec_lines(argv: tuple[str, ...]) -> list[tuple[str, ...]]:
    """argv split before each `--flag`, so the rendered ExecStart= shows one flag per continuation line."""
    lines: list[list[str]] = [[]]
    for position, arg in enumerate(argv):
        if position > 0 and arg.startswith("--"):
            lines.append([])
        lines[-1].append(arg)
    return [tuple(line) for line in lines]


def _exec_lines_fit(argv: tuple[str, ...]) -> None:
    # Upper bound of the joined ExecStart= line: each word quoted, plus a separator or continuation.
    line_bytes = sum(len(systemd_exec_arg(arg).encode()) + 6 for arg in argv)
    if line_bytes > MAX_UNIT_LINE_BYTES:
        raise ConfigError(f"ExecStart is about {line_bytes} bytes; systemd reads at most {MAX_UNIT_LINE_BYTES}")


def validate_argv(argv: tuple[str, ...]) -> None:
    """ConfigError naming the first word of a command (ExecStart= or the launcher's exec) no process could get."""
    if not argv:
        raise ConfigError("ExecStart has no command")
    _check(_executable_problem(argv[0]), f"ExecStart executable {_shown(argv[0])}")
    for position, arg in enumerate(argv[1:], start=1):
        _check(_unrepresentable(arg), f"ExecStart argument {position} ({_shown(arg)})")


def validate_unit(spec: UnitSpec) -> None:
    """ConfigError naming the first setting of `spec` that systemd could not represent; render_unit checks it too."""
    _check(_setting_problem(spec.description), "Description")
    _check(_setting_problem(spec.syslog_identifier), "SyslogIdentifier")
    for what, name in (("User", spec.user), ("Group", spec.group)):
        if name is not None and not USER_NAME.fullmatch(name):
            raise ConfigError(f"{what} {_shown(name)} is not a valid user/group name", hint=USER_NAME.pattern)
    _check(_path_problem(spec.working_directory), "WorkingDirectory")
    _check(_path_problem(spec.environment_file), "EnvironmentFile")
    validate_argv(spec.exec_argv)
    _exec_lines_fit(spec.exec_argv)
    if spec.restart not in list(RestartPolicy):
        raise ConfigError(f"Restart={spec.restart!r} is not one of {', '.join(RestartPolicy)}")
    for what, seconds, least in (("TimeoutStartSec", spec.timeout_start_s, 1),
                                 ("TimeoutStopSec", spec.timeout_stop_s, 1),
                                 ("RestartSec", spec.restart_sec, 0), ("LimitNOFILE", spec.limit_nofile, 1),
                                 ("StartLimitBurst", spec.start_limit_burst, 1),
                                 ("StartLimitIntervalSec", spec.start_limit_interval_s, 1)):
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < least:
            raise ConfigError(f"{what}={seconds!r} must be an integer >= {least}")


def validate_env(env: EnvSpec) -> None:
    """ConfigError naming the first variable of `env` that an EnvironmentFile= cannot carry."""
    for name, value in env.values.items():
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(f"environment variable name {_shown(name)} is not valid",
                              hint="letters, digits and '_', not starting with a digit")
        _check(_env_value_problem(value), f"environment variable {name}")
        _check(_unrepresentable(f"{name}={value}"), f"environment variable {name}")
    unknown = sorted(env.secret_names - set(env.values))
    if unknown:
        raise ConfigError(f"secret names without a value: {', '.join(unknown)}")


@cache
def _templates() -> jinja2.Environment:
    """Built on the first render: a command that renders nothing (a no-op deploy) never loads Jinja2."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        autoescape=False,  # systemd files, not HTML: quoting is done by the filters below
    )
    environment.filters.update(systemd_exec_arg=systemd_exec_arg, systemd_env_value=systemd_env_value,
                               systemd_setting=systemd_setting, sh_word=shlex.quote)
    return environment


def render_unit(spec: UnitSpec) -> str:
    """The text of the service unit; raises ConfigError naming the setting systemd could not represent."""
    validate_unit(spec)
    return _templates().get_template(UNIT_TEMPLATE).render(spec=spec, exec_lines=_exec_lines(tuple(spec.exec_argv)))


def render_digested_unit(spec: UnitSpec) -> str:
    """The unit with the digest of its text (rendered without it) at the end of Description=: `systemctl show -p
    Description` then tells which unit text systemd holds (loaded_unit_digest), whatever file it came from."""
    return render_unit(replace(spec, description=f"{spec.description} (unit {short_hash(render_unit(spec))})"))


def loaded_unit_digest(description: str) -> str | None:
    """The digest render_digested_unit put into a Description=, None for a unit without one."""
    found = UNIT_DIGEST.search(description)
    return found.group(1) if found else None


def unit_digest_of(text: str) -> str | None:
    """The digest in the Description= line of a unit's text."""
    lines = [line.removeprefix("Description=") for line in text.splitlines() if line.startswith("Description=")]
    return loaded_unit_digest(lines[0]) if lines else None


def render_launcher(argv: tuple[str, ...]) -> str:
    """The launcher a unit's ExecStart= runs: `#!/bin/sh` and `exec` of `argv`, each word quoted by sh's rules,
    so the process (same pid) gets exactly `argv`."""
    validate_argv(argv)
    return _templates().get_template(LAUNCHER_TEMPLATE).render(exec_lines=_exec_lines(argv))


def render_env(env: EnvSpec) -> str:
    """The EnvironmentFile= text, secrets included: the store writes it with store.ENV_FILE_MODE."""
    validate_env(env)
    return _templates().get_template(ENV_TEMPLATE).render(variables=list(env.values.items()))


def render_env_redacted(env: EnvSpec) -> str:
    """The environment file as shown to a person: every secret's value replaced by REDACTED."""
    validate_env(env)
    shown = [(name, REDACTED if name in env.secret_names else value) for name, value in env.values.items()]
    return _templates().get_template(ENV_TEMPLATE).render(variables=shown)
