"""The one place a file the user wrote is read (profiles, inventories in YAML and INI, group_vars/ and host_vars/,
tune specs, patch sets, secret files, the ssh config): not a file, unreadable, too large or not UTF-8 is a
ConfigError naming the file and where. YAML reading that refuses what PyYAML lets through silently (duplicate keys),
reads merge keys (`<<: *base`), refuses Ansible Vault values by key, and names file and line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy_lib.errors import ConfigError

MAX_FILE_BYTES = 1_000_000  # a profile, an inventory or an ssh config is a few KB; anything this large is a mistake
MERGE_TAG = "tag:yaml.org,2002:merge"
_INI_SECTION = re.compile(r"^\[[^:\]\s]+(?::\w+)?\]\s*$")  # [group], [group:vars]: an INI inventory's sections
VAULT_FILE_HEADER = "$ANSIBLE_VAULT;"  # the first line of a file `ansible-vault encrypt` wrote
VAULT_HINT = ("sglang-deploy does not decrypt Ansible Vault; keep the secret out of the inventory: a profile's "
              "`secrets:` takes `{env: VAR_NAME}` or `{file: /path}` (e.g. `VAR_NAME=$(ansible-vault view ...)`)")


@dataclass(frozen=True)
class VaultValue:
    """Where a `!vault` value was written: kept so that the refusal can name its key, not only its line."""

    line: int


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:  # `<<: *base`: its keys are defaults that the explicit keys override
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key_node, (yaml.MappingNode, yaml.SequenceNode)):  # `{{a: 1}}` is a mapping as a key
                kind = "mapping" if isinstance(key_node, yaml.MappingNode) else "list"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a plain value, not a {kind} (doubled braces or brackets?)",
                    key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor("!vault", lambda loader, node: VaultValue(node.start_mark.line + 1))


def _refuse_vault(path: Path, data: Any, where: str = "") -> None:
    """ConfigError naming the key and line of the first `!vault` value in `data`."""
    if isinstance(data, VaultValue):
        raise ConfigError(f"{path}:{data.line}: {where}: an Ansible Vault value (!vault) cannot be read", VAULT_HINT)
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        _refuse_vault(path, value, f"{where}.{key}" if where else str(key))


def read_text_file(path: Path) -> str:
    """PATH's text; ConfigError (exit 2) for a path that is no regular file, one that cannot be read, one too large
    for a profile or inventory, and text that is not UTF-8 (naming the line and byte offset of the first bad
    byte)."""
    try:
        if not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
            raise ConfigError(f"{path}: cannot read: {kind}")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: {size} bytes is too large for a profile, an inventory or a config "
                              f"(limit {MAX_FILE_BYTES})")
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        encoding = "UTF-16" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else "LATIN1"  # a BOM, else a guess
        raise ConfigError(f"{path}:{line}: not UTF-8: byte 0x{data[err.start]:02x} at offset {err.start}"
                          + (" (the file is UTF-16)" if encoding == "UTF-16" else ""),
                          f"save the file as UTF-8 (`iconv -f {encoding} -t UTF-8`, or the editor's encoding "
                          "menu)") from None


def load_yaml_mapping(path: Path, allow_empty: bool = False, ini_hint: bool = False) -> dict[str, Any]:
    """Parse PATH as a YAML mapping ({} for an empty file when `allow_empty`); ConfigError names the file and line of
    any problem, and with `ini_hint` says so when the file looks like an INI inventory."""
    text = read_text_file(path)
    if text.startswith(VAULT_FILE_HEADER):
        raise ConfigError(f"{path}: the whole file is encrypted with Ansible Vault and cannot be read", VAULT_HINT)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        looks_ini = ini_hint and any(_INI_SECTION.match(line) for line in text.splitlines())
        raise ConfigError(f"{where}: invalid YAML: {err.problem or err}",
                          f"this looks like an INI inventory: give it a name that does not end in {path.suffix} "
                          "(e.g. hosts.ini), and it is read as INI" if looks_ini else None) from None
    if data is None and allow_empty:
        return {}
    if data is None:
        raise ConfigError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise ConfigError(f"{path}: top-level keys must be text, got {bad_keys[0]!r}")
    _refuse_vault(path, data)
    return data
