"""Messages name the program the user ran: `sglang-deploy TASK` from the installed command, `invoke TASK` in the
checkout; the installed command's help names neither `invoke` nor a page it does not have."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import invoke

from deploy_lib.deploy.starter import ModelRequest, new_project, write_project
from deploy_lib.errors import EXIT_CODES
from deploy_lib.program_name import spoken

SGLANG_DEPLOY = "import sys; from deploy_cli.program import main; sys.argv[0] = 'sglang-deploy'; main()"
BAD_SET = ("render", "--profile", "qwen3-8b", "--set", "memory.bogus=1")  # refused with a hint naming `schema`


def sglang_deploy(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed command's entry point (deploy_cli.program:main, as pyproject's [project.scripts] names it)."""
    return subprocess.run([sys.executable, "-c", SGLANG_DEPLOY, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path, new_project(None, ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10")))
    return tmp_path


def test_a_hint_from_the_installed_command_names_sglang_deploy_and_not_invoke(project: Path) -> None:
    """Failed before: the hint said `invoke schema`, which fails outside the checkout (`Can't find any collection
    named 'tasks'!`)."""
    done = sglang_deploy(*BAD_SET, cwd=project)
    assert done.returncode == 2
    assert "hint: `sglang-deploy schema` prints every key" in done.stderr and "invoke" not in done.stderr
    as_json = sglang_deploy(*BAD_SET, "--json", cwd=project)
    assert json.loads(as_json.stdout)["error"]["hint"].startswith("`sglang-deploy schema`")


def test_the_same_hint_in_the_checkout_names_invoke(project: Path) -> None:
    done = invoke(*BAD_SET, cwd=project)
    assert done.returncode == 2 and "hint: `invoke schema` prints every key" in done.stderr


def test_inits_next_step_names_the_program_that_ran_it(tmp_path: Path) -> None:
    argv = ("init", "--model", "Qwen/Qwen3-8B", "--host", "192.0.2.10")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert "next: `sglang-deploy plan qwen3-8b" in sglang_deploy(*argv, cwd=tmp_path / "a").stdout
    assert "next: `invoke plan qwen3-8b" in invoke(*argv, "--directory", str(tmp_path / "b"), cwd=tmp_path).stdout


def test_the_installed_commands_help_lists_every_exit_code_and_points_to_no_readme(tmp_path: Path) -> None:
    """Failed before: "3 to 11 and 130/143 as the README's table says" (the wheel carries no README)."""
    shown = sglang_deploy("--help", cwd=tmp_path).stdout
    codes = shown.split("Exit codes:", 1)[1]
    for error, code in EXIT_CODES.items():
        assert f" {code} " in codes and (error.__name__ in codes or code == 1)
    assert "README" not in shown and "invoke " not in shown


def test_the_library_speaks_as_the_checkout_until_an_entry_point_says_otherwise() -> None:
    assert spoken("run `invoke status`") == "run `invoke status`"


def test_every_command_a_message_names_is_in_backquotes_so_it_is_spoken() -> None:
    """`spoken` turns `` `invoke TASK` `` into the program the user ran; a message that names a task as bare
    `invoke TASK` would reach the installed command's user as is (failed before: "(full line: invoke logs)")."""
    import ast

    from deploy_cli.collection import user_tasks
    tasks = {alias for name, aliases in user_tasks().task_names.items() for alias in (name, *aliases)}
    bare = re.compile(r"(?<!`)\binvoke ([a-z][\w.-]*)")
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted([*(root / "deploy_lib").rglob("*.py"), *(root / "deploy_cli").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and ast.get_docstring(node) is not None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{path.relative_to(root)}:{node.lineno}: invoke {task}"
                          for task in bare.findall(node.value) if task in tasks]
    assert found == []
