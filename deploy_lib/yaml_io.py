"""YAML reading that refuses what PyYAML lets through silently (duplicate keys) and names file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deploy_lib.errors import ConfigError

MAX_FILE_BYTES = 1_000_000  # a profile or inventory is a few KB; anything this large is a mistake


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse PATH as a YAML mapping; ConfigError names the file and line of any problem."""
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size} bytes is too large for a profile or inventory (limit {MAX_FILE_BYTES})")
    text = path.read_text(encoding="utf-8", errors="strict")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {err.problem or err}") from None
    if data is None:
        raise ConfigError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"{path}: top-level keys must be text, got {bad_keys[0]!r}")
    return data
