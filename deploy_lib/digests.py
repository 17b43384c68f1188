"""The one SHA-256 of a text or of bytes (hex): release files in release.json, patch records, checksums read back from
hosts, venv content."""

from __future__ import annotations

import hashlib

HASH_CHARS = 16  # of a short hash: short enough for shebangs, plenty for the names in one host's store


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def short_hash(text: str) -> str:
    """The first HASH_CHARS hex digits of the text's SHA-256: a name in the store (a venv, a venv's SGLang facts)."""
    return sha256_text(text)[:HASH_CHARS]
