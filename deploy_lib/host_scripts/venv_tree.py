"""A package tree copied into a derived venv (run by the venv's python: `python3 -I -c`).

Standard library only, no deploy_lib imports. A tree's digest covers every file's path, bytes and executable bit, and
symlinks; __pycache__ is left out (Python rebuilds it). `digest DIR...` prints {DIR: digest}; `copy SRC DEST DIGEST`
copies SRC to DEST (replacing DEST's directory entry only) and removes the copy unless it has DIGEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys


def digest(root: str) -> str:
    total = hashlib.sha256()
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                total.update(f"L {relative} {os.readlink(path)}\n".encode())
                continue
            with open(path, "rb") as stream:
                content = hashlib.sha256(stream.read()).hexdigest()
            executable = "x" if os.stat(path).st_mode & 0o111 else "-"
            total.update(f"F {relative} {executable} {content}\n".encode())
    return total.hexdigest()


def copy(source: str, dest: str, expected: str) -> None:
    if os.path.islink(dest) or os.path.isfile(dest):
        os.unlink(dest)
    elif os.path.isdir(dest):
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    found = digest(dest)
    if found != expected:
        shutil.rmtree(dest)
        sys.exit(f"{source} changed while it was copied (digest {found}, expected {expected}); copy removed")


if __name__ == "__main__":
    if sys.argv[1] == "digest":
        print(json.dumps({root: digest(root) for root in sys.argv[2:]}))
    else:
        copy(*sys.argv[2:5])
