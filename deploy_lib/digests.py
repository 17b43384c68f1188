"""The one SHA-256 of a text or of bytes (hex): release files in release.json, patch records, checksums read back from
hosts, venv content."""

from __future__ import annotations

import hashlib


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
