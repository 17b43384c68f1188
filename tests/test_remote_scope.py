"""A connector connects and runs steps, nothing more (issue 38): no module of deploy_lib/remote/ reads the command
line, keeps state across commands at exit, rebinds a module global, or imports the CLI. Read from the source, so a
new module is checked too."""

from __future__ import annotations

import ast
from pathlib import Path

REMOTE = Path(__file__).resolve().parent.parent / "deploy_lib" / "remote"


def knowing_more(tree: ast.Module) -> list[str]:
    """What in a module knows of the command line or of earlier commands, one line each."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            found.append(f"{node.lineno}: sys.argv")
        elif isinstance(node, ast.Global):
            found.append(f"{node.lineno}: global {', '.join(node.names)}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{node.lineno}: import {name}" for name in names
                      if name.split(".")[0] in ("atexit", "deploy_cli")]
    return found


def test_no_module_of_remote_knows_of_the_command_line_or_of_earlier_commands() -> None:
    found = {path.name: knowing_more(ast.parse(path.read_text())) for path in sorted(REMOTE.glob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_check_sees_each_kind_of_knowing() -> None:
    """The check itself, on a module that does all it looks for (as remote/reads_record.py and read_ahead.py did)."""
    source = ("import atexit, sys\nfrom deploy_cli import program\n_current = None\n"
              "def install(x):\n    global _current\n    _current = (x, sys.argv)\n")
    assert knowing_more(ast.parse(source)) == ["1: import atexit", "2: import deploy_cli", "5: global _current",
                                               "6: sys.argv"]
