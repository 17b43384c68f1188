"""`sglang-deploy`: the tasks of the project's tasks.py (found from the working directory upwards, as `invoke` finds
them) under the tool's own name, with `--version`."""

from __future__ import annotations

from importlib.metadata import version

from invoke import Program

NAME = "sglang-deploy"


def main() -> None:
    Program(name=NAME, binary=NAME, version=version(NAME)).run()
