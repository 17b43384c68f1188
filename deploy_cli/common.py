"""What every task shares: the project (found from the working directory), the hosts named by --host/--group, how
the library reaches them (connections, progress, consent: ops.Reach), one library call with its error as exit code,
and a command's end printed for one host or a group."""

from __future__ import annotations

import getpass
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from invoke import Exit

from deploy_cli import present as ui
from deploy_cli.envelope import Envelope, ErrorDoc, HostDoc, RolloutDoc
from deploy_cli.options import given_limit
from deploy_lib.deploy.project import (
    Project,
    Target,
    load_for_host,
    profile_for_host,
    resolve_target,
    with_sudo_password,
)
from deploy_lib.errors import EXIT_CODES, ConfigError, DeployError
from deploy_lib.profile import LoadedProfile, ServiceSpec

if TYPE_CHECKING:
    from deploy_lib.commands.deploy import Outcome
    from deploy_lib.ops.fleet import FleetRun, HostRun, Rollout
    from deploy_lib.ops.scope import Reach, Scope
    from deploy_lib.remote import FabricRemote
    from deploy_lib.remote.ssh import SSHTarget, SudoPassword

T = TypeVar("T")
BAD_OPTION = EXIT_CODES[ConfigError]
IN_USE_HELP = ("profile: a name or a path (default: the host's `profile` var in the inventory, else the profile of "
               "the host's current release)")


@dataclass(frozen=True)
class Output:
    """How the running task reports: `--json` puts one JSON document on stdout (deploy_cli/envelope.py: the same
    shape for every task) and everything else (progress, warnings, errors) on stderr; `-v` shows every remote step
    as it comes back."""

    as_json: bool = False
    verbose: bool = False
    failure: Callable[[DeployError], dict[str, Any]] = ui.failure_json  # a failed host's `result`, as the
    # command's own document is shaped (a deploy's outcome by default, status: a status report)
    detailed_exitcode: bool = False  # plan's: 0 unchanged, 2 changes, 1 any error

    def exit_code(self, code: int, changed: bool = False) -> int:
        """The exit code the process ends with, as the document says it."""
        if not self.detailed_exitcode:
            return code
        return 1 if code else 2 if changed else 0


@dataclass
class _Shown:
    """What the running task chose and printed: the hosts its one document names, and whether it was printed."""

    hosts: tuple[str, ...] | None = None
    printed: bool = False


_output = Output()  # one task per command line; each task that takes --json or -v sets it first
_shown = _Shown()


def report_as(as_json: bool = False, verbose: bool = False,
              failure: Callable[[DeployError], dict[str, Any]] = ui.failure_json, detailed_exitcode: bool = False
              ) -> None:
    global _output, _shown
    _output = Output(as_json, verbose, failure, detailed_exitcode)
    _shown = _Shown()


def output() -> Output:
    return _output


def _chose(*hosts: str) -> None:
    _shown.hosts = hosts


def command_name() -> str:
    """The running task as typed (`patches.check`, `tune`): the envelope's `command`."""
    from deploy_cli.collection import user_tasks
    from deploy_cli.options import running_task
    running = running_task()
    if running is None:
        return ""
    tasks = user_tasks()
    for name, aliases in tasks.task_names.items():
        if tasks[name] == running:  # invoke runs a copy of the task (Collection.from_module)
            return min((name, *aliases), key=len)
    return str(running.name)


def _error_doc(error: DeployError) -> ErrorDoc:
    return ErrorDoc(type=type(error).__name__, message=error.message, hint=error.hint, exit_code=error.exit_code)


def _host_outcome(result: Any) -> str:
    """A deploy's, rollback's or lifecycle command's action; `ok` for a report."""
    action = getattr(result, "action", None)
    return str(action) if action is not None else "ok"


def _emit(hosts: list[HostDoc], code: int, error: ErrorDoc | None = None, rollout: RolloutDoc | None = None,
          changed: bool = False, command: str | None = None) -> None:
    """The one --json document (deploy_cli/envelope.py) on stdout."""
    document = Envelope(command=command_name() if command is None else command, outcome="failed" if code or error
                        else "ok",
                        exit_code=_output.exit_code(code, changed), hosts=hosts, error=error, rollout=rollout)
    ui.print_json(document.model_dump(mode="json"))
    _shown.printed = True


