"""A release's weights and the page cache, on the host (sent whole on the stdin of the host's `python3 -I -S`, after
the request's line: models/page_cache.py BOOTSTRAP; by hand: `python3 page_cache.py '{"measure": {"root": DIR}}'`;
standard library only, Python 3.9 and up).

`measure(where)`: the weight files under a root (given, or a hub revision's snapshot in its HF cache: a branch or
tag resolved through the cache's refs, as huggingface_hub does offline; symlinks followed, as a snapshot's are; a
file reached twice counted once), each one's size and how many of its bytes the page cache holds (mincore(2) on a
read-only mapping, 1 GiB at a time, through ctypes: nothing is read, nothing faults in; None when mincore cannot be
called), and the host's MemAvailable. `read(files)`: each file read once, sequentially, in large blocks
(posix_fadvise SEQUENTIAL and WILLNEED first), with a progress line at most every second. Each prints its result as
one `RESULT <json>` line."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import pwd
import sys
import time
from typing import TextIO

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
RESULT_PREFIX = "RESULT "
PROGRESS_PREFIX = "PROGRESS "
CHUNK = 1 << 30          # bytes mapped per mincore call
BLOCK = 16 << 20         # bytes per read
PAGE = mmap.PAGESIZE
_LOW_BIT = bytes(value & 1 for value in range(256))


def weight_files(roots: list[str]) -> list[tuple[str, int]]:
    """(real path, size) of every weight file under the roots, each file once, in name order."""
    seen: dict[str, int] = {}
    for root in roots:
        for directory, subdirs, names in os.walk(root):
            subdirs.sort()
            for name in sorted(names):
                if not name.endswith(WEIGHT_SUFFIXES):
                    continue
                real = os.path.realpath(os.path.join(directory, name))
                try:
                    seen.setdefault(real, os.stat(real).st_size)
                except OSError:  # a dangling link: not a weight the server can read
                    continue
    return list(seen.items())


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    return libc


def resident_bytes(libc: ctypes.CDLL | None, path: str, size: int) -> int | None:
    """Bytes of the file the page cache holds, or None when mincore cannot tell."""
    if libc is None:
        return None
    if size == 0:
        return 0
    pages = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, CHUNK):
            length = min(CHUNK, size - offset)
            address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
            if address is None or address == ctypes.c_void_p(-1).value:
                return None
            try:
                vector = ctypes.create_string_buffer((length + PAGE - 1) // PAGE)
                if libc.mincore(address, length, vector) != 0:
                    return None
                pages += vector.raw.translate(_LOW_BIT).count(1)
            finally:
                libc.munmap(address, length)
    finally:
        os.close(fd)
    return min(pages * PAGE, size)


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def snapshot_root(where: dict[str, str]) -> str | None:
    """The directory of the weights: `root`, or a hub revision's snapshot (None: the revision is not in the cache)."""
    if "root" in where:
        return where["root"]
    home = where.get("hf_home") or os.path.join(pwd.getpwnam(where["user"]).pw_dir, ".cache", "huggingface")
    repo_dir = os.path.join(home, "hub", "models--" + where["repo"].replace("/", "--"))
    revision = where["revision"]
    if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
        try:
            with open(os.path.join(repo_dir, "refs", revision), encoding="ascii") as ref:
                revision = ref.read().strip()
        except OSError:
            return None
    return os.path.join(repo_dir, "snapshots", revision)


def measure(where: dict[str, str]) -> dict[str, object]:
    libc = _libc()
    root = snapshot_root(where)
    files = [{"path": path, "size": size, "resident": resident_bytes(libc, path, size)}
             for path, size in weight_files([root] if root else [])]
    return {"root": root, "files": files, "mem_available": mem_available()}


def read(files: list[str], out: TextIO | None = None) -> dict[str, object]:
    stream = out or sys.stdout
    total = sum(os.stat(path).st_size for path in files)
    done, started, shown = 0, time.monotonic(), 0.0
    buffer = bytearray(BLOCK)
    view = memoryview(buffer)
    for index, path in enumerate(files):
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            while True:
                count = os.readv(fd, [view])
                if count <= 0:
                    break
                done += count
                now = time.monotonic()
                if now - shown >= 1.0:
                    shown = now
                    print(f"{PROGRESS_PREFIX}{done} {total} {index} {len(files)}", file=stream, flush=True)
        finally:
            os.close(fd)
    print(f"{PROGRESS_PREFIX}{done} {total} {len(files)} {len(files)}", file=stream, flush=True)
    return {"read_bytes": done, "files": len(files), "seconds": round(time.monotonic() - started, 3)}


def main(request: dict[str, object]) -> int:
    result = measure(request["measure"]) if "measure" in request else read(request["files"])  # type: ignore[arg-type]
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
