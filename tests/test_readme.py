"""The README's profile reference, exit codes and task table stay in step with the code."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from invoke.parser import Parser
from pydantic import BaseModel

import tasks  # the checkout's namespace: the user tasks and the sandbox's
from deploy_cli.program import DeployProgram, with_operand
from deploy_lib.errors import EXIT_CODES
from deploy_lib.profile import Profile, SecretRef

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TASK_NAMES = {alias for name, aliases in tasks.ns.task_names.items() for alias in (name, *aliases)}


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        path = prefix + name
        nested = [arg for arg in (info.annotation, *typing.get_args(info.annotation))
                  if isinstance(arg, type) and issubclass(arg, BaseModel) and arg is not SecretRef]
        if nested:  # a section: its keys are listed, and a section that may be absent is listed itself too
            paths += field_paths(nested[0], path + ".")
            if info.default is None:
                paths.append(path)
        else:
            paths.append(path)
    return paths


def test_profile_reference_lists_every_key() -> None:
    section = README.split("### Profile reference", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", section, re.MULTILINE))
    expected = {path for path in field_paths(Profile)} | {"extends"}
    assert sorted(expected - listed) == [], "keys missing from the README's profile reference"
    assert sorted(listed - expected) == [], "README lists keys the profile model does not have"


def test_exit_code_table_matches_the_error_classes() -> None:
    section = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.MULTILINE))
    assert {name: int(code) for code, name in rows.items()} == {cls.__name__: code for cls, code in EXIT_CODES.items()}


def test_every_reliability_promise_names_tests_that_exist() -> None:
    section = README.split("## Reliability", 1)[1].split("\n## ", 1)[0]
    promises = [item for item in section.split("\n- ")[1:]]
    assert promises, "the Reliability section lists no promise"
    defined = {name for path in (ROOT / "tests").rglob("test_*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE)}
    for promise in promises:
        named = re.findall(r"`(test_\w+)`", promise)
        assert named, f"a promise names no test: {promise[:80]}"
        assert set(named) <= defined, f"not a test in tests/: {sorted(set(named) - defined)}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    pages = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert pages and pages <= set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))


def table_commands() -> list[tuple[str, list[str]]]:
    """Each command line the README's task table writes in its first column, as argv: a cell's backticked pieces
    in order (a piece without a task continues the one before), optional parts kept, of `A\\|B` the first or the
    option, `/` and `...` dropped."""
    section = README.split("## Tasks", 1)[1].split("\n## ", 1)[0]
    table = section.split("| task | what it does |", 1)[1].split("\n\n", 1)[0]
    commands = []
    for row in table.splitlines()[2:]:
        cell = re.split(r"(?<!\\) \| ", row.strip("| "), maxsplit=1)[0]
        argv: list[str] = []
        for piece in re.findall(r"`([^`]+)`", cell):
            words = []
            for word in piece.replace("[", " ").replace("]", " ").split():
                choices = [each for each in word.split("\\|") if each not in ("", "...")]
                options = [each for each in choices if each.startswith("-")]
                if choices and word not in ("/", "\\|"):
                    words.append(options[0] if options else choices[0])
            if argv and words and words[0] in TASK_NAMES:
                commands.append((cell, argv))
                argv = []
            argv += words
        commands.append((cell, argv))
    return commands


def test_every_task_and_option_the_task_table_names_exists_and_parses() -> None:
    """Each command of the table's first column goes through the parser `sglang-deploy` uses (a word after
    deploy/render/plan is the profile): one task, every option its own, a value after each option that takes one
    (a number's placeholder read as 1). Failed before: `patches.check NAME` (the set's name is `--name NAME`)."""
    program = DeployProgram(namespace=tasks.ns)
    parser = Parser(initial=program.initial_context, contexts=tasks.ns.to_contexts())
    operands = {name: tasks.ns[name].operand for name in tasks.ns.task_names if tasks.ns[name].operand}
    commands = table_commands()
    assert len(commands) > 30 and {argv[0] for _, argv in commands} >= {"deploy", "rollback", "patches.check"}
    for cell, argv in commands:
        assert argv[0] in TASK_NAMES, f"not a task: {argv[0]!r} in {cell}"
        context = parser.contexts[argv[0]]
        numbers = {i + 1 for i, word in enumerate(argv) if word in context.flags
                   and context.flags[word].takes_value and context.flags[word].kind not in (str, list)}
        given = [("1" if i in numbers else word) for i, word in enumerate(argv)]
        parsed = parser.parse_argv(with_operand(given, parser.contexts, program.initial_context, operands))
        assert [each.name for each in parsed[1:]] == [context.name], cell
