"""The batch script run locally with bash, parsed as a round trip's output."""

from __future__ import annotations

import shutil
import subprocess
from typing import NamedTuple

from deploy_lib.remote import (
    Step,
    StepResult,
    batch_script,
    parse_batch_output,
)


class ScriptRun(NamedTuple):
    """What the batch script did on this machine: its steps' results, the running step's output, the bash."""

    results: list[StepResult]
    running_out: str
    running_err: str
    process: subprocess.CompletedProcess[bytes]


def run_script(steps: list[Step], stdin: bytes = b"", user: str = "root", caller: tuple[str, ...] = (),
               env: dict[str, str] | None = None, with_password: bool = False) -> ScriptRun:
    """The batch script for inventory user `user`, run by this machine's bash as `caller` (this process's user when
    empty) with `stdin` on the channel, as the host would run it, and its output parsed; `with_password`: the script
    of a sudo password, which `stdin` then starts with (its first line)."""
    marker = "f00dfeedcafe0001"
    bash = shutil.which("bash") or "bash"  # found here: `env` may give a PATH without it
    done = subprocess.run([*caller, bash, "-c", batch_script(steps, user, marker, with_password)], input=stdin,
                          capture_output=True, cwd="/", timeout=60, env=env)
    return ScriptRun(*parse_batch_output(steps, marker, done.stdout.decode(), done.stderr.decode()), done)
