"""Ansible's host patterns, as `--limit` takes them (pure): which of an inventory's hosts a pattern names.

The rules are Ansible's (ansible/inventory/manager.py, `split_host_pattern`, `order_patterns`, `_match_one_pattern`,
`_split_subscript`, `_apply_subscript`):

- terms are separated by `,` (or by `:` when the pattern has no `,`; a `:` inside `[...]` belongs to the term);
- a term is a host or group name, or a glob (`gpu*`, `gpu-?`, `rack[ab]-*`) matched against host and group names (a
  group gives its hosts, children included), or `~REGEX` (Python's re.match against the names);
- `NAME[i]` and `NAME[i:j]` pick hosts of what NAME matches by position, from 0, both ends included (`gpu[0:1]`: the
  group's first two hosts; `gpu[-1]`: its last; `[:j]` and `[i:]` are open);
- `&TERM` keeps only hosts TERM also names (intersection), `!TERM` removes what TERM names (exclusion); the plain
  terms are joined first, then the intersections, then the exclusions, whatever their order in the pattern; with no
  plain term the start is every host (`all`).

Unlike Ansible, which warns and goes on, a term that matches nothing is refused naming it, and so is a pattern that
leaves no host: a typo never silently narrows a command to fewer hosts, or to none."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deploy_lib.errors import ConfigError

# ansible/inventory/manager.py PATTERN_WITH_SUBSCRIPT: NAME[i] or NAME[i:j] (either end may be left out)
SUBSCRIPT = re.compile(r"^(?P<name>.+)\[(?:(?P<index>-?[0-9]+)|(?P<start>-?[0-9]+)?:(?P<end>-?[0-9]+)?)\]$")
WILDCARDS = re.compile(r"[*?\[]")
LIMIT = "--limit"


@dataclass(frozen=True)
class Term:
    """One term of a pattern: how it combines (`""` union, `&` intersection, `!` exclusion) and what it names."""

    operator: str
    text: str


def split_pattern(pattern: str) -> list[Term]:
    """The pattern's terms in the order written; ConfigError for an empty term (`a,,b`, a trailing `:`)."""
    text = pattern.strip()
    if not text:
        raise ConfigError(f"{LIMIT}: the pattern is empty", "give a host, a group or a pattern: --limit 'gpu*'")
    if text.startswith("@"):
        raise ConfigError(f"{LIMIT} {pattern}: a file of hosts (@FILE, Ansible's retry file) is not read here",
                          "give the hosts as a pattern: --limit 'gpu1,gpu3'")
    if "," in text:
        parts = text.split(",")
    else:  # `:` separates terms only outside [...] (a subscript's `[0:2]`)
        parts, depth, current = [], 0, ""
        for char in text:
            depth += (char == "[") - (char == "]")
            if char == ":" and depth == 0:
                parts.append(current)
                current = ""
            else:
                current += char
        parts.append(current)
    terms = []
    for part in (part.strip() for part in parts):
        operator = part[0] if part[:1] in ("&", "!") else ""
        name = part[len(operator):].strip()
        if not name:
            raise ConfigError(f"{LIMIT} {pattern}: an empty term", "separate terms with `,` or `:`, e.g. "
                                                                    "--limit 'gpu:!gpu3'")
        terms.append(Term(operator, name))
    return terms


def _names(text: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """The hosts one term (without its operator and subscript) names, in inventory order."""
    if text.startswith("~"):
        try:
            regex = re.compile(text[1:])
        except re.error as err:
            raise ConfigError(f"{LIMIT}: {text!r} is not a regular expression: {err}") from None
        def matches(name: str) -> bool:
            return regex.match(name) is not None
    elif WILDCARDS.search(text):
        def matches(name: str) -> bool:
            return fnmatch.fnmatchcase(name, text)
    else:
        def matches(name: str) -> bool:
            return name == text
    named = {host for group, members in groups.items() if matches(group) for host in members}
    named |= {host for host in hosts if matches(host)}
    return [host for host in hosts if host in named]


def _subscripted(term: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]], pattern: str) -> list[str]:
    found = SUBSCRIPT.match(term)
    name = found.group("name") if found else term
    named = _names(name, hosts, groups)
    if not named:
        hint = (f"a subscript picks hosts of a group by position, as in Ansible: `{name}[0:1]` is the first two "
                f"hosts of group {name}") if found else "a host or group name, a glob (`gpu*`) or ~REGEX"
        raise ConfigError(f"{LIMIT} {pattern}: {name!r} matches no host or group of the inventory", hint)
    if found is None:
        return named
    last = len(named) - 1
    if found.group("index") is not None:
        index = int(found.group("index"))
        if not -len(named) <= index <= last:
            raise ConfigError(f"{LIMIT} {pattern}: {term}: {name} has {len(named)} host(s): no position {index}",
                              f"positions are 0 to {last} (or -{len(named)} to -1)")
        return [named[index]]
    start = int(found.group("start") or 0)
    end = int(found.group("end")) if found.group("end") is not None else last
    start, end = (start + len(named) if start < 0 else start), (end + len(named) if end < 0 else end)
    picked = named[start:end + 1]
    if not picked:
        raise ConfigError(f"{LIMIT} {pattern}: {term}: {name} has {len(named)} host(s): the range picks none",
                          f"positions are 0 to {last}, both ends included: e.g. {name}[0:{last}]")
    return picked


def match_hosts(pattern: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """The hosts `pattern` names, in inventory order (`hosts`); `groups`: each group's hosts, children included.
    ConfigError naming the pattern for a term that names nothing and for a pattern that leaves no host."""
    terms = split_pattern(pattern)
    plain = [term for term in terms if term.operator == ""]
    chosen: set[str] = set(hosts) if not plain else set()
    for term in plain:
        chosen |= set(_subscripted(term.text, hosts, groups, pattern))
    for term in terms:
        if term.operator == "&":
            chosen &= set(_subscripted(term.text, hosts, groups, pattern))
    for term in terms:
        if term.operator == "!":
            chosen -= set(_subscripted(term.text, hosts, groups, pattern))
    if not chosen:
        raise ConfigError(f"{LIMIT} {pattern}: the pattern leaves no host",
                          "`&` keeps only hosts in both, `!` removes hosts: check the pattern's terms")
    return [host for host in hosts if host in chosen]


__all__ = ["LIMIT", "Term", "match_hosts", "split_pattern"]
