"""The project's hooks, as Kamal's `.kamal/hooks`: executables `hooks/<event>` run on this machine around a deploy,
with what it is about in the environment. A failing `pre-*` hook stops the command before any host changes; a
failing `post-*` hook is reported and changes nothing (the deploy has happened).

The command layer calls `run_hook` at each event; this module decides and runs, and never prints.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.outcomes import Action

HOOKS_DIR = "hooks"
HOOK_TIMEOUT_S = 600  # a hook that asks a person or a CI system may take minutes; one that hangs is ended
OUTPUT_LINES = 20  # of a failing hook's output, the last lines shown
ENV_PREFIX = "SGLANG_DEPLOY_"


class HookEvent(StrEnum):
    pre_deploy = "pre-deploy"
    post_deploy = "post-deploy"
    pre_rollback = "pre-rollback"
    post_rollback = "post-rollback"

    @property
    def stops_on_failure(self) -> bool:
        return self.value.startswith("pre-")


@dataclass(frozen=True)
class HookContext:
    """What a hook is told: the command, its hosts and releases, and (for a post- hook) how it ended."""

    command: str  # deploy, rollback, patch-fusion, ...
    hosts: tuple[str, ...]
    profile: str | None = None
    release_id: str | None = None  # the release being deployed (or rolled back to)
    previous_id: str | None = None  # the release serving before
    outcome: Action | None = None  # post- hooks: deployed, unchanged, rolled back, failed


@dataclass(frozen=True)
class HookResult:
    event: HookEvent
    path: Path
    exit_code: int
    output: str  # its stdout and stderr together, the last OUTPUT_LINES lines

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def hook_environment(event: HookEvent, context: HookContext, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` plus SGLANG_DEPLOY_EVENT, _COMMAND, _HOSTS (comma-separated), _PROFILE, _RELEASE, _PREVIOUS,
    _OUTCOME: each set only when known, so that a hook can test `[ -n "$SGLANG_DEPLOY_RELEASE" ]`."""
    values = {"EVENT": event.value, "COMMAND": context.command, "HOSTS": ",".join(context.hosts),
              "PROFILE": context.profile, "RELEASE": context.release_id, "PREVIOUS": context.previous_id,
              "OUTCOME": context.outcome.word if context.outcome else None}
    own = {f"{ENV_PREFIX}{key}": value for key, value in values.items() if value}
    # a value of the caller's own environment never stands in for one that is not known here
    inherited = {key: value for key, value in environ.items()
                 if key not in {f"{ENV_PREFIX}{name}" for name in values}}
    return inherited | own


def find_hook(project_root: Path, event: HookEvent) -> Path | None:
    """`hooks/<event>` of the project when it exists; ConfigError when it exists but would not run."""
    path = project_root / HOOKS_DIR / event.value
    if not path.exists():
        return None
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"{path}: the {event.value} hook is not an executable file",
                          f"chmod +x {path} (or remove it to run no {event.value} hook)")
    return path


def run_hook(project_root: Path, event: HookEvent, context: HookContext, environ: Mapping[str, str]
             ) -> HookResult | None:
    """Run the event's hook, if the project has one, in the project directory. PreflightError when a pre- hook
    fails (nothing has changed on any host); a post- hook's failure is in the result, for the caller to report."""
    path = find_hook(project_root, event)
    if path is None:
        return None
    try:
        done = subprocess.run([str(path)], cwd=project_root, env=hook_environment(event, context, environ),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=HOOK_TIMEOUT_S, check=False)
        code, raw = done.returncode, done.stdout
    except subprocess.TimeoutExpired as error:
        code, raw = 124, error.output or b""
    except OSError as error:  # no interpreter for its #! line, ...
        code, raw = 126, str(error).encode()
    output = "\n".join(raw.decode(errors="replace").splitlines()[-OUTPUT_LINES:])
    result = HookResult(event, path, code, output)
    if not result.ok and event.stops_on_failure:
        ended = f"ran past its {HOOK_TIMEOUT_S} s" if code == 124 else f"exited with status {code}"
        raise PreflightError(f"{event.value} hook {path} {ended}; {context.command} stopped before any host "
                             f"changed" + (f"\n  | {output.replace(chr(10), chr(10) + '  | ')}" if output else ""),
                             hint=f"fix what the hook reports, or run without it: move {path} away")
    return result
