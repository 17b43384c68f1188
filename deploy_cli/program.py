"""`sglang-deploy`: the tasks of the project's tasks.py (found from the working directory upwards, as `invoke` finds
them) under the tool's own name, with `--version`."""

from __future__ import annotations

import sys
from importlib.metadata import version

from invoke import Program

NAME = "sglang-deploy"


def main() -> None:
    # invoke switches bytecode writing off before it loads tasks.py unless given --write-pyc, so each command compiled
    # tasks.py again (~6 ms CPU); Python's own -B and PYTHONDONTWRITEBYTECODE still decide
    write_pyc = [] if sys.flags.dont_write_bytecode else ["--write-pyc"]
    Program(name=NAME, binary=NAME, version=version(NAME)).run([NAME, *write_pyc, *sys.argv[1:]])
