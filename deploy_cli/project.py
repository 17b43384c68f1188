"""init, docs and version: a project directory of the user's own, the guide's pages and the tool itself."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from invoke import Context, Exit

from deploy_cli import common
from deploy_cli import present as ui
from deploy_cli.options import task


@task(help={"model": "your model: a Hugging Face repo id (Qwen/Qwen3-8B) or the weights' absolute path on the host",
            "gpus": "GPUs the model runs on, its tensor parallelism: 1, 2, 4, 8 or 16 (default 1)",
            "host": "the GPU host's address (or an alias of your ssh config)",
            "user": "the SSH user (default: your ssh config's User, else your local user)",
            "venv": "where SGLang is installed on the host (default /root/ml-env)",
            "name": "the profile's name (default: the model's, in lower case)",
            "example": "a bundled example instead of your model: glm5-nvfp4 (the reference rig)",
            "directory": "where to write the project (default: the working directory)"})
def init(c: Context, model: str | None = None, gpus: int = 1, host: str | None = None, user: str | None = None,
         venv: str | None = None, name: str | None = None, example: str | None = None, directory: str = ".",
         json: bool = False) -> None:
    """Start a project for your model: inventory/profiles/NAME.yaml (only what differs from SGLang's defaults),
    inventory/hosts.yaml with your host, a .gitignore; contacts nothing, overwrites nothing.

    Without --model (or --example) at a terminal, it asks for the model, its GPUs and the host."""
    from deploy_lib.deploy.starter import ModelRequest, new_project, write_project
    common.report_as(json)
    if model is None and example is None and sys.stdin.isatty():
        model, gpus, host = _asked(gpus, host)
    project = common.run(lambda: new_project(example, ModelRequest(model, gpus, host, user, venv, name)))
    written = common.run(lambda: write_project(Path(directory), project))
    common.show({"profile": project.profile, "written": written, "host_needs": project.host_needs}, _print_written)


def _print_written(written: dict[str, Any]) -> None:
    for path in written["written"]:
        ui.console.print(f"wrote {path}", markup=False)
    ui.console.print("the host must already have:", markup=False)
    for need in written["host_needs"]:
        ui.console.print(f"  {need}", markup=False)
    profile = written["profile"]
    ui.console.print(f"next: `invoke plan {profile} --accept-new-host-key`, then "  # as the program run
                     f"`invoke deploy {profile}`", markup=False)


def _asked(gpus: int, host: str | None) -> tuple[str, int, str]:
    """init's questions: the model, its GPUs (--gpus the default) and the host unless --host gave it."""
    model = ui.ask("Your model: a Hugging Face repo id (Qwen/Qwen3-8B) or the weights' absolute path on the host")
    count = _asked_gpus(gpus) if model is not None else None
    address = host if host is not None else (
        ui.ask("The GPU host's address (or an alias of your ssh config)") if count is not None else None)
    if model is None or count is None or address is None:
        raise Exit("init stopped before every answer was given; nothing was written", code=1)
    return model, count, address


def _asked_gpus(default: int) -> int | None:
    while (answer := ui.ask("GPUs it runs on (1, 2, 4, 8 or 16)", str(default))) is not None:
        if answer.isdigit():
            return int(answer)
        ui.errors.print(f"{answer!r} is not a number of GPUs", markup=False)
    return None


@task
def version(c: Context, json: bool = False) -> None:
    """Print the tool's version."""
    from importlib.metadata import version as package_version
    common.report_as(json)
    common.show({"version": package_version("sglang-deploy")},
                lambda shown: ui.console.print(f"sglang-deploy {shown['version']}", markup=False))


@task(operand="page", help={"page": "the page to print: its name, as the list gives it (profiles, troubleshooting)",
                            "path": "print where the pages are (with a page: where that page is) instead of text"})
def docs(c: Context, page: str | None = None, path: bool = False) -> None:
    """List the guide's pages, or print one: the same pages as the guide's site, carried by the installed tool."""
    from deploy_lib.guide import GUIDE_DIR, guide_page, guide_pages
    if page is not None:
        found = common.run(lambda: guide_page(page))
        # as written, not through the console: a page's `invoke TASK` (the checkout's) is not the program's name
        sys.stdout.write(f"{found.path}\n" if path else found.text())
        return
    pages = common.run(guide_pages)
    if path:
        ui.console.print(str(GUIDE_DIR), markup=False)
        return
    width = max(len(each.name) for each in pages)
    ui.print_lines([*(f"{each.name:<{width}}  {each.title}" for each in pages),
                    f"`invoke docs --page NAME` prints one; the files are in {GUIDE_DIR}"])
