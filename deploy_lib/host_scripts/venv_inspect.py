"""The distributions of the venv this interpreter belongs to (run by the venv's own python: `python3 -I -c`).

Standard library only, no deploy_lib imports. Each distribution inside the venv comes with the sha256 of its RECORD
and the files that no longer match their RECORD (drift): [path, actual sha256 or "missing"]; prefix and base_prefix
tell a venv from a system python.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import sys
from importlib import metadata


def file_digest(path: str, algorithm: str) -> bytes:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.digest()


def drift_of(dist: metadata.Distribution, record: str) -> list[list[str]]:
    drift = []
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not row[1]:
            continue
        algorithm, _, expected = row[1].partition("=")
        path = str(dist.locate_file(row[0]))
        try:
            actual = file_digest(path, algorithm)
        except FileNotFoundError:
            drift.append([row[0], "missing"])
            continue
        if base64.urlsafe_b64encode(actual).rstrip(b"=").decode() != expected:
            drift.append([row[0], file_digest(path, "sha256").hex()])
    return drift


def distributions() -> dict[str, dict]:
    prefix = os.path.realpath(sys.prefix)
    found: dict[str, dict] = {}
    for dist in metadata.distributions():
        location = os.path.realpath(str(dist.locate_file("")))
        name = (dist.metadata["Name"] or "").lower().replace("_", "-").replace(".", "-")
        if not name or name in found or not location.startswith(prefix + os.sep):
            continue
        record = dist.read_text("RECORD") or ""
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
        editable = direct_url.get("url", "") if direct_url.get("dir_info", {}).get("editable") else None
        found[name] = {"version": dist.version, "record_sha256": hashlib.sha256(record.encode()).hexdigest(),
                       "drift": drift_of(dist, record), "editable": editable}
    return found


if __name__ == "__main__":
    print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix, "distributions": distributions()}))
