"""The terminal side of every task: progress shown with rich, consent asked at a terminal, a command's end (one
host's or a group's) printed or written as JSON. The reports' tables are deploy_cli/reports.py."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from enum import Enum
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from deploy_lib.errors import DeployError
from deploy_lib.outcomes import Action
from deploy_lib.program_name import spoken

if TYPE_CHECKING:  # the reports' types only: a task imports the library modules it runs (tasks.py)
    from rich.table import Table
    from tenacity import RetryCallState

    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.deploy.plan import Plan
    from deploy_lib.metrics.router_counters import ClientsSaw
    from deploy_lib.ops.fleet import FleetRun, Summary
    from deploy_lib.ops.router_deploy import RouterOutcome
    from deploy_lib.release.model import Release
    from deploy_lib.remote import StepResult


class SpokenConsole(Console):
    """A rich Console whose text names commands as the program the user ran spells them (`sglang-deploy status`
    from the installed command, `invoke status` in the checkout): every line a task prints goes through here."""

    def print(self, *objects: Any, **options: Any) -> None:
        super().print(*(spoken(each) if isinstance(each, str) else each for each in objects), **options)


# Width: the terminal's, else $COLUMNS (rich reads it), else 120 when output goes to a pipe or file. No emoji codes:
# escape() leaves them, and a message's `[begin:end:step]` was printed as `[begin🔚step]`.
console = SpokenConsole(highlight=False, soft_wrap=True, emoji=False,
                        width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
errors = SpokenConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False)


class TerminalProgress:
    """Progress as lines: each phase, each step with its time, the server's newest log line while waiting."""

    def __init__(self, out: Console = console, host: str = "") -> None:
        self.out = out
        self.started = time.monotonic()
        self.last_log: str | None = None
        self.prefix = f"[bold]{escape(host)}[/bold] " if host else ""  # a group's hosts print between each other

    def _stamp(self) -> str:
        return f"{self.prefix}[dim]{time.monotonic() - self.started:7.2f}s[/dim]"

    def phase_started(self, name: str) -> None:
        self.out.print(f"{self._stamp()} [bold]▸ {escape(name)}[/bold]")

    def step_done(self, name: str, seconds: float) -> None:
        self.out.print(f"{self._stamp()} [green]✓[/green] {escape(name)} ({seconds:.2f} s)")

    def retrying(self, retry_state: RetryCallState) -> None:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if retry_state.attempt_number % 10 == 1 and error is not None:
            self.out.print(f"{self._stamp()}   waiting: {escape(str(getattr(error, 'message', error)))} "
                           f"({retry_state.seconds_since_start:.1f} s)")

    def log_line(self, text: str) -> None:
        from deploy_lib.facts.diagnose import shorten_log_line  # a log line comes from the host: the remote is loaded
        self.last_log = text
        self.out.print(f"{self._stamp()}   [cyan]server:[/cyan] {escape(shorten_log_line(text))}")

    def note(self, text: str) -> None:
        self.out.print(f"{self._stamp()} [yellow]![/yellow] {escape(text)}")

    def transfer(self, text: str) -> None:
        self.out.print(f"{self._stamp()}   [cyan]transfer:[/cyan] {escape(text)}")


def _table(*headers: str) -> Table:
    from rich.table import Table  # only the reports that are tables load it: a deploy's output has none
    return Table(*headers)


def print_error(error: DeployError) -> None:
    from deploy_lib.facts.diagnose import shorten_log_line  # with the failure table, SSH: `import tasks` loads neither
    errors.print(f"[bold red]error:[/bold red] {escape(error.message)}", markup=True)
    evidence: Iterable[str] = getattr(error, "evidence", ()) or ()
    for line in evidence:
        errors.print(f"  | {shorten_log_line(line)}", markup=False)
    if error.hint:
        errors.print(f"[yellow]hint:[/yellow] {escape(error.hint)}")


def print_warnings(warnings: Iterable[str]) -> None:
    for warning in warnings:
        errors.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def print_release(release: Release) -> None:
    console.rule(f"unit (release {release.id}, profile {release.profile_name})")
    console.print(release.unit_text, markup=False, end="")
    console.rule("environment file (secrets redacted)")
    console.print(release.env_text_redacted, markup=False, end="")
    if release.launcher_text is not None:
        console.rule("launcher (the unit's ExecStart=)")
        console.print(release.launcher_text, markup=False, end="")


def release_json(release: Release) -> dict[str, Any]:
    """`render --json`: the release's metadata and the files as they would be written (secrets redacted)."""
    return {**release.metadata(), "unit_file": release.unit_text, "env_file": release.env_text_redacted,
            "launcher_file": release.launcher_text}


