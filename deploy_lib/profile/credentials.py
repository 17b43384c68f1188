"""Credentials recognised by their value: what a plain `env:` value looks like when it is a token or a key that belongs
in `secrets:`. Pure functions; the profile refuses what they find (issue 40: `env: {AWS_SECRET_ACCESS_KEY: wJalr...}`
and `HF_AUTH: hf_...` were rendered in clear, since only names were looked at)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

# A known credential's shape, searched anywhere in the value (`Bearer hf_...` and a token inside a URL are found too).
# Each names what it is; the value itself is never part of a message.
KNOWN: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a PEM private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY")),
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(AKIA|ASIA|ABIA|ACCA|AIDA|AROA|AIPA|ANPA|ANVA|APKA|AGPA)"
                                        r"[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9])(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("an OpenAI-style API key", re.compile(r"(?<![A-Za-z0-9])sk-(proj-|ant-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9]+/[A-Za-z0-9]+/[A-Za-z0-9]+")),
    ("a JSON Web Token", re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("a URL with a password", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)

# An AWS secret access key: 40 characters of base64's alphabet (it may hold '/', unlike any other token above).
AWS_SECRET = re.compile(r"[A-Za-z0-9+/]{40}")
# What a long random token is made of; '.', ':' and ',' are left out so that versions, hosts and lists are not read
# as one.
TOKEN = re.compile(r"[A-Za-z0-9+/=_-]+")
HEX = re.compile(r"[0-9a-fA-F]+")
MIN_RANDOM = 32        # shorter random-looking values are left alone (names, short ids)
MIN_RUN = 20           # a random token has long runs without '-', '_' or '/'; words joined by them do not
RUN = re.compile(r"[A-Za-z0-9+=]+")
MIN_BITS = 4.0         # Shannon entropy per character of mixed-case letters and digits drawn at random is ~5.9
MIN_HEX_BITS = 3.0     # of hex digits drawn at random, ~3.9 at 32 characters


@dataclass(frozen=True)
class Credential:
    """What a value looks like; never the value."""

    kind: str


def entropy(text: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _classes(text: str) -> int:
    return sum(any(test(c) for c in text) for test in (str.islower, str.isupper, str.isdigit))


def looks_like_credential(value: str) -> Credential | None:
    """The kind of credential `value` looks like, or None for an ordinary value (a path, a model id, a number, a URL
    without a password, a list of devices)."""
    for kind, pattern in KNOWN:
        if pattern.search(value):
            return Credential(kind)
    if value.startswith(("/", "./", "~")) or "://" in value:
        return None  # a path or a URL: a secret in either is one of the known shapes above
    if AWS_SECRET.fullmatch(value) and "/" in value[1:] and _classes(value) == 3 and entropy(value) >= MIN_BITS:
        return Credential("an AWS secret access key")
    if len(value) < MIN_RANDOM or not TOKEN.fullmatch(value):
        return None
    if max((len(run) for run in RUN.findall(value)), default=0) < MIN_RUN:
        return None  # `deepseek-ai/DeepSeek-V3-0324-FP4`: words joined, not drawn at random
    if HEX.fullmatch(value):
        if entropy(value) >= MIN_HEX_BITS and _classes(value) >= 2:
            return Credential(f"a long random hex string ({len(value)} characters)")
        return None
    if _classes(value) == 3 and entropy(value) >= MIN_BITS:
        return Credential(f"a long random string ({len(value)} characters)")
    return None
