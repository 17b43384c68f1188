"""One set of command-line conventions for every task: `-h` is help, a short flag means the same option in every
task, every option has help text, options are given by name (never positionally, so `TASK --help` is help), a
required option that is missing and a value of the wrong type are sentences with exit 2. A task may name one
option as its operand (`operand="profile"`): `sglang-deploy deploy NAME` is `deploy --profile NAME` (deploy_cli.program
turns the bare word into the option before invoke parses the line)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from invoke import Argument, Context, Exit
from invoke import Task as InvokeTask
from invoke import task as invoke_task

from deploy_lib.errors import EXIT_CODES, ConfigError

BAD_OPTION_EXIT = EXIT_CODES[ConfigError]

# The only short flags; every other option is long only (--force and --accept-new-host-key on purpose: they change
# what the tool will do to a host, so they are spelled out).
SHORT_FLAGS = {
    "profile": "p",
    "inventory": "i",
    "host": "H",
    "service": "s",
    "yes": "y",
    "lines": "n",
    "follow": "f",
    "verbose": "v",
    "output": "o",
}

# Help shared by every task that takes the option; a task's own help= entries override these.
COMMON_HELP = {
    "profile": "profile: a name under inventory/profiles/ or a path to a .yaml file (default: the host's "
               "`profile` var in the inventory)",
    "host": "inventory host name (default: the only host)",
    "group": "inventory group: every host of it (children included) in parallel; exclusive with --host",
    "serial": "with --group: hosts per batch, a number or N%; repeat for Ansible's list (the last repeats)",
    "max_fail": "with --group: stop starting hosts once more than K hosts failed (K%: of a batch)",
    "inventory": "inventory file, relative to the working directory "
                 "(default: $SGLANG_DEPLOY_INVENTORY, else inventory/hosts.yaml of the project)",
    "service": "service name (default sglang)",
    "yes": "do not ask before changing the host",
    "force": "overwrite files edited by hand on the host",
    "accept_new_host_key": "trust and record the key of a host never seen before (a changed key is always refused)",
    "limit": "narrow --group (or, alone, every host) to an Ansible host pattern: names, globs, ~regex, group[i:j], "
             "`:&` (and), `:!` (not); e.g. --limit 'gpu:!gpu3'",
    "json": "print one JSON document on stdout, of the shape every task shares (the reference's JSON output); "
            "progress goes to stderr",
    "verbose": "show every remote step and its output as it runs",
}


def _whole_number(names: list[str]) -> Callable[[str], int]:
    """The converter of a number option; its refusal names each spelling (`-n/--lines`): the one typed is among
    them (invoke converts the value without saying which was typed)."""
    option = "/".join(f"-{name}" if len(name) == 1 else f"--{name}" for name in sorted(names, key=len))

    def convert(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = -1
        if number < 0:  # every number option counts something (lines, ...): a negative one means nothing
            raise Exit(f"error: {option} takes a whole number (0 or more), got {text!r}",
                       code=BAD_OPTION_EXIT) from None
        return number
    convert.__name__ = "int"  # what `--help` shows as the value's kind
    return convert


# --limit PATTERN, given to every task that takes both --host and --group (the commands that act on hosts of a
# group): its value is held here while the task runs, for deploy_cli.common.scope, which every such task calls.
LIMITED = ("host", "group")
_limit: ContextVar[str | None] = ContextVar("limit", default=None)


def given_limit() -> str | None:
    """The running task's --limit, None when not given."""
    return _limit.get()


# The task the command line named, while it runs (a task that calls another, `patch --check`, stays the one named):
# the `command` of its --json document.
_running: ContextVar[InvokeTask | None] = ContextVar("running", default=None)


def running_task() -> InvokeTask | None:
    return _running.get()


class Task(InvokeTask):
    """An invoke Task that follows the conventions above."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        kwargs.setdefault("positional", ())
        kwargs["auto_shortflags"] = False
        given_help = kwargs.pop("help", None) or {}
        names = [name for name in inspect.signature(body).parameters if name != "c"]
        self.operand: str | None = kwargs.pop("operand", None)  # the option a bare word after the task fills
        if self.operand is not None and self.operand not in names:
            raise TypeError(f"task {body.__name__}: operand {self.operand!r} is none of its options")
        kwargs["help"] = {name: given_help.get(name) or COMMON_HELP.get(name) for name in names}
        unknown = set(given_help) - set(names)
        undocumented = [name for name, text in kwargs["help"].items() if not text]
        if unknown or undocumented:
            raise TypeError(f"task {body.__name__}: help for no option {sorted(unknown)}, "
                            f"no help for {undocumented}")
        self.takes_limit = all(name in names for name in LIMITED) and "limit" not in names
        self.option_help = dict(kwargs["help"])  # invoke consumes `help` while building the parser
        self.required = [p.name for p in inspect.signature(body).parameters.values()
                         if p.name != "c" and p.default is inspect.Parameter.empty]
        super().__init__(body, **kwargs)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        self.help = dict(self.option_help)  # invoke pops each text as it builds a parser; every build needs them all
        arguments: list[Any] = super().get_arguments(ignore_unknown_help)
        if self.takes_limit:
            arguments.append(Argument(names=("limit",), kind=str, help=COMMON_HELP["limit"]))
        return arguments

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        if opts.get("kind") is int:
            opts["kind"] = _whole_number(opts["names"])
        return opts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        limit = kwargs.pop("limit", None) if self.takes_limit else None
        token = _limit.set(limit)
        outermost = _running.get() is None
        running = _running.set(_running.get() or self)
        if outermost:  # what an earlier task in this process chose and printed is not this one's
            from deploy_cli import common
            common.report_as(as_json=bool(kwargs.get("json")))
        try:
            return self._call(*args, **kwargs)
        except Exit as ended:
            if kwargs.get("json"):  # a refusal with --json is a document too (deploy_cli/envelope.py)
                from deploy_cli import common
                common.refused(ended)
            raise
        finally:
            _running.reset(running)
            _limit.reset(token)

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        given = inspect.signature(self.body).bind_partial(*args, **kwargs).arguments
        missing = [name for name in self.required if given.get(name) is None]
        if missing:
            flags = ", ".join("--" + name.replace("_", "-") for name in missing)
            raise Exit(f"error: {self.name} needs {flags} ({self.option_help[missing[0]]})",
                       code=BAD_OPTION_EXIT)
        return super().__call__(*args, **kwargs)


def task(*args: Any, **kwargs: Any) -> Any:
    """`@task` / `@task(help={...}, ...)` with the conventions of this module."""
    return invoke_task(*args, klass=Task, **kwargs)


__all__ = ["COMMON_HELP", "SHORT_FLAGS", "Context", "Task", "given_limit", "running_task", "task"]
