"""The help `sglang-deploy` prints: what the tool is, its tasks by family (collection.FAMILIES), the program's own
options, and a task's options each with the placeholder of its value (argparse's: the option's name in capitals)."""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
from collections.abc import Iterable, Iterator

from invoke import Collection
from invoke.parser import Argument, ParserContext

from deploy_cli.collection import FAMILIES

ABOUT = ("takes a typed profile of an SGLang server to a healthy, verified server on your own GPU hosts: each deploy "
         "is an immutable release, switched atomically, checked by a readiness ladder and rolled back when it does "
         "not come up.")
INDENT = "  "
PLACEHOLDERS = {"help": "TASK", "project": "DIR", "print-completion-script": "SHELL"}  # else the name in capitals


def width() -> int:
    return shutil.get_terminal_size().columns


def columns(rows: Iterable[tuple[str, str]], left: int = 0) -> list[str]:
    """Two columns, the second wrapped to the terminal; a first column too wide for it puts the text below."""
    rows = list(rows)
    left = left or min(max((len(name) for name, _ in rows), default=0), 32)
    text_width = max(width() - left - len(INDENT) - 3, 30)
    lines = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, text_width) or [""]
        if len(name) > left:
            lines.append(INDENT + name)
            lines += [INDENT + " " * (left + 3) + chunk for chunk in wrapped]
            continue
        lines.append(f"{INDENT}{name.ljust(left)}   {wrapped[0]}".rstrip())
        lines += [INDENT + " " * (left + 3) + chunk for chunk in wrapped[1:]]
    return lines


def first_line(task: object) -> str:
    doc = inspect.getdoc(task) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def listed(collection: Collection) -> Iterator[tuple[str, object]]:
    """Each task under the name a user types (a collection's default task by the collection's name)."""
    for name, aliases in collection.task_names.items():
        yield (aliases[0] if aliases else name), collection[name]


def shown_name(collection: Collection, name: str) -> str:
    """`tune` for tune.tune: the name as listed."""
    return next((shown for shown, task in listed(collection) if task is collection[name]), name)


def task_list(collection: Collection) -> list[str]:
    """The tasks grouped by family, in FAMILIES' order; tasks of no family (the checkout's own) come last."""
    by_family: dict[str, list[tuple[str, str]]] = {}
    for name, task in listed(collection):
        family = FAMILIES.get(getattr(task, "body", task).__module__, "Other tasks")
        by_family.setdefault(family, []).append((name, first_line(task)))
    left = max(len(name) for rows in by_family.values() for name, _ in rows)
    lines = []
    for family in [*FAMILIES.values(), "Other tasks"]:
        if family in by_family:
            lines += [f"{family}:", *columns(by_family[family], left), ""]
    return lines


def option_spec(argument: Argument, inverse: bool = False) -> str:
    """`-n LINES, --lines=LINES`: every option that takes a value shows it; a repeatable one ends with `...`."""
    named = max(argument.names, key=len)  # the long name: `max-fail`, not the attribute's max_fail
    placeholder = PLACEHOLDERS.get(named) or named.upper().replace("-", "_")
    shown = []
    for name in sorted(argument.names, key=len):
        flag = f"-{name}" if len(name) == 1 else f"--{'[no-]' if inverse else ''}{name}"
        if argument.takes_value:
            value = f"[{placeholder}]" if argument.optional else placeholder
            flag += f" {value}" if len(name) == 1 else ("[=" + placeholder + "]" if argument.optional
                                                        else "=" + value)
        shown.append(flag)
    return ", ".join(shown) + (" ..." if argument.kind is list else "")


def option_rows(context: ParserContext, hidden: Iterable[str] = ()) -> list[tuple[str, str]]:
    inverted = set(context.inverse_flags.values())
    arguments = sorted((a for a in context.args.values() if a.name not in set(hidden)), key=lambda a: a.name)
    return [(option_spec(a, f"--{a.names[0]}" in inverted), a.help or "") for a in arguments]


def task_help(binary: str, name: str, task: object, context: ParserContext) -> list[str]:
    operand = getattr(task, "operand", None)
    usage = f"Usage: {binary} {name} [--options]" + (f" [{operand.upper()}]" if operand else "")
    lines = [usage, "", *textwrap.wrap(first_line(task), width() - 1)]
    rest = (inspect.getdoc(task) or "").split("\n\n", 1)[1:]
    for paragraph in rest:
        lines += ["", *textwrap.wrap(" ".join(paragraph.split()), width() - 1)]
    if operand:
        lines += ["", f"A word after the task is its --{operand}: `{binary} {name} NAME` is "
                      f"`{binary} {name} --{operand} NAME`."]
    lines += ["", "Options:", *(columns(option_rows(context)) or [INDENT + "none"])]
    return lines


def overview(binary: str, version: str, collection: Collection, core: ParserContext,
             hidden: Iterable[str]) -> list[str]:
    return [*textwrap.wrap(f"{binary} {version} {ABOUT}", width() - 1), "",
            f"Usage: {binary} [--project DIR] TASK [--options]", f"       {binary} TASK --help", "",
            *task_list(collection), "Options:", *columns(option_rows(core, hidden)), "",
            f"One task per command; `{binary} TASK --help` lists its options.", "", "Exit codes:",
            *columns(exit_code_rows())]


def exit_code_rows() -> list[tuple[str, str]]:
    """Each exit code with what it means, from the error classes (deploy_lib.errors): the first clause of each
    class's docstring, its parenthesis left out."""
    from deploy_lib.errors import EXIT_CODES, DeployError
    rows = [(INDENT + "0", "done"), (INDENT + "1", "failed, or the question was answered no")]
    for error, code in EXIT_CODES.items():
        if error is not DeployError:
            first = re.split(r"[;:]|\. ", (error.__doc__ or "").split("\n\n")[0].replace("\n", " "), maxsplit=1)[0]
            meaning = re.sub(r" \([^)]*\)", "", first).rstrip(".")
            spoken = meaning if meaning[:2].isupper() else meaning[0].lower() + meaning[1:]  # SIGINT stays SIGINT
            rows.append((INDENT + str(code), f"{spoken} ({error.__name__})"))
    return rows


__all__ = ["exit_code_rows", "option_spec", "overview", "shown_name", "task_help", "task_list"]
