"""The parts of Ansible's inventory formats beyond one YAML file: host ranges (`gpu[01:08]`), the INI format, and the
`group_vars/` and `host_vars/` files beside an inventory. Each reads into the YAML inventory's shape or a vars
mapping; model.py applies Ansible's precedence.

Behaviour follows ansible-core 2.17: `expand_hostname_range` (ansible/plugins/inventory/__init__.py), the INI
plugin (ansible/plugins/inventory/ini.py) and `find_vars_files` (ansible/parsing/dataloader.py).
"""

from __future__ import annotations

import ast
import re
import shlex
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.yaml_io import load_yaml_mapping, read_text_file

MAX_RANGE_HOSTS = 4096  # a range is a rack, not a data centre; a typo such as [1:100000] is refused
VARS_EXTENSIONS = (".yml", ".yaml", ".json")  # Ansible's YAML_FILENAME_EXTENSIONS
YAML_SUFFIXES = (".yaml", ".yml", ".json")  # an inventory with any other name is read as INI, as Ansible does
INVENTORY_NAMES = ("hosts.yaml", "hosts.yml", "hosts.json", "hosts.ini", "hosts")  # the file of an inventory dir
_RANGE_HELP = "write a range as [begin:end] or [begin:end:step], e.g. gpu[1:8], gpu[01:08] or rack-[a:d]"
_SECTION_RE = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:[#;].*)?$")
_PORT_RE = re.compile(r"^(?P<name>[^:\[\]]+|[^:]*\[[^\]]*\][^:]*):(?P<port>[0-9]{1,5})$")


def expand_host_pattern(pattern: str) -> list[str]:
    """Every host name a pattern with ranges stands for, in order (Ansible's expand_hostname_range); ValueError says
    what is wrong with the range."""
    start = pattern.find("[")
    if start < 0:
        if "]" in pattern:
            raise ValueError(f"{pattern!r} has a `]` without its `[`. {_RANGE_HELP}")
        return [pattern]
    close = pattern.find("]", start)
    if close < 0:
        raise ValueError(f"{pattern!r} has a `[` without its `]`. {_RANGE_HELP}")
    head, bounds, tail = pattern[:start], pattern[start + 1:close].split(":"), pattern[close + 1:]
    if len(bounds) not in (2, 3):
        raise ValueError(f"{pattern!r}: [{':'.join(bounds)}] is not a range. {_RANGE_HELP}")
    begin, end, step = bounds[0] or "0", bounds[1], bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ValueError(f"{pattern!r}: the range has no end. {_RANGE_HELP}")
    if not step.isdigit() or int(step) < 1:
        raise ValueError(f"{pattern!r}: the step {step!r} must be a whole number of at least 1")
    width = len(begin) if begin[0] == "0" and len(begin) > 1 else 0  # gpu[01:08]: zero-padded to begin's width
    if width and len(end) != width:
        raise ValueError(f"{pattern!r}: a zero-padded range needs begin and end of the same width, e.g. [01:16]")
    if begin in string.ascii_letters and end in string.ascii_letters:
        first, last = string.ascii_letters.index(begin), string.ascii_letters.index(end)
        if first > last:
            raise ValueError(f"{pattern!r}: the range's begin {begin!r} comes after its end {end!r}")
        items = list(string.ascii_letters[first:last + 1:int(step)])
    elif begin.isdigit() and end.isdigit():
        if int(begin) > int(end):
            raise ValueError(f"{pattern!r}: the range's begin {begin} is above its end {end}")
        if (int(end) - int(begin)) // int(step) + 1 > MAX_RANGE_HOSTS:
            raise ValueError(f"{pattern!r} stands for more than {MAX_RANGE_HOSTS} hosts")
        items = [str(number).zfill(width) for number in range(int(begin), int(end) + 1, int(step))]
    else:
        raise ValueError(f"{pattern!r}: {begin!r}:{end!r} is neither two numbers nor two letters. {_RANGE_HELP}")
    names = [name for item in items for name in expand_host_pattern(head + item + tail)]
    if len(names) > MAX_RANGE_HOSTS:
        raise ValueError(f"{pattern!r} stands for more than {MAX_RANGE_HOSTS} hosts")
    return names


def split_host_port(pattern: str) -> tuple[str, int | None]:
    """`gpu1:2222` -> ("gpu1", 2222), as Ansible reads a host with its port; an IPv6 address is left whole."""
    match = _PORT_RE.fullmatch(pattern)
    return (match.group("name"), int(match.group("port"))) if match else (pattern, None)


def _ini_value(text: str) -> Any:
    """A value as Ansible's INI plugin reads it: a Python literal (8, True, [1, 2], 'quoted') or else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def read_ini_inventory(path: Path) -> dict[str, Any]:
    """An INI inventory (`[group]` host lines with key=value vars, `[group:vars]`, `[group:children]`) in the YAML
    inventory's shape; ConfigError names the file and line."""
    groups: dict[str, dict[str, Any]] = {}
    declared: set[str] = set()  # groups with a section of their own (a [g:vars] alone does not declare g)
    children_of: dict[str, int] = {}  # a child named in [parent:children] -> its line
    vars_of: dict[str, int] = {}  # a group with a [group:vars] section -> its line
    name, kind = "ungrouped", "hosts"
    lines = read_text_file(path).splitlines()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        where = f"{path}:{number}"
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = _SECTION_RE.match(line)
            if section is None:
                raise ConfigError(f"{where}: {line!r} is not a section header",
                                  "write [group], [group:vars] or [group:children]")
            name, kind = section.group(1), section.group(2) or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise ConfigError(f"{where}: section [{name}:{kind}] has an unknown type {kind!r}",
                                  "a section is [group], [group:vars] or [group:children]")
            groups.setdefault(name, {"hosts": {}, "vars": {}, "children": {}})
            if kind != "vars":
                declared.add(name)
            else:
                vars_of.setdefault(name, number)
            continue
        group = groups.setdefault(name, {"hosts": {}, "vars": {}, "children": {}})
        if kind == "vars":
            key, equals, value = line.partition("=")
            if not equals or not key.strip():
                raise ConfigError(f"{where}: [{name}:vars] expects key=value, got {line!r}")
            group["vars"][key.strip()] = _ini_value(value.strip())
        elif kind == "children":
            group["children"][line] = None
            children_of.setdefault(line, number)
        else:
            _ini_host_line(where, line, group["hosts"])
    undeclared = sorted((line, child) for child, line in children_of.items() if child not in declared)
    if undeclared:
        line_no, child = undeclared[0]
        raise ConfigError(f"{path}:{line_no}: group {child!r} is a child but has no section of its own",
                          f"add a [{child}] section (empty if it has no hosts of its own)")
    # as Ansible: vars for a group that is never declared are a mistake (a typo of its name, most likely)
    vars_only = sorted((line, group) for group, line in vars_of.items()
                       if group not in declared and group not in ("all", "ungrouped"))
    if vars_only:
        line_no, vars_group = vars_only[0]
        raise ConfigError(f"{path}:{line_no}: [{vars_group}:vars] is for a group that has no section of its own"
                          f"{did_you_mean(vars_group, declared)}",
                          f"add a [{vars_group}] section, or fix the group's name")
    all_group = groups.pop("all", {"hosts": {}, "vars": {}, "children": {}})
    ungrouped = groups.pop("ungrouped", {"hosts": {}, "vars": {}, "children": {}})
    return {"all": {"hosts": {**all_group["hosts"], **ungrouped["hosts"]}, "vars": all_group["vars"],
                    "children": groups}}


def _ini_host_line(where: str, line: str, hosts: dict[str, Any]) -> None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError as error:
        raise ConfigError(f"{where}: cannot split {line!r}: {error}", "quote a value with spaces, e.g. a='b c'") \
            from None
    pattern, port = split_host_port(words[0])
    host_vars: dict[str, Any] = {} if port is None else {"ansible_port": port}
    for word in words[1:]:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise ConfigError(f"{where}: host {pattern}: {word!r} is not a key=value host var",
                              "a host line is `NAME key=value ...`; quote a value with spaces")
        if key in host_vars:  # which of the two was meant is not for the tool to guess
            raise ConfigError(f"{where}: host {pattern}: {key} is given twice on the line", "give each var once")
        host_vars[key] = _ini_value(value)
    try:
        names = expand_host_pattern(pattern)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
    for host in names:
        hosts[host] = {**hosts.get(host, {}), **host_vars}


def inventory_file(path: Path) -> Path:
    """The inventory file PATH names: PATH itself, or for a directory (Ansible's `-i inventory/`) its one
    `hosts` file (hosts.yaml, hosts.yml, hosts.json, hosts.ini or hosts), whose group_vars/ and host_vars/ are the
    directory's own. The directory's other files are not merged, as Ansible would: one file is the inventory."""
    if not path.is_dir():
        return path
    found = [path / name for name in INVENTORY_NAMES if (path / name).is_file()]
    if len(found) == 1:
        return found[0]
    which = (f"with {len(found)} inventory files ({', '.join(each.name for each in found)})" if found
             else f"without an inventory file ({', '.join(INVENTORY_NAMES)})")
    raise ConfigError(f"{path}: a directory {which}", "give the inventory file itself with -i, or keep one "
                                                      "hosts file in the directory")


def read_inventory_source(path: Path) -> dict[str, Any]:
    """The inventory file in the YAML shape: .yaml/.yml/.json as YAML, any other name as INI (Ansible's order)."""
    if path.suffix in YAML_SUFFIXES:
        return load_yaml_mapping(path, ini_hint=True)
    return read_ini_inventory(path)


def vars_files(directory: Path, name: str) -> list[Path]:
    """The files Ansible reads for a group or host NAME in group_vars/ or host_vars/: the first of NAME (a file or a
    directory), NAME.yml, NAME.yaml, NAME.json; a directory's files recursively in name order, hidden ones, backups
    (`~`) and other extensions left out."""
    for candidate in (directory / name, *(directory / f"{name}{ext}" for ext in VARS_EXTENSIONS)):
        if candidate.is_dir():
            return _directory_vars_files(candidate)
        if candidate.is_file():
            return [candidate]
    return []


def _directory_vars_files(directory: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir():
            found += _directory_vars_files(entry)
        elif entry.suffix in ("", *VARS_EXTENSIONS):
            found.append(entry)
    return found


def unmatched_vars_files(directory: Path, names: Iterable[str]) -> list[tuple[Path, str]]:
    """The entries of group_vars/ or host_vars/ that name no group or host of NAMES (a typo of one, most likely:
    Ansible reads them for nothing, without a word), each with the name it gives."""
    if not directory.is_dir():
        return []
    known = set(names)
    entries = [entry for entry in sorted(directory.iterdir()) if not entry.name.startswith(".")
               and not entry.name.endswith("~") and (entry.is_dir() or entry.suffix in ("", *VARS_EXTENSIONS))]
    return [(entry, name) for entry in entries
            if (name := entry.name if entry.is_dir() or entry.suffix == "" else entry.stem) not in known]


def read_vars_files(directory: Path, name: str) -> list[tuple[Path, dict[str, Any]]]:
    """The vars of NAME from each of its group_vars/ or host_vars/ files, in the order they apply (a later file's
    value wins)."""
    return [(path, load_yaml_mapping(path, allow_empty=True)) for path in vars_files(directory, name)]
