"""Profile overrides by path (`memory.max_running_requests=1024`): values read as YAML scalars, the result validated
by the profile's own schema, so an unknown key or a bad value is the same error a profile file gets, naming where
the override came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from deploy_lib.errors import ConfigError
from deploy_lib.profile.credentials import looks_like_credential
from deploy_lib.profile.loading import format_validation_error
from deploy_lib.profile.model import LoadedProfile, Profile


def scalar(text: str) -> Any:
    """A value as a profile file would spell it: `1024` a number, `true` a switch, `null` unset, else text."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, bool | int | float | str) else text


def _set_path(data: dict[str, Any], path: str, value: Any, source: str) -> None:
    parts = path.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {'.'.join(parts[:depth + 1])} is a value, not a section: "
                              f"{path} cannot be set", "`invoke schema` prints every key a profile may have")
        node = child
    node[parts[-1]] = value


SET_SOURCE = "--set"
HIDDEN = "<not shown: it looks like a credential>"


def shown(text: str) -> str:
    """A `--set` text as a message may repeat it: a value that looks like a credential is left out."""
    path, equals, value = text.partition("=")
    if looks_like_credential(value if equals else text) is None:
        return text
    return f"{path}={HIDDEN}" if equals else HIDDEN


def parse_assignments(texts: Sequence[str]) -> dict[str, Any]:
    """`--set path.to.key=value` options as path -> value (the last of a path repeated wins); a text without `=`
    is refused naming it."""
    assignments: dict[str, Any] = {}
    for text in texts:
        path, equals, value = text.partition("=")
        if not equals or not path.strip():
            raise ConfigError(f"{SET_SOURCE} {shown(text)!r}: not of the form path.to.key=value",
                              "e.g. --set memory.max_running_requests=512 (repeat --set for several)")
        assignments[path.strip()] = scalar(value)
    return assignments


def from_command_line(loaded: LoadedProfile, texts: Sequence[str]) -> LoadedProfile:
    """The profile with `--set` options applied and recorded (LoadedProfile.overrides), validated whole."""
    if not texts:
        return loaded
    given = " ".join(f"{SET_SOURCE} {shown(text)}" for text in texts)
    changed = with_overrides(loaded, parse_assignments(texts), f"profile {loaded.name} with {given}")
    return changed.model_copy(update={"overrides": (*loaded.overrides, *texts)})


def with_overrides(loaded: LoadedProfile, overrides: Mapping[str, Any], source: str) -> LoadedProfile:
    """The profile with each path set to its value, validated whole; ConfigError names `source` and the key."""
    data = loaded.profile.model_dump(mode="json", exclude_unset=True)
    for path, value in overrides.items():
        if not path or any(not part for part in path.split(".")):
            raise ConfigError(f"{source}: {path!r} is not a profile path", "write it as section.key, e.g. "
                                                                           "memory.max_running_requests")
        _set_path(data, path, value, source)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err, Profile),
                          "`invoke schema` prints every key a profile may have") from None
    return loaded.model_copy(update={"profile": profile})
