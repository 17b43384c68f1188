"""Rewrites a venv's old location in bin/ scripts (shebangs, activate) and pyvenv.cfg (argv: root, old, new).

Standard library only, no deploy_lib imports; run by a python on the host (`python3 -I -c`). Each changed file is
written as a new file and renamed over the old entry: in a hard-linked copy the original is never touched. Prints the
changed paths (relative to root) as JSON.
"""

from __future__ import annotations

import json
import os
import re
import sys


def relocate(root: str, old: str, new: str) -> list[str]:
    pattern = re.compile(re.escape(old.encode()) + rb"(?=[/\"'\s:]|$)", re.M)
    bin_dir = os.path.join(root, "bin")
    names = sorted(os.listdir(bin_dir)) if os.path.isdir(bin_dir) else []
    changed = []
    for path in [os.path.join(root, "pyvenv.cfg")] + [os.path.join(bin_dir, name) for name in names]:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as current:
            data = current.read()
        text_file = data.startswith(b"#!") or os.path.basename(path).startswith("activate") or path.endswith(".cfg")
        moved = pattern.sub(lambda match: new.encode(), data) if text_file else data
        if moved == data:
            continue
        info = os.stat(path)
        temp = path + ".relocate-tmp"
        with open(temp, "xb") as fresh:
            fresh.write(moved)
        os.chown(temp, info.st_uid, info.st_gid)
        os.chmod(temp, info.st_mode & 0o7777)
        os.replace(temp, path)
        changed.append(os.path.relpath(path, root))
    return changed


if __name__ == "__main__":
    print(json.dumps(relocate(*sys.argv[1:4])))
