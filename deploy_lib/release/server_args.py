"""Profile -> the SGLang launch command and environment for one SGLang version.

Flags that were renamed across SGLang releases are data (deploy_lib/versions.py SPELLINGS), each citing the sglang
wheels on PyPI whose argument parser (srt/server_args.py, from 0.5.15 also srt/arg_groups/) establishes it, read by
deploy_lib/host_scripts/sglang_options.py.
Preflight checks the result against the parser of the version actually installed (argv_check.check_argv).

The API key never appears in argv: SGLang only takes it as `--api-key` (no environment variable, 0.5.6 - 0.5.23),
so with a key the server starts through a one-line launcher that moves SGLANG_API_KEY from the environment (the
0600 EnvironmentFile) into sys.argv inside the process; /proc/PID/cmdline, `ps` and `systemctl status` show only
the launcher. `${SGLANG_API_KEY}` expansion in ExecStart would put the key in the world-readable cmdline.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from deploy_lib.errors import ConfigError
from deploy_lib.host_paths import venv_python
from deploy_lib.profile import Profile, SecretRef
from deploy_lib.versions import ARGS, SPELLINGS, Arg, Spelling, version_key

API_KEY_ENV = "SGLANG_API_KEY"
# The PATH systemd 252 gives a service that sets none, as Debian 12 builds it (split-usr; src/basic/path-util.h
# DEFAULT_PATH_SPLIT_USR): the venv's bin/ is not on it.
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs sglang.launch_server exactly as `python -m` does (runpy with alter_sys, so multiprocessing children re-import
# it as __mp_main__), after appending `--api-key KEY` to sys.argv; the key leaves os.environ so children do not
# inherit it. One line, no `$`, `%`, quotes of the other kind or backslashes: it goes into ExecStart verbatim.
API_KEY_LAUNCHER = (
    f"import os,runpy,sys;k=os.environ.pop('{API_KEY_ENV}','') or sys.exit('sglang-deploy: {API_KEY_ENV} is not "
    "set in the environment file');sys.argv+=['--api-key',k];"
    "runpy.run_module('sglang.launch_server',run_name='__main__',alter_sys=True)"
)


def parse_version(sglang_version: str, given_as: str = "SGLang version") -> Version:
    """The version; ConfigError naming `given_as` (the option that gave it, where one did)."""
    try:
        return version_key(sglang_version)
    except ValueError as err:
        raise ConfigError(f"{given_as}: {err}", "give a version as pip shows it, e.g. 0.5.23") from None


def spelling(setting: str, sglang_version: str) -> Spelling | None:
    """The spelling of `setting` that SGLang `sglang_version` understands, or None if it has none."""
    version = parse_version(sglang_version)
    usable = [s for s in SPELLINGS[setting] if version_key(s.since) <= version]
    return usable[-1] if usable else None


def _versioned(setting: str, sglang_version: str, value: str | None, key: str) -> tuple[str, ...]:
    chosen = spelling(setting, sglang_version)
    if chosen is None:
        first = SPELLINGS[setting][0]
        raise ConfigError(
            f"{key}: {first.argv[0]} does not exist in SGLang {sglang_version} (first in {first.since})",
            f"remove {key} from the profile or install SGLang >= {first.since}",
        )
    return tuple(value if part == "{}" and value is not None else part for part in chosen.argv)


def profile_value(profile: Profile, key: str) -> Any:
    value: Any = profile
    for part in key.split("."):
        value = getattr(value, part)
    return value


def sglang_args(profile: Profile, sglang_version: str, revision: str | None = None) -> tuple[str, ...]:
    """The arguments of `python3 -m sglang.launch_server` for this profile on this SGLang version, full flag names
    only (never prefix abbreviations such as `--tp`), extra_args last. `revision`: the commit the profile's
    revision resolved to on the host (without a host: the profile's own `model.revision`)."""
    parse_version(sglang_version)
    revision = revision or profile.model.revision
    tokens: list[str] = []
    for arg in ARGS:
        tokens += arg_tokens(profile, arg, sglang_version)
        if arg.key == "model.path" and revision is not None:  # the weights' commit, right after their path
            tokens += _versioned("revision", sglang_version, revision, "model.revision")
    return (*tokens, *profile.extra_args)


def arg_tokens(profile: Profile, arg: Arg, sglang_version: str) -> tuple[str, ...]:
    """What one row writes for this profile on this SGLang version (nothing when the key is unset or default)."""
    value = profile_value(profile, arg.key)
    if value is None or value == arg.omit or (arg.multi_node and profile.parallel.nnodes == 1):
        return ()
    if arg.switch and value != arg.on:
        return ()
    text = None if arg.switch else str(value)
    if arg.setting is not None:
        return _versioned(arg.setting, sglang_version, text, arg.key)
    return (str(arg.flag),) if arg.switch else (str(arg.flag), str(text))


def launch_argv(profile: Profile, sglang_version: str, args: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The full command: the venv's python, then `-m sglang.launch_server` (or, with an API key, the launcher that
    adds `--api-key` from SGLANG_API_KEY in-process), then sglang_args() or the `args` given."""
    python = str(venv_python(profile.service.venv))
    entry = ("-m", "sglang.launch_server") if profile.server.api_key is None else ("-c", API_KEY_LAUNCHER)
    return (python, *entry, *(sglang_args(profile, sglang_version) if args is None else args))


def venv_environment(profile: Profile) -> dict[str, str]:
    """What `source <venv>/bin/activate` sets, for the server and the tools it runs by name: FlashInfer's JIT runs
    `ninja` from PATH (flashinfer/jit/cpp_ext.py run_ninja, 0.6.3 - 0.7.4) and the ninja wheel installs it into the
    venv's bin/. A profile's own env.PATH follows the venv's bin/ instead of systemd's default."""
    bin_dir = f"{profile.service.venv}/bin"
    rest = [entry for entry in profile.env.get("PATH", SYSTEMD_DEFAULT_PATH).split(":") if entry and entry != bin_dir]
    return {"PATH": ":".join([bin_dir, *rest]), "VIRTUAL_ENV": profile.service.venv}


def launch_environment(profile: Profile) -> dict[str, str]:
    """Non-secret environment of the server process (NCCL first, the venv's PATH and VIRTUAL_ENV last); secrets
    come from secret_environment()."""
    return {**profile.environment(), **venv_environment(profile)}


def secret_environment(profile: Profile) -> dict[str, SecretRef]:
    """Environment variables the EnvironmentFile must hold, by reference: profile secrets plus the API key."""
    refs = dict(profile.secrets)
    if profile.server.api_key is not None:
        if API_KEY_ENV in refs:
            raise ConfigError(f"secrets.{API_KEY_ENV}: set by server.api_key already", "keep one of the two")
        refs[API_KEY_ENV] = profile.server.api_key
    return refs
