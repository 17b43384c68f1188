"""What the store's reads print on a host, for a FakeRemote to answer with."""

from __future__ import annotations


def release_entries(*release_ids: str) -> str:
    """`find releases -mindepth 1 -maxdepth 2 -printf %P\\0` of complete releases."""
    return "".join(f"{rid}\0{rid}/release.json\0{rid}/sglang.service\0{rid}/sglang.env\0{rid}/launch\0"
                   for rid in release_ids)
