"""A hand-run server's `--config FILE` (pure), merged into its arguments as SGLang merges it, so that `invoke adopt`
reads a server started from a YAML file like one started with flags.

Read from the sglang 0.5.23 wheel: srt/server_args.py `prepare_server_args` merges only when the token `--config` is
in argv (`--config=FILE` is not merged); srt/utils/server_args_config_parser.py `ConfigArgumentMerger` turns each
top-level key into `--KEY` as written (a bool: the switch alone when true for a store_true option, else
`--KEY true|false`; a list: `--KEY` and its items, nothing when empty; a mapping: its JSON; anything else its
`str()`), and returns config arguments + those before `--config` + those after `--config FILE`, so a flag on the
command line wins (argparse keeps the last value). The file is opened from the server's working directory.

What SGLang refuses in the file is refused here first, naming the file and the key, so that release 0 (which runs the
command as written, file and all) does not fail at its first restart on a file edited since: a name not ending in
.yaml or .yml (`_validate_yaml_file`, every wheel read from 0.5.6.post1 to 0.5.23), and a key of an option whose
argparse action the merger does not turn into arguments (`unsupported_actions`): none before 0.5.8.post1 (0.5.6.post1
has no such check); from 0.5.8.post1 to 0.5.22 (srt/server_args_config_parser.py, then srt/utils/ from 0.5.19) an
option whose action is neither store nor store_true, by its dest alone; from 0.5.23
(srt/utils/server_args_config_parser.py `_takes_one_value`) also one that takes one value (nargs None), by each of
its long spellings, unless a supported option reads the same key. SGLang's own actions (LoRAPathAction,
DeprecatedStoreTrueAction, BooleanOptionalAction ...) subclass argparse.Action, so the recorded action's name is
enough. A mapping value is JSON from 0.5.15 on and Python's `str()` before (0.5.9 has no such branch).
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
from deploy_lib.versions import reached

CONFIG_FLAG = "--config"
STEP_CONFIG = "adopt: config file"
CONFIG_SUFFIXES = (".yaml", ".yml")
UNSUPPORTED_SINCE = "0.5.8"           # 0.5.8.post1 is the first wheel read with unsupported_actions
ONE_VALUE_SINCE = "0.5.23"            # _takes_one_value and _config_keys
MAPPING_AS_JSON_SINCE = "0.5.15"      # `elif isinstance(value, dict): json.dumps`
MERGED_ACTIONS = ("store", "store_true")


def check_config_name(path: str, where: str) -> None:
    """PreflightError for a file SGLang refuses by its name: `Config file must be YAML format, got: SUFFIX`."""
    suffix = posixpath.splitext(path)[1]
    if suffix.lower() not in CONFIG_SUFFIXES:
        raise PreflightError(f"{where}: the server's --config file {path}: SGLang reads only a .yaml or .yml file "
                             f"(it refuses {suffix or 'a name without a suffix'}: 'Config file must be YAML format')",
                             "rename the file to .yaml and start the server with it, or start it with flags; "
                             "then adopt it")


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


def unsupported_keys(options: Mapping[str, Mapping[str, Any]], version: str) -> dict[str, str]:
    """The file's keys (with `_` for `-`) SGLang `version` refuses, each with its option's action name."""
    if not reached(version, UNSUPPORTED_SINCE):
        return {}
    records = [r for r in options.values() if "--config" not in (r.get("option_strings") or ())]
    if not reached(version, ONE_VALUE_SINCE):
        return {str(r.get("dest")): str(r.get("action")) for r in records if r.get("action") not in MERGED_ACTIONS}
    supported = [r.get("action") in MERGED_ACTIONS or r.get("nargs") is None for r in records]
    readable = {key for record, ok in zip(records, supported, strict=True) if ok for key in _keys(record)}
    return {key: str(record.get("action")) for record, ok in zip(records, supported, strict=True) if not ok
            for key in _keys(record) - readable}


def config_arguments(text: str, options: Mapping[str, Mapping[str, Any]], path: str, where: str,
                     version: str) -> list[str]:
    """The arguments ConfigArgumentMerger of SGLang `version` makes of the file's text (`_convert_config_to_args`);
    PreflightError naming the file and the key for a key it refuses."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PreflightError(f"{where}: the server's --config file {path} is not YAML: {err}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise PreflightError(f"{where}: the server's --config file {path} does not hold a mapping at its top level")
    switches = {key for record in options.values() if record.get("action") == "store_true" for key in _keys(record)}
    if not reached(version, ONE_VALUE_SINCE):
        switches = {str(record.get("dest")) for record in options.values() if record.get("action") == "store_true"}
    refused = unsupported_keys(options, version)
    args: list[str] = []
    for key, value in data.items():
        action = refused.get(str(key).replace("-", "_"))
        if action is not None:
            raise PreflightError(
                f"{where}: the server's --config file {path}: {key}: SGLang {version} does not take this option from "
                f"a config file (its argparse action is {action}: 'Unsupported config option')",
                f"give --{str(key).replace('_', '-')} on the command line instead of in the file, restart the server, "
                "then adopt it")
        if isinstance(value, bool):
            if str(key).replace("-", "_") not in switches:
                args += [f"--{key}", str(value).lower()]
            elif value:
                args.append(f"--{key}")
        elif isinstance(value, list):
            args += [f"--{key}", *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value) if reached(version, MAPPING_AS_JSON_SINCE) else str(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def merged_arguments(args: Sequence[str], text: str, options: Mapping[str, Mapping[str, Any]], path: str,
                     where: str, version: str) -> tuple[str, ...]:
    """The arguments SGLang parses: the file's, then the command line's without `--config FILE`."""
    at = list(args).index(CONFIG_FLAG)
    return (*config_arguments(text, options, path, where, version), *args[:at], *args[at + 2:])
