"""Version ranges of a patch set: ">=0.5.8.post1,<0.5.16" (one lower and one upper bound at most, or "==V"),
compared as PEP 440 orders SGLang's and FlashInfer's versions (versions.version_key, packaging.version)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from deploy_lib.versions import version_key

_CLAUSE_RE = re.compile(r"^\s*(>=|<=|==|>|<)\s*([0-9][0-9A-Za-z.]*)\s*$")
Bound = tuple[Version, bool]  # (version, inclusive)


@dataclass(frozen=True)
class VersionRange:
    text: str
    lower: Bound | None
    upper: Bound | None

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        lower: Bound | None = None
        upper: Bound | None = None
        for clause in text.split(","):
            match = _CLAUSE_RE.match(clause)
            if match is None:
                raise ValueError(f"{clause.strip()!r} in {text!r} is not a bound; write e.g. '>=0.5.8.post1,<0.5.16'")
            operator, version = match.groups()
            key = version_key(version)
            if operator in (">=", ">", "=="):
                if lower is not None:
                    raise ValueError(f"{text!r} has two lower bounds")
                lower = (key, operator != ">")
            if operator in ("<=", "<", "=="):
                if upper is not None:
                    raise ValueError(f"{text!r} has two upper bounds")
                upper = (key, operator != "<")
        if _empty(lower, upper):
            raise ValueError(f"{text!r} contains no version")
        return cls(text, lower, upper)

    def contains(self, version: str) -> bool:
        key = version_key(version)
        above = self.lower is None or key > self.lower[0] or (key == self.lower[0] and self.lower[1])
        below = self.upper is None or key < self.upper[0] or (key == self.upper[0] and self.upper[1])
        if below and self.upper is not None and not self.upper[1] \
                and version_key(key.base_version) == version_key(self.upper[0].base_version):
            below = not key.is_prerelease  # PEP 440: "<0.5.16" admits no 0.5.16rc1
        return above and below

    def overlaps(self, other: VersionRange) -> bool:
        lowers = [b for b in (self.lower, other.lower) if b is not None]
        uppers = [b for b in (self.upper, other.upper) if b is not None]
        # the tighter bound wins; at equal keys an exclusive bound is the tighter one
        lower = max(lowers, key=lambda b: (b[0], not b[1])) if lowers else None
        upper = min(uppers, key=lambda b: (b[0], b[1])) if uppers else None
        return not _empty(lower, upper)


def _empty(lower: Bound | None, upper: Bound | None) -> bool:
    if lower is None or upper is None:
        return False
    return lower[0] > upper[0] or (lower[0] == upper[0] and not (lower[1] and upper[1]))


def parse_ranges(versions: str | list[str]) -> tuple[VersionRange, ...]:
    return tuple(VersionRange.parse(text) for text in ([versions] if isinstance(versions, str) else versions))