def _emit_failure(error: ErrorDoc, result: Any = None) -> None:
    """A command that failed as a whole: its one host's result when it had chosen one host, and the error."""
    hosts = [HostDoc(host=_shown.hosts[0], outcome="failed", exit_code=error.exit_code, result=ui.jsonable(result),
                     error=error)] if _shown.hosts is not None and len(_shown.hosts) == 1 else []
    _emit(hosts, error.exit_code, error)


def refused(ended: Exit) -> None:
    """With --json, a task that stopped with an exit code and printed no document (a refused combination of
    options, a cancelled question): its document, with the message as the error."""
    code = ended.code if isinstance(ended.code, int) else 1
    if not _output.as_json or _shown.printed or not code:
        return
    message = str(ended.message or "").removeprefix("error: ")
    _emit_failure(ErrorDoc(type="UsageError" if code == BAD_OPTION else "Stopped", message=message, exit_code=code))


def refused_line(command: str, ended: Exit) -> None:
    """A command line with --json refused before its task ran (an option without its value, an unknown flag): the
    document, with the refusal as the error (deploy_cli/program.py)."""
    code = ended.code if isinstance(ended.code, int) else 1
    message = str(ended.message or "").removeprefix("error: ")
    report_as(as_json=True)
    _emit([], code, ErrorDoc(type="UsageError", message=message, exit_code=code), command=command)


def run(action: Callable[[], T]) -> T:
    """Run one library call; a DeployError becomes its message (and with --json its JSON) and its exit code."""
    try:
        return action()
    except DeployError as error:
        if _output.as_json:
            _emit_failure(_error_doc(error), _output.failure(error))
        ui.print_error(error)
        raise Exit(code=_output.exit_code(error.exit_code)) from None


@cache
def project() -> Project:
    """The user's project: found from the working directory (deploy_lib.deploy.project.Project.find)."""
    return run(lambda: Project.find(Path.cwd(), os.environ))


def inventory_given(given: str | None) -> str | None:
    return given or os.environ.get("SGLANG_DEPLOY_INVENTORY")


def service_name(service: str | None) -> str:
    """-s/--service as typed (refused when no systemd unit could have that name), else the default."""
    from deploy_lib.store import check_service_name
    return ServiceSpec().name if service is None else run(lambda: check_service_name(service, "-s/--service"))


def target(inventory: str | None, host: str | None, accept_new_host_key: bool = False) -> Target:
    """The inventory's host (within the task's --limit); vars that look like typos are warned about."""
    host = limited_host(inventory, host)
    found = run(lambda: resolve_target(project().inventory(inventory_given(inventory)), host, accept_new_host_key))
    ui.print_warnings(found.host.warnings)
    _chose(found.host.name)
    return found


def limited_host(inventory: str | None, host: str | None) -> str | None:
    """--host as the task's --limit allows it, or the one host the limit names (ops.scope.host_within): a task's
    one-host path (tune without --group, logs --follow, plan --against) is narrowed as its group path is."""
    from deploy_lib.ops.scope import host_within
    limit = given_limit()
    if limit is None:
        return host
    return run(lambda: host_within(project().inventory(inventory_given(inventory)), host, limit))


def load(profile: str | None, inventory: str | None, host: str | None, accept_new_host_key: bool = False,
         overrides: Sequence[str] = ()) -> tuple[LoadedProfile, Target]:
    """Profile (with `--set` overrides) and host (within the task's --limit), checked against each other; vars that
    look like typos are warned about."""
    host = limited_host(inventory, host)
    loaded, found = run(lambda: load_for_host(project(), profile, inventory_given(inventory), host,
                                              accept_new_host_key, overrides))
    ui.print_warnings(found.host.warnings)
    _chose(found.host.name)
    return loaded, found


def profile_in_use(profile: str | None, found: Target, remote: FabricRemote, service: str | None) -> LoadedProfile:
    """The profile given or named by the inventory, else the one the host's current release was deployed from."""
    from deploy_lib.commands import releases as host_releases
    return run(lambda: profile_for_host(project(), profile, found)
               or host_releases.current_profile(found, service_name(service), remote))