def print_lines(lines: Iterable[str]) -> None:
    for line in lines:
        console.print(line, markup=False)


def print_outcome(outcome: Outcome) -> None:
    if outcome.action is Action.planned and outcome.plan is not None:
        print_plan(outcome.plan)
        return
    if outcome.action is Action.unchanged:
        console.print(f"no changes: release {outcome.release_id} is current and running")
        return
    if outcome.action in (Action.stopped, Action.already_running):
        console.print(f"{outcome.action}: release {outcome.release_id}")
        return
    ready = f" ready in {outcome.ready.duration_s:.1f} s" if outcome.ready else ""
    console.print(f"[bold green]{outcome.action}[/bold green]: release {outcome.release_id} is serving "
                  f"(was {outcome.previous_id or 'none'});{ready}")
    console.print(outcome.downtime.line() if outcome.downtime else "downtime: none (no server was running before)",
                  markup=False)


def print_clients(seen: Sequence[ClientsSaw | None]) -> None:
    """A rollout behind a router: what its clients saw while the replicas were out and back, summed (None: a replica
    not behind one, or whose router's counters could not be read, each said in a note)."""
    known = [clients for clients in seen if clients is not None]
    if not known:
        return
    failed = sum(clients.failed for clients in known)
    console.print(f"router: clients sent {sum(clients.requests for clients in known)} requests through it while "
                  f"{len(known)} {'replicas were' if len(known) != 1 else 'replica was'} out and back; "
                  f"{'none failed' if not failed else f'{failed} failed (5xx)'}", markup=False,
                  style="red" if failed else None)


def print_router_outcome(outcome: RouterOutcome) -> None:
    if outcome.action is Action.unchanged:
        console.print(f"no changes: router release {outcome.release_id} is current and answering")
    else:
        console.print(f"[bold green]{outcome.action}[/bold green]: router release {outcome.release_id} is serving "
                      f"(was {outcome.previous_id or 'none'})")
    console.print(f"workers: {', '.join(outcome.workers)}", markup=False)
    if outcome.not_serving:
        console.print(f"not serving yet, listed once they answer: {', '.join(outcome.not_serving)}", markup=False)


def print_router_workers(workers: list[dict[str, Any]]) -> None:
    for worker in workers:
        console.print(f"{worker['url']}  {'healthy' if worker['healthy'] else 'not healthy'}", markup=False)
    if not workers:
        console.print("no workers")


def print_plan(plan: Plan) -> None:
    print_lines(plan.dry_run_lines())


def print_host_errors(fleet: FleetRun[Any]) -> None:
    """Each failed host's error in full (stderr, as for one host), under the host's name."""
    for run in fleet.runs:
        if run.error is not None:
            errors.rule(run.host)
            print_error(run.error)


ON_THEIR_RELEASE = (Action.deployed, Action.unchanged, Action.rolled_back, Action.planned)  # a table's green rows


def print_fleet(summary: Summary) -> None:
    """A group's end: the per-host table, which hosts run which release, why the rollout stopped."""
    from deploy_lib.facts.diagnose import shorten_log_line
    table = _table("host", "release", "outcome", "serving now", "ready (s)", "cause")
    for row in summary.rows:
        style = "green" if row.outcome in ON_THEIR_RELEASE else "yellow" if row.outcome is Action.not_started else "red"
        table.add_row(row.host, row.release or "", f"[{style}]{escape(row.outcome)}[/{style}]", row.serving,
                      f"{row.ready_s:.1f}" if row.ready_s is not None else "", escape(shorten_log_line(row.cause)))
    console.print(table)
    for serving, hosts in summary.by_release.items():
        what = serving if serving in ("untouched", "as before") or " " in serving else f"release {serving}"
        console.print(f"{what}: {', '.join(hosts)}", markup=False)
    if summary.stopped:
        console.print(f"[yellow]rollout stopped:[/yellow] {escape(summary.stopped)}; hosts not started were left "
                      "untouched")
    if summary.interruption:
        console.print(f"[yellow]{escape(summary.interruption)}[/yellow]")


def print_each_host(fleet: FleetRun[Any], show: Callable[[Any], None]) -> None:
    """A read-only task on a group: each host's report under its name, in inventory order."""
    for run in fleet.runs:
        console.rule(run.host)
        if run.error is not None:
            print_error(run.error)
        else:
            show(run.result)


