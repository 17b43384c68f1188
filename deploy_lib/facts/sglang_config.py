"""A hand-run server's `--config FILE` (pure), merged into its arguments as SGLang merges it, so that `invoke adopt`
reads a server started from a YAML file like one started with flags.

Read from the sglang 0.5.23 wheel: srt/server_args.py `prepare_server_args` merges only when the token `--config` is
in argv (`--config=FILE` is not merged); srt/utils/server_args_config_parser.py `ConfigArgumentMerger` turns each
top-level key into `--KEY` as written (a bool: the switch alone when true for a store_true option, else
`--KEY true|false`; a list: `--KEY` and its items, nothing when empty; a mapping: its JSON; anything else its
`str()`), and returns config arguments + those before `--config` + those after `--config FILE`, so a flag on the
command line wins (argparse keeps the last value). The file is opened from the server's working directory.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from deploy_lib.errors import PreflightError
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Fact

CONFIG_FLAG = "--config"
STEP_CONFIG = "adopt: config file"


def config_path(args: Sequence[str], cwd: str) -> str | None:
    """The config file SGLang reads for these arguments (from the process's directory), or None."""
    if CONFIG_FLAG not in args:
        return None
    at = list(args).index(CONFIG_FLAG)
    return posixpath.normpath(posixpath.join(cwd, args[at + 1])) if at + 1 < len(args) else None


def config_fact(path: str, where: str) -> Fact[str]:
    """The file's text, read on the host as the server's user could (sudo); a missing file is refused by name."""
    def text(result: StepResult) -> str:
        if result.exit_code != 0:
            raise PreflightError(f"{where}: the server's --config file {path} cannot be read now: "
                                 f"{result.stderr.strip() or f'exit {result.exit_code}'}",
                                 "adopt reads the file the server started from; put it back, or restart the "
                                 "server with flags")
        return result.stdout
    return Fact(Step(STEP_CONFIG, ("cat", "--", path), sudo=True, ok=ABSENT_OK), text)


def _keys(record: Mapping[str, Any]) -> set[str]:
    """The YAML keys that name an option: its dest and each long spelling with `_` for `-` (_config_keys)."""
    strings = [str(s) for s in record.get("option_strings") or ()]
    return {str(record.get("dest"))} | {s[2:].replace("-", "_") for s in strings if s.startswith("--")}


def config_arguments(text: str, options: Mapping[str, Mapping[str, Any]], path: str, where: str) -> list[str]:
    """The arguments ConfigArgumentMerger makes of the file's text (`_convert_config_to_args`)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PreflightError(f"{where}: the server's --config file {path} is not YAML: {err}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise PreflightError(f"{where}: the server's --config file {path} does not hold a mapping at its top level")
    switches = {key for record in options.values() if record.get("action") == "store_true" for key in _keys(record)}
    args: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if str(key).replace("-", "_") not in switches:
                args += [f"--{key}", str(value).lower()]
            elif value:
                args.append(f"--{key}")
        elif isinstance(value, list):
            args += [f"--{key}", *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def merged_arguments(args: Sequence[str], text: str, options: Mapping[str, Mapping[str, Any]], path: str,
                     where: str) -> tuple[str, ...]:
    """The arguments SGLang parses: the file's, then the command line's without `--config FILE`."""
    at = list(args).index(CONFIG_FLAG)
    return (*config_arguments(text, options, path, where), *args[:at], *args[at + 2:])