def release_ids(flag: str, given: Sequence[str]) -> None:
    """Release ids typed after `flag`, refused before any host is reached when no release could have them."""
    from deploy_lib.store import check_release_id
    for release_id in given:
        run(partial(check_release_id, release_id, flag))


def rollout(serial: list[str] | None, max_fail: str | None) -> Rollout | None:
    """--serial and --max-fail; None without them (every host at once): a one-host command never loads the fleet."""
    if not serial and max_fail is None:
        return None
    from deploy_lib.ops.fleet import Rollout
    return run(lambda: Rollout.parse(serial or (), max_fail))


def scope(inventory: str | None, host: str | None, group: str | None = None, accept_new_host_key: bool = False,
          rolled: Rollout | None = None) -> Scope:
    """The hosts --host or --group name, narrowed by the task's --limit (ops.scope.select); their vars that look like
    typos are warned about."""
    from deploy_lib.ops.scope import select
    limit = given_limit()
    chosen = run(lambda: select(project().inventory(inventory_given(inventory)), host, group, accept_new_host_key,
                                rolled, limit))
    ui.print_warnings(tuple(dict.fromkeys(warning for each in chosen.targets for warning in each.host.warnings)))
    _chose(*(each.host.name for each in chosen.targets))
    return chosen


def one_host_scope(found: Target, inventory: str | None) -> Scope:
    """A host already resolved (its warnings shown) as the scope of a command on it alone."""
    from deploy_lib.ops.scope import Scope
    _chose(found.host.name)
    return Scope(project().inventory(inventory_given(inventory)), (found,))


def consent_possible(yes: bool) -> None:
    """For a task that can ask only once connected: refuse at once when there is no terminal to answer on."""
    if not yes:
        run(ui.require_terminal)


_typed_sudo_password: list[SudoPassword] = []  # typed once per command; a group's hosts open in threads
_typing = threading.Lock()


def typed_sudo_password() -> SudoPassword:
    """The sudo password of the hosts whose inventory says `become_password: ask`, typed once at the terminal."""
    from deploy_lib.remote.ssh import SudoPassword
    with _typing:
        if not _typed_sudo_password:
            if not sys.stdin.isatty():
                raise ConfigError("become_password: ask: stdin is not a terminal to type the sudo password at, so "
                                  "nothing was changed", hint="give it from a secret source: `become_password: "
                                  "{env: VAR}` (or {file: PATH}, {command: [ARGV...]})")
            typed = getpass.getpass("sudo password (become_password: ask): ")
            _typed_sudo_password.append(SudoPassword(typed, "the terminal (become_password: ask)"))
        return _typed_sudo_password[0]


_typed_passphrases: dict[tuple[Path, ...], str] = {}  # typed once per command for each set of keys


def with_key_passphrase(ssh: SSHTarget) -> SSHTarget:
    """At a terminal, the passphrase of the target's encrypted key files that no ssh agent key stands for, typed
    once; elsewhere the target as it is (its connect then says to `ssh-add` the key)."""
    from deploy_lib.remote.ssh import keys_needing_passphrase, unlocked_with
    locked = keys_needing_passphrase(ssh) if sys.stdin.isatty() else ()
    if not locked:
        return ssh
    with _typing:
        if locked not in _typed_passphrases:
            _typed_passphrases[locked] = getpass.getpass(f"passphrase for {', '.join(map(str, locked))}: ")
    return unlocked_with(ssh, locked, _typed_passphrases[locked])


def remote(found: Target, prefixed: bool = False) -> FabricRemote:
    from deploy_lib.remote import FabricRemote
    host = found.host.name if prefixed else ""
    def resolved() -> SSHTarget:
        return with_key_passphrase(with_sudo_password(found, os.environ, typed_sudo_password))
    # a group's host (prefixed) connects in a worker thread, where its error is its own (ops.fleet.host_run)
    ssh = resolved() if prefixed else run(resolved)
    return FabricRemote(ssh, on_result=ui.step_printer(host=host) if _output.verbose else None)


