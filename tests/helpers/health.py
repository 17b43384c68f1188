"""The readiness probe run locally against stand-in systemctl and journalctl tools."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from deploy_lib.remote import Step


def run_probe(step: Step, path: str | None = None, **environ: str) -> dict[str, Any]:
    env = dict(os.environ, PATH=path if path is not None else os.environ["PATH"], **environ)
    done = subprocess.run([sys.executable, "-"], input=step.stdin, capture_output=True, timeout=60, env=env,
                          check=True)
    [line] = done.stdout.decode().splitlines()
    return json.loads(line)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SYSTEMCTL = """#!/bin/sh
echo "$@" > "{directory}/systemctl.args"
printf 'ActiveState=active\\nSubState=running\\nNRestarts=0\\nExecMainPID=4242\\nExecMainStatus=0\\n'
printf 'ExecMainCode=0\\nResult=success\\nInvocationID=0f4c\\n'
"""


def fake_tools(directory: Path, **scripts: str) -> str:
    """Scripts named like the host's tools, first on a PATH that has nothing else but /bin and /usr/bin."""
    for name, text in scripts.items():
        (directory / name).write_text(text.replace("{directory}", str(directory)))
        (directory / name).chmod(0o755)
    return f"{directory}:/usr/bin:/bin"
