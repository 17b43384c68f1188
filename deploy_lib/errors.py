"""One exception tree for the whole library; each class carries the exit code deploy_cli/common.py exits with."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


class DeployError(Exception):
    """Base of every error the tool reports to a user: a message and, where useful, a hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Set by deploy/rollback when the error ends one: which release failed, what was current before it,
        # and the phases' timings (for --json).
        self.release_id: str | None = None
        self.previous_id: str | None = None
        self.timings: dict[str, float] = {}
        self.serving_id: str | None = None  # set when a failed release was rolled back: the release serving now

    def about(self, release_id: str | None, previous_id: str | None, timings: dict[str, float]) -> DeployError:
        self.release_id, self.previous_id, self.timings = release_id, previous_id, dict(timings)
        return self

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


def did_you_mean(given: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """'; did you mean `x`?' when one known name is close to what was given, else ''."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=cutoff)
    return f"; did you mean `{close[0]}`?" if close else ""


class ConfigError(DeployError):
    """Profile, inventory, patch set or option is invalid; raised before any SSH."""

    exit_code = 2


class PreflightError(DeployError):
    """The host cannot run this release (GPUs, unknown flag, port busy, disk); nothing was changed."""

    exit_code = 3


class LockHeld(DeployError):
    """Another deploy holds the host's lock."""

    exit_code = 4


class RemoteError(DeployError):
    """An SSH connection or a remote command failed."""

    exit_code = 5


class ConnectFailed(RemoteError):
    """The host could not be reached or its host key was refused."""


class ConnectionLost(RemoteError):
    """The connection dropped during a command, and reconnecting (for steps safe to repeat) did not bring it back.

    `step` is the last step sent whose result never came (None: between round trips); `completed` names the steps
    of that round trip whose results did come. The command that was running adds what it knows of the host (the
    link `current`, whether the new release was verified) to the message before it reaches the user."""

    exit_code = 11

    def __init__(self, message: str, step: object = None, completed: tuple[str, ...] = (),
                 hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.step = step
        self.completed = completed


class StepFailed(RemoteError):
    """A remote step exited with a code it does not accept; keeps the result."""

    def __init__(self, message: str, step: object = None, result: object = None, hint: str | None = None):
        super().__init__(message, hint)
        self.step = step
        self.result = result


class StepTimedOut(StepFailed):
    """A remote step ran past its timeout."""


class SudoPasswordRequired(StepFailed):
    """`sudo -n` on the host wants a password: the inventory's user lacks a NOPASSWD sudoers rule."""


class SudoPasswordRefused(ConfigError):
    """sudo on the host refused the sudo password given (inventory `become_password`, or typed at the terminal):
    checked right after connecting, before any step ran, so nothing was changed."""


class ReadinessFailed(DeployError):
    """The new release did not become ready; it was rolled back to the last good one."""

    exit_code = 6

    def __init__(self, message: str, rung: str = "", evidence: tuple[str, ...] = (), hint: str | None = None):
        super().__init__(message, hint)
        self.rung = rung
        self.evidence = evidence


class GateFailed(ReadinessFailed):
    """The release started but benchmarked below the gate; it was rolled back."""

    exit_code = 7


class WatchFailed(GateFailed):
    """The new release served live traffic slower than the old one beyond the profile's `watch:` bounds; rolled back
    as a failed gate is (its exit code). `figures`: both windows', as the deploy's history line records them."""

    def __init__(self, message: str, rung: str = "", evidence: tuple[str, ...] = (), hint: str | None = None,
                 figures: Mapping[str, float] | None = None):
        super().__init__(message, rung, evidence, hint)
        self.figures = dict(figures or {})


class GpuCheckFailed(ReadinessFailed):
    """preflight.gpu_check's all-reduce failed after the old server was stopped: a failed start (SGLang never ran),
    rolled back like one; `evidence` holds the check's report for the diagnosis."""


class RollbackFailed(DeployError):
    """The rollback target failed too: the unit is left stopped and needs a person."""

    exit_code = 8

    def __init__(self, message: str, original: DeployError | None = None, hint: str | None = None):
        super().__init__(message, hint)
        self.original = original


class DriftDetected(DeployError):
    """Files on the host were changed by hand since the last deploy; --force overwrites them."""

    exit_code = 9


class RouterFailed(DeployError):
    """The router in front of a group could not take a replica out, add it back, or start: the message says what the
    replica's host runs (a rolling deploy stops there, so no second replica leaves the router)."""

    exit_code = 10


class Interrupted(DeployError):
    """SIGINT: a transition in progress was finished (the last healthy release restored) before exiting."""

    exit_code = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


class Terminated(Interrupted):
    """SIGTERM, handled as SIGINT."""

    exit_code = 143  # 128 + SIGTERM


EXIT_CODES: dict[type[DeployError], int] = {
    cls: cls.exit_code
    for cls in (DeployError, ConfigError, PreflightError, LockHeld, RemoteError, ReadinessFailed,
                GateFailed, RollbackFailed, DriftDetected, RouterFailed, ConnectionLost, Interrupted, Terminated)
}
