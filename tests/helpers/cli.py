"""Running the CLI as a user does (`invoke`, in-process) from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_cli.collection import user_tasks
from deploy_cli.program import NAME, DeployProgram, OneTaskExecutor

REPO = Path(__file__).resolve().parents[2]


def invoke(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`invoke ARGV` as a user types it, in cwd (the project root unless a test says otherwise)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")} | (env or {})
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv], cwd=cwd,
                          capture_output=True, text=True, env=environ, timeout=120)


def sglang_deploy(line: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """`sglang-deploy LINE` through the program's own run, in the working directory: (exit code, stdout, stderr)."""
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=user_tasks(),
                            executor_class=OneTaskExecutor)
    try:
        program.run([NAME, *line.split()])
        code: object = 0
    except SystemExit as ended:
        code = ended.code
    shown = capsys.readouterr()
    return code, shown.out, shown.err
