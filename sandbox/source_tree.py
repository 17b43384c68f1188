"""A source checkout of SGLang made from its wheel, for editable installs (`pip install -e DIR`).

SGLang publishes no sdist after 0.5.10.post1, so the checkout our users run from (`/root/sglang/python`, the
`python/` directory of the repository) is stood in for by the wheel's packages laid out the same way, with a
minimal setuptools pyproject of our own: setuptools then writes what it writes for the real checkout, an
`__editable__.sglang-<version>.pth` and its finder module in site-packages, and pip a direct_url.json with
`"dir_info": {"editable": true}`.

Standard library only: it also runs on the sandbox guest (`python3 - WHEEL DEST < source_tree.py`).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"

[tool.setuptools.packages.find]
include = ["{package}", "{package}.*"]
"""


def make_source_tree(wheel: Path, dest: Path, package: str = "sglang") -> Path:
    """Unpack the wheel's files (not its .dist-info) into dest and write dest/pyproject.toml; returns dest."""
    name, version = wheel.name.split("-")[:2]
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.split("/", 1)[0] == package]
        archive.extractall(dest, members)
    (dest / "pyproject.toml").write_text(PYPROJECT.format(name=name, version=version, package=package))
    return dest


if __name__ == "__main__":
    make_source_tree(Path(sys.argv[1]), Path(sys.argv[2]))
