"""Profile files: NAME.yaml under the profiles directory, `extends:` chains merged parent first, and validation
errors that name the file, the key and a close known key or choice."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.profile.model import SCHEMA_KEY, LoadedProfile, Profile
from deploy_lib.yaml_io import load_yaml_mapping

PROFILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def profile_path(profiles_dir: Path, name: str) -> Path:
    if not PROFILE_NAME_RE.match(name):
        raise ConfigError(f"profile name {name!r} is not valid", "use letters, digits, '.', '_' and '-'")
    return profiles_dir / f"{name}.yaml"


def _resolve(profiles_dir: Path, name: str, seen: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    path = profile_path(profiles_dir, name)
    if name in seen:
        cycle = " -> ".join((*seen, name))
        raise ConfigError(f"{path}: extends: cycle {cycle}", "remove one `extends:` from the cycle")
    if not path.exists():  # a directory or a device of that name is refused as such where it is read
        known = sorted(p.stem for p in profiles_dir.glob("*.yaml"))
        where = f"{profile_path(profiles_dir, seen[-1])}: extends: " if seen else ""
        raise ConfigError(f"{where}profile {name!r} not found ({path})", f"known profiles: {', '.join(known)}")
    raw = load_yaml_mapping(path)
    raw.pop(SCHEMA_KEY, None)  # for editors only: where the profile's JSON Schema is
    parent = raw.pop("extends", None)
    if parent is None:
        return raw, (name,)
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: must be a profile name, got {type(parent).__name__}")
    parent_raw, parent_chain = _resolve(profiles_dir, parent, (*seen, name))
    return _deep_merge(parent_raw, raw), (name, *parent_chain)


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None,
                            extra_keys: Iterable[str] = (), flags: Mapping[str, str] | None = None) -> str:
    """One line per problem, naming the key; with `model`, a close known key or choice is suggested. A top-level
    key given by a command-line flag (`flags`: key -> flag) is named by that flag and the value typed, not `source`;
    a key inside it stays `source: key`."""
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
            if model is not None:
                known = _keys_at(model, item["loc"][:-1])
                msg += did_you_mean(str(item["loc"][-1]), [*known, *(extra_keys if len(item["loc"]) == 1 else ())])
        elif item["type"] in ("enum", "literal_error"):
            choices = re.findall(r"'([^']*)'", (item.get("ctx") or {}).get("expected", ""))
            msg += did_you_mean(str(item["input"]), choices)
        flag = (flags or {}).get(str(item["loc"][0])) if len(item["loc"]) == 1 else None
        lines.append(f"{flag} {item['input']!r}: {msg}" if flag else f"{source}: {key}: {msg}")
    return "\n".join(lines)


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys a mapping at `loc` of `model` may have (a dict's own key or a list index is a level too)."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        else:  # a dict or a list: step into its value type
            current = next((arg for arg in typing.get_args(current)[1:] or typing.get_args(current)), None)
        current = _model_in(current) or current
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _model_in(annotation: Any) -> Any:
    """The annotation itself if it is a mapping type or a model; else the first such type inside Optional/Annotated."""
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if is_model or typing.get_origin(annotation) in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_profile(profiles_dir: Path, name: str) -> LoadedProfile:
    """Load NAME.yaml from profiles_dir, following `extends:`; raise ConfigError naming file and key."""
    raw, chain = _resolve(profiles_dir, name, ())
    path = profile_path(profiles_dir, name)
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as err:
        source = str(path) if len(chain) == 1 else f"{path} (extends {' -> '.join(chain[1:])})"
        raise ConfigError(format_validation_error(source, err, Profile, ("extends",)), _allowed_hint(err)) from None
    return LoadedProfile(name=name, path=path, chain=chain, profile=profile)


def _allowed_hint(err: ValidationError) -> str | None:
    if any(item["type"] == "extra_forbidden" for item in err.errors()):
        return "`invoke schema` prints every key a profile may have"
    return None
