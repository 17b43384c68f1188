"""The requirements lock a venv is built from: every requirement pinned with `==` and at least one sha256.

The normalised lock (comments, order and spelling gone) is what a built venv's hash covers and what uv reads on
the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deploy_lib.digests import sha256_text
from deploy_lib.errors import ConfigError
from deploy_lib.venvs.paths import canonical_name

_NAME_RE = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")
_PIN_RE = re.compile(r"^==\s*([A-Za-z0-9_.!+-]+)\s*(?:;\s*(.+))?$")
_HASH_OPTION_RE = re.compile(r"--hash(?:=|\s+)(\S+)")
_SHA256_RE = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class Requirement:
    name: str                 # canonical
    version: str
    extras: tuple[str, ...]
    marker: str
    hashes: frozenset[str]    # sha256 hex digests
    line: int

    def normalized(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        marker = f" ; {self.marker}" if self.marker else ""
        hashes = " ".join(f"--hash=sha256:{digest}" for digest in sorted(self.hashes))
        return f"{self.name}{extras}=={self.version}{marker} {hashes}"


@dataclass(frozen=True)
class Lock:
    path: Path
    requirements: tuple[Requirement, ...]   # sorted by name

    def text(self) -> str:
        """The normalised lock: what the hash covers and what pip reads on the host (comments and order gone)."""
        return "".join(requirement.normalized() + "\n" for requirement in self.requirements)

    @property
    def sha256(self) -> str:
        return sha256_text(self.text())

    def distributions(self) -> dict[str, str]:
        return {r.name: r.version for r in self.requirements}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line number, joined text) with comments removed and backslash continuations joined."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate([*text.splitlines(), ""], start=1):  # the empty line ends a dangling continuation
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        pending.append(line.removesuffix("\\").strip())
        if line.endswith("\\"):
            continue
        joined = " ".join(part for part in pending if part)
        pending = []
        if joined:
            yield start, joined


def parse_lock(text: str, path: Path) -> Lock:
    """Every requirement pinned with `==` and at least one `--hash=sha256:`; anything else is a ConfigError."""
    found: dict[str, Requirement] = {}
    for number, line in _logical_lines(text):
        def bad(why: str, number: int = number, line: str = line) -> ConfigError:
            return ConfigError(f"{path}:{number}: {why}: {line[:200]}",
                               hint="generate the lock with `pip-compile --generate-hashes` or "
                                    "`uv pip compile --generate-hashes`; the profile says where wheels come from")
        hash_values = _HASH_OPTION_RE.findall(line)
        spec = _HASH_OPTION_RE.sub(" ", line).strip()
        if spec.startswith("-"):
            raise bad("options are not allowed in a lock (only requirements with --hash)")
        match = _NAME_RE.match(spec)
        pin = _PIN_RE.match(match.group(3).strip()) if match else None
        if match is None or pin is None or "*" in pin.group(1):
            raise bad("requirement is not pinned with `name==version`")
        digests = set()
        for value in hash_values:
            sha = _SHA256_RE.match(value)
            if sha is None:
                raise bad(f"hash {value!r} is not sha256:<64 hex digits>")
            digests.add(sha.group(1))
        if not digests:
            raise bad("requirement has no --hash=sha256:... (pip runs with --require-hashes)")
        name = canonical_name(match.group(1))
        if name in found:
            raise bad(f"{name} is already pinned on line {found[name].line}")
        extras = tuple(sorted(canonical_name(e.strip()) for e in (match.group(2) or "[]")[1:-1].split(",")
                              if e.strip()))
        found[name] = Requirement(name, pin.group(1), extras, (pin.group(2) or "").strip(), frozenset(digests),
                                  number)
    if not found:
        raise ConfigError(f"{path}: the lock has no requirements")
    return Lock(path, tuple(found[name] for name in sorted(found)))


def load_lock(path: Path) -> Lock:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read lock file {path}: {error}") from error
    return parse_lock(text, path)
