"""`sglang-deploy`: the user tasks of the installed package (deploy_cli.collection) under the tool's own name, in
any project directory (found from the working directory, or `--project DIR`), with `--version`. No tasks.py is
looked for: the checkout's tasks.py is for `invoke` there (it adds the sandbox and demo)."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

from invoke import Argument, Program

from deploy_lib.project import PROJECT_ENV

NAME = "sglang-deploy"


class DeployProgram(Program):
    def core_args(self) -> list[Argument]:
        return [*super().core_args(), Argument(names=("project",), help="the project directory (default: the "
                                               "nearest one upwards holding inventory/)")]

    def parse_core(self, argv: list[str] | None) -> None:
        super().parse_core(argv)
        # invoke turns bytecode writing off (unless --write-pyc) before a command runs: the modules the task then
        # imports were compiled from source on every command. Python's own setting (-B) decides instead.
        sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
        given = self.args["project"].value
        if given:
            os.environ[PROJECT_ENV] = given


def main() -> None:
    from deploy_cli.collection import user_tasks
    DeployProgram(name=NAME, binary=NAME, version=version(NAME), namespace=user_tasks()).run()