def require_terminal(question: str = "") -> None:
    """Consent needs someone at a terminal: without one on stdin, a change to a host is refused, never made unasked."""
    if not sys.stdin.isatty():
        asked = f" \"{question}\"" if question else ""
        raise DeployError(f"not asking{asked}: stdin is not a terminal, so nothing was changed",
                          hint="rerun with --yes to go ahead without asking")


def confirm(question: str) -> bool:
    """Ask at a terminal: `[y/N]`, anything but y/yes (Enter included) is no. Without a terminal on stdin nobody can
    answer, so a change to a host is refused rather than made unasked (DeployError, exit 1)."""
    require_terminal(question)
    try:
        answer = errors.input(f"{question} [y/N] ", markup=False)  # stdout may be --json
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def ask(question: str, default: str | None = None) -> str | None:
    """Ask at a terminal for a value (on stderr: stdout may be --json): Enter takes the default in brackets, an empty
    answer without one is asked again; None when the input ends (Ctrl-D)."""
    prompt = f"{question} [{default}]: " if default is not None else f"{question}: "
    while True:
        try:
            answer = errors.input(prompt, markup=False).strip()
        except EOFError:
            errors.print()
            return None
        if answer or default is not None:
            return answer or default


VERBOSE_MAX_LINES = 40  # per stream and step: a step's output can be a whole option table


def step_printer(out: Console = errors, host: str = "") -> Callable[[StepResult], None]:
    """For -v: each remote step as it comes back, with its exit code, time and output (secrets masked); in a group
    each line starts with the host's name."""
    from deploy_lib.remote import MASK, display
    prefix = f"{host} " if host else ""

    def show(result: StepResult) -> None:
        out.print(f"{escape(prefix)}  [dim]$[/dim] {escape(display(result.step))} [dim](exit {result.exit_code}, "
                  f"{result.duration_s:.2f} s)[/dim]")
        for stream in (result.stdout, result.stderr):
            lines = [MASK] if result.step.secret and stream else stream.splitlines()
            for line in lines[:VERBOSE_MAX_LINES]:
                out.print(f"{prefix}    | {line}", markup=False)
            if len(lines) > VERBOSE_MAX_LINES:
                out.print(f"{prefix}    | ... {len(lines) - VERBOSE_MAX_LINES} more lines", markup=False)
    return show


def jsonable(value: Any) -> Any:
    """Reports as JSON data: dataclass fields and properties, pydantic models, enums and paths as strings."""
    from pydantic import BaseModel

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)
                if field.repr}
        for name, member in vars(type(value)).items():
            if isinstance(member, property) and not name.startswith("_"):
                data[name] = jsonable(getattr(value, name))
        return data
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_json(data: Any) -> None:
    """One JSON document on stdout (progress and errors go to stderr)."""
    sys.stdout.write(spoken(json.dumps(jsonable(data), indent=2, sort_keys=True)) + "\n")


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """A deploy's or rollback's end for scripts, a host's `result` in the --json document: the same keys whether it
    succeeded or not (failure_json)."""
    plan = outcome.plan
    return {"outcome": outcome.action, "release": outcome.release_id, "previous": outcome.previous_id,
            "timings": dict(outcome.timings), "ready_s": outcome.ready.duration_s if outcome.ready else None,
            "downtime": jsonable(outcome.downtime), "clients": jsonable(outcome.clients), "cause": None,
            "hint": None, "exit_code": 0,
            "changes": [str(change) for change in plan.changes] if plan else [],
            "secrets_not_available": dict(plan.secrets_not_available) if plan else {},
            "overrides": list(plan.release.overrides) if plan else []}


def status_failure_json(error: DeployError, host: str | None, service: str) -> dict[str, Any]:
    """`status --json` when the host could not be read: a status report's keys, unknown, and why."""
    from deploy_lib.commands.status import StatusReport
    unknown: dict[str, Any] = {field.name: None for field in dataclasses.fields(StatusReport) if field.repr}
    return {**unknown, "host": host, "service": service, "unit_state": "unknown", "readiness": "unknown",
            "error": type(error).__name__, "cause": error.message, "hint": error.hint, "exit_code": error.exit_code}


def failure_json(error: DeployError) -> dict[str, Any]:
    from deploy_lib.health.downtime import Downtime  # a failed switch's, through its restore
    return {"outcome": Action.failed, "release": error.release_id, "previous": error.previous_id,
            "timings": dict(error.timings), "ready_s": None,
            "downtime": jsonable(Downtime.from_timings(error.timings)), "clients": None, "cause": error.message,
            "hint": error.hint,
            "exit_code": error.exit_code, "error": type(error).__name__, "serving": error.serving_id,
            "evidence": list(getattr(error, "evidence", ()) or ())}
