"""init and version: a project directory of the user's own, and the tool itself."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task


@task(help={"directory": "where to write the project (default: the working directory)"})
def init(c: Context, directory: str = ".") -> None:
    """Start a project: inventory/hosts.yaml with an example host, inventory/profiles/ with the reference profile
    glm5-nvfp4 and a .gitignore; refuses to overwrite any file."""
    from deploy_lib.deploy.project import write_starter
    for path in common.run(lambda: write_starter(Path(directory))):
        ui.console.print(f"wrote {path}", markup=False)
    ui.console.print("next: put your host in inventory/hosts.yaml, then `sglang-deploy render --profile glm5-nvfp4`",
                     markup=False)


@task
def version(c: Context) -> None:
    """Print the tool's version."""
    from importlib.metadata import version as package_version
    ui.console.print(f"sglang-deploy {package_version('sglang-deploy')}")