def progress(host: str = "") -> ui.TerminalProgress:
    return ui.TerminalProgress(ui.errors if _output.as_json else ui.console, host)


def reach(yes: bool = True) -> Reach:
    """How the library's operations reach the hosts from this terminal: a FabricRemote each, progress lines,
    consent by --yes or at the terminal, the one way every task that changes a host asks (a refusal is exit 1,
    nothing changed); the project's hooks/."""
    from deploy_lib.ops.scope import Reach

    def asked(question: str) -> None:
        if not yes and not ui.confirm(question):
            raise Exit("cancelled: nothing was changed", code=1)
    return Reach(remote, progress, asked, dict(os.environ), project_root=project().root)


def show(report: T, print_table: Callable[[T], None], exit_code: int = 0, changed: bool = False,
         outcome: str | None = None) -> None:
    """One report: the terminal's table, or with --json the document with it as its one host's result (the host the
    task chose, null for a command that reads none; a group's one report, `tune --group`'s, names no host)."""
    if not _output.as_json:
        print_table(report)
        return
    host = _shown.hosts[0] if _shown.hosts is not None and len(_shown.hosts) == 1 else None
    _emit([HostDoc(host=host, outcome=outcome or ("failed" if exit_code else _host_outcome(report)),
                   exit_code=exit_code, result=ui.jsonable(report))], exit_code, changed=changed)


def _host_doc(each: HostRun[Any], report: Callable[[Any], Any]) -> HostDoc:
    """A group's host in the document: its result, its failure (the command's failure document and the error), or
    not started."""
    if not each.started:
        return HostDoc(host=each.host, outcome="not started", exit_code=0)
    if each.error is not None:
        return HostDoc(host=each.host, outcome="failed", exit_code=each.error.exit_code,
                       result=ui.jsonable(_output.failure(each.error)), error=_error_doc(each.error))
    return HostDoc(host=each.host, outcome=_host_outcome(each.result), exit_code=0,
                   result=ui.jsonable(report(each.result)))


def show_each(fleet: FleetRun[T], print_report: Callable[[T], None], one_host: bool) -> None:
    """A read-only task's reports: one host's as it is, a group's host by host; exit with the worst host's code."""
    if _output.as_json:
        _emit([_host_doc(each, lambda result: result) for each in fleet.runs], fleet.exit_code)
    elif one_host:
        report = fleet.runs[0].result
        assert report is not None  # a one-host command's error was raised; no task's report is None
        print_report(report)
    else:
        ui.print_each_host(fleet, print_report)
    if fleet.exit_code:
        raise Exit(code=fleet.exit_code)


def show_outcomes(fleet: FleetRun[Outcome], one_host: bool, changed: bool = False) -> None:
    """A deploy's or rollback's end. One host: its outcome. A group: plans (dry run), the per-host table; exit 0
    only when every host is on its new release, else the worst host's code. `changed`: a plan would change
    something (for --detailed-exitcode)."""
    if one_host:
        outcome = fleet.runs[0].result
        assert outcome is not None  # a one-host command's error was raised
        if _output.as_json:
            _emit([_host_doc(fleet.runs[0], ui.outcome_json)], 0, changed=changed)
        else:
            ui.print_outcome(outcome)
        return
    from deploy_lib.ops.fleet import outcome_end, summarize
    from deploy_lib.outcomes import Action
    summary = summarize(fleet, outcome_end)
    ui.print_host_errors(fleet)
    if _output.as_json:
        rollout = RolloutDoc(batches=[list(batch) for batch in fleet.batches], not_started=fleet.not_started,
                             stopped=summary.stopped, serving={key: list(hosts)
                                                              for key, hosts in summary.by_release.items()})
        _emit([_host_doc(each, ui.outcome_json) for each in fleet.runs], summary.exit_code, rollout=rollout,
              changed=changed)
    else:
        for each in fleet.runs:
            if each.result is not None and each.result.plan is not None and each.result.action is Action.planned:
                ui.console.rule(each.host)
                ui.print_plan(each.result.plan)
        ui.print_fleet(summary)
        ui.print_clients([each.result.clients for each in fleet.runs if each.result is not None])
    if summary.exit_code:
        raise Exit(code=summary.exit_code)
