"""Consent: a task that changes a host asks first. Without a terminal on stdin and without --yes it refuses (exit 1,
with a hint) before any connection; at a terminal the question ends in a visible `[y/N]` and Enter means no.

The inventory is the repository's own (the reference rig at 192.0.2.10, a documentation address no test can
reach): a task that went past the question would fail to connect (exit 5) instead."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HOST_CHANGING = [
    ["deploy", "--profile", "glm5-nvfp4"],
    ["rollback"],
    ["unlock"],
    ["venv.adopt", "--path", "/root/ml-env"],
    ["patch-fusion", "--enable"],
    ["patch-fusion", "--disable"],
    ["patch", "--name", "nsa-aliases", "--enable"],
    # asked by the library through Reach since issue 38, as the ones above
    ["tune", "--profile", "glm5-nvfp4", "--vary", "memory.max_running_requests=64,128"],
    ["venv.remove", "--venv-hash", "0123456789ab"],
    ["adopt", "--profile", "adopted-by-the-consent-test", "--pid", "4242"],
]


def invoke(*args: str) -> list[str]:
    return [sys.executable, "-m", "invoke", *args]


@pytest.mark.parametrize("task", HOST_CHANGING, ids=lambda task: " ".join(task))
def test_without_a_terminal_and_without_yes_a_host_change_is_refused(task: list[str]) -> None:
    done = subprocess.run(invoke(*task), cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SGLANG_DEPLOY_INVENTORY": ""})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stdin is not a terminal" in done.stderr and "--yes" in done.stderr
    assert "connect" not in done.stderr  # refused before any SSH


def read_until(fd: int, wanted: bytes, deadline_s: float = 60) -> bytes:
    """What the pty printed up to and including `wanted` (or everything read when it never came)."""
    seen = b""
    end = time.monotonic() + deadline_s
    while wanted not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize(("answer", "code", "then"), [
    (b"\r", 1, b"cancelled: nothing was changed"), (b"n\r", 1, b"cancelled: nothing was changed"),
    (b"maybe\r", 1, b"cancelled: nothing was changed"),
    (b"y\r", 5, b"cannot connect"),  # yes goes ahead: to the unreachable documentation address
])
def test_at_a_terminal_the_question_shows_y_n_and_defaults_to_no(answer: bytes, code: int, then: bytes) -> None:
    primary, secondary = pty.openpty()
    child = subprocess.Popen(invoke("deploy", "--profile", "glm5-nvfp4"), cwd=REPO, stdin=secondary,
                             stdout=secondary, stderr=secondary, close_fds=True,
                             env={**os.environ, "SGLANG_DEPLOY_INVENTORY": "", "TERM": "dumb"})
    os.close(secondary)
    try:
        prompt = read_until(primary, b"[y/N] ")
        assert b"deploy glm5-nvfp4 to " in prompt and prompt.endswith(b"? [y/N] "), prompt
        os.write(primary, answer)
        rest = read_until(primary, then)
        assert child.wait(timeout=60) == code
        assert then in rest, rest
    finally:
        if child.poll() is None:
            child.kill()
        os.close(primary)
