"""The uv binary out of its (verified) wheel into tools/<sha256>/ (argv: wheel directory, member, destination).

Standard library only, no deploy_lib imports; run by the host's python (`python3 -I -c`). Written in
<destination>.tmp and renamed whole, so tools/<sha256>/uv is either complete or absent.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import zipfile


def extract(directory: str, member: str, dest: str) -> None:
    [wheel] = glob.glob(os.path.join(glob.escape(directory), "*.whl"))
    staging = dest + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    binary = os.path.join(staging, "uv")
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(binary, "xb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(binary, 0o755)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(staging, dest)


if __name__ == "__main__":
    extract(*sys.argv[1:4])
