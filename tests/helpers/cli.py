"""Running the CLI as a user does (`invoke`, in-process) from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def invoke(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`invoke ARGV` as a user types it, in cwd (the project root unless a test says otherwise)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")} | (env or {})
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv], cwd=cwd,
                          capture_output=True, text=True, env=environ, timeout=120)
