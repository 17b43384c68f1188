"""Checks the wheels a build uses against the sha256 in their directory name (argv: sha256, wheels/<sha256> pairs).

Standard library only, no deploy_lib imports; run by the host's python (`python3 -I -c`). A wheel is read once: its
stamp (.verified: size, mtime, ctime, inode) says it was checked and has not been written since (any write changes
its ctime), so a build reads only wheels that are new or touched. A damaged or missing one has its directory removed
(so the next run sends it again) and is named on stderr; the exit code is then 1.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as wheel:
        for chunk in iter(lambda: wheel.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(expected: str, directory: str) -> list[str]:
    """What is damaged in one wheel directory (removed), after stamping the wheels that are sound."""
    wheels = glob.glob(os.path.join(glob.escape(directory), "*.whl"))
    if not wheels:
        shutil.rmtree(directory, ignore_errors=True)
        return [f"{directory}: no wheel"]
    damaged = []
    for path in wheels:
        info = os.stat(path)
        stamp = f"{expected} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino}\n"
        stamp_path = os.path.join(directory, ".verified")
        try:
            with open(stamp_path) as stamped:
                if stamped.read() == stamp:
                    continue
        except FileNotFoundError:
            pass
        actual = sha256_of(path)
        if actual != expected:
            shutil.rmtree(directory)
            damaged.append(f"{path}: sha256 {actual}, expected {expected}; removed")
            continue
        with open(stamp_path + ".tmp", "w") as fresh:
            fresh.write(stamp)
        os.replace(stamp_path + ".tmp", stamp_path)
    return damaged


if __name__ == "__main__":
    pairs = zip(sys.argv[1::2], sys.argv[2::2])  # noqa: B905 (strict= needs Python 3.10; hosts may be older)
    damaged = [line for expected, directory in pairs for line in verify(expected, directory)]
    for line in damaged:
        print(line, file=sys.stderr)
    sys.exit(1 if damaged else 0)
