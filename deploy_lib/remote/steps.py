"""Remote steps as data (Step, Put, StepResult, the Remote protocol), how a step is shown to a person, and when
a result is a failure (StepFailed, StepTimedOut, a sudo password prompt)."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from deploy_lib.errors import StepFailed, StepTimedOut, SudoPasswordRequired

MASK = "***"
# coreutils `timeout` exits 124 when it stopped the command; a step's code 124 reads as a timeout.
TIMED_OUT_EXIT = 124


TAIL_LINES = 12
DISK_FULL = "No space left on device"  # strerror(ENOSPC), as coreutils, sftp and Python print it
# What `sudo -n` prints when the user has no NOPASSWD rule (sudo 1.8 - 1.9, any step, any accepted exit code).
SUDO_PASSWORD_PROMPT = "sudo: a password is required"


@dataclass(frozen=True, repr=False)
class Step:
    """One remote command as data; batch.command_line quotes its argv once and adds sudo where needed."""

    name: str
    argv: tuple[str, ...]
    sudo: bool = False
    stdin: bytes | None = None
    ok: frozenset[int] = frozenset({0})
    timeout_s: float = 60
    secret: bool = False
    # Consecutive concurrent steps of a round trip run at the same time (read-only facts that each start a Python);
    # their results come back in order, and the batch stops after them when one failed.
    concurrent: bool = False
    # Safe to send again on a new connection when the connection dropped before its result came (`repeatable`):
    # a read, or a write that leaves the same result however far the first attempt got.
    repeatable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.argv, tuple) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(f"step {self.name!r}: argv must be a non-empty tuple of str, got {self.argv!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"step {self.name!r}: timeout_s must be positive")

    def __repr__(self) -> str:
        argv = MASK if self.secret else repr(self.argv)
        stdin = "None" if self.stdin is None else (MASK if self.secret else f"<{len(self.stdin)} bytes>")
        return (f"Step(name={self.name!r}, argv={argv}, sudo={self.sudo}, stdin={stdin}, "
                f"ok={sorted(self.ok)}, timeout_s={self.timeout_s}, secret={self.secret})")


@dataclass(frozen=True, repr=False)
class Put:
    """Write `data` to `dest` atomically: temp file beside it, mode (and owner root) set, then renamed."""

    dest: PurePosixPath
    data: bytes
    mode: int
    sudo: bool = False
    secret: bool = False

    def __post_init__(self) -> None:
        if not self.dest.is_absolute() or self.dest.name in ("", ".", ".."):
            raise ValueError(f"put: dest must be an absolute file path, got {str(self.dest)!r}")

    @property
    def name(self) -> str:
        return f"put {self.dest}"

    def temp_path(self, token: str) -> PurePosixPath:
        """Where the data is written before the rename onto dest: beside it, so the rename stays on one filesystem."""
        return self.dest.parent / f".{self.dest.name}.tmp-{token}"

    def __repr__(self) -> str:
        data = MASK if self.secret else f"<{len(self.data)} bytes>"
        return (f"Put(dest={str(self.dest)!r}, data={data}, mode=0o{self.mode:o}, sudo={self.sudo}, "
                f"secret={self.secret})")


@dataclass(frozen=True, repr=False)
class StepResult:
    step: Step | Put
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    def __repr__(self) -> str:
        out, err = (MASK, MASK) if self.step.secret else (repr(self.stdout), repr(self.stderr))
        return (f"StepResult(step={self.step!r}, exit_code={self.exit_code}, stdout={out}, stderr={err}, "
                f"duration_s={self.duration_s:.3f})")


OutputLine = Callable[[str], None]


class Remote(Protocol):
    # stops at first code not in ok; on_output gets each stdout line of the steps as it arrives
    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]: ...

    # rsync a local directory's contents into dest on the host (only changed files travel); raises StepFailed
    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult: ...
    def close(self) -> None: ...


def repeatable(step: Step | Put) -> bool:
    """May this step be sent again after a dropped connection, not knowing whether it ran? A step marked so (reads:
    every step of `readings.read`, the readiness probe, the host-state read after an interrupt) and every Put: it
    writes a temp file of the same content, then renames it onto dest, so a second attempt leaves the same bytes
    wherever the first stopped. Never a restart, a stop, the switch of `current`, the lock's take or release,
    a history append or a prune: each changes the host in a way a second attempt would repeat or undo."""
    return isinstance(step, Put) or step.repeatable


def display(step: Step | Put) -> str:
    """How a step is shown to a person: in dry runs, progress and error messages; secrets masked."""
    if isinstance(step, Put):
        size = MASK if step.secret else f"{len(step.data)} bytes, sha256 {_short_sha(step.data)}"
        return f"put {shlex.quote(str(step.dest))} (mode 0{step.mode:o}{', sudo' if step.sudo else ''}, {size})"
    if step.secret:
        return f"{'sudo ' if step.sudo else ''}{MASK}"
    text = ("sudo " if step.sudo else "") + shlex.join(step.argv)
    if step.stdin is not None:
        text += f" < stdin ({len(step.stdin)} bytes)"
    return text


def describe(batch: Sequence[Step | Put]) -> list[str]:
    """The dry-run lines of a batch: one per step, in order."""
    return [display(step) if isinstance(step, Put) else f"{step.name}: {display(step)}" for step in batch]


def _short_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines()[-lines:])


def failure_message(result: StepResult, where: str, what: str) -> str:
    """`<step> <what> on <where>` plus the tail of its stderr and stdout (hidden for secret steps)."""
    step = result.step
    message = f"step {step.name!r} {what} on {where}: {display(step)}"
    # A secret command may echo its secret; a Put's output is only the OS error about its path, never the data.
    if step.secret and isinstance(step, Step):
        return message + "\n  (output of a secret step is not shown)"
    for label, text in (("stderr", result.stderr), ("stdout", result.stdout)):
        if text.strip():
            message += f"\n  {label} (last lines):\n{_tail(text)}"
    return message


def check_result(result: StepResult, where: str, user: str | None = None) -> None:
    """Raise StepTimedOut or StepFailed unless the result's exit code is one its step accepts.

    A sudo step that met a password prompt fails whatever its accepted codes: a read that accepts exit 1 as
    "file absent" would otherwise turn a missing sudoers rule into wrong facts (drift, no release)."""
    step = result.step
    if step.sudo and SUDO_PASSWORD_PROMPT in result.stderr:
        who = user or where.split("@", 1)[0]
        raise SudoPasswordRequired(
            f"sudo on {where} asks {who} for a password (step {step.name!r}); every root step runs as "
            "`sudo -n`, which cannot answer a prompt", step=step, result=result,
            hint=f"give the inventory's ansible_user passwordless sudo (as root on the host: "
                 f"`echo '{who} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{who} && "
                 f"chmod 0440 /etc/sudoers.d/{who} && visudo -c`), or give its sudo password: "
                 "the inventory's `become_password: ask` (typed at the terminal) or `become_password: {env: VAR}`")
    accepted = step.ok if isinstance(step, Step) else frozenset({0})
    if result.exit_code in accepted:
        return
    if result.exit_code == TIMED_OUT_EXIT and isinstance(step, Step):
        raise StepTimedOut(failure_message(result, where, f"timed out after {step.timeout_s:g} s"),
                           step=step, result=result, hint="raise the step's timeout or look at the host's load")
    disk_full = DISK_FULL in result.stderr
    raise StepFailed(failure_message(result, where, f"failed with exit code {result.exit_code}"),
                     step=step, result=result,
                     hint="the host's filesystem is full (ENOSPC): free space there (`df -h`) and rerun; the steps "
                          "after this one did not run" if disk_full else None)
