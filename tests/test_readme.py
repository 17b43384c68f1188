"""The README and the guide under docs/ stay in step with the code: the profile reference, the exit codes, the task
tables, the profiles they show, and the promises' tests."""

from __future__ import annotations

import re
import textwrap
import typing
from enum import Enum
from pathlib import Path

import pytest
import yaml
from invoke.parser import Parser
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

import tasks  # the checkout's namespace: the user tasks and the sandbox's
from deploy_cli.collection import user_tasks
from deploy_cli.program import DeployProgram, with_operand
from deploy_lib.errors import EXIT_CODES
from deploy_lib.profile import Profile, SecretRef

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
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


def profile_key_table() -> str:
    return (DOCS / "reference.md").read_text().split("## Profile keys", 1)[1].split("\n## ", 1)[0]


def test_profile_reference_lists_every_key() -> None:
    """The generated table walks the JSON Schema; the model's own fields are walked here, independently."""
    listed = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", profile_key_table(), re.MULTILINE))
    expected = {path for path in field_paths(Profile)} | {"extends"}
    assert sorted(expected - listed) == [], "keys missing from docs/reference.md's profile keys"
    assert sorted(listed - expected) == [], "docs/reference.md lists keys the profile model does not have"


def test_a_profile_key_without_a_description_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference says what each key does: a key added without its Field's description is named, not listed
    blank."""
    import deploy_lib.profile
    from deploy_cli.reference import profile_key_rows
    real = deploy_lib.profile.profile_json_schema

    def without() -> dict[str, typing.Any]:
        schema = real()
        del schema["$defs"]["ParallelSpec"]["properties"]["pp"]["description"]
        return schema

    monkeypatch.setattr(deploy_lib.profile, "profile_json_schema", without)
    with pytest.raises(ValueError, match=r"parallel\.pp has no description"):
        profile_key_rows()


def shown_default(info: FieldInfo) -> str:
    """A field's default as the reference writes it: `required`, empty for none, `true`, an enum's value, `[a, b]`."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(str(each) for each in value) + "]"
    return str(value.value if isinstance(value, Enum) else value)


def test_profile_reference_gives_each_keys_default_as_the_model_has_it() -> None:
    """Failed before: `model.revision` said `main` where the model has none (the repo's main branch is SGLang's)."""
    shown = {key: cell.strip() for key, cell in re.findall(r"^\| `([a-z0-9_.]+)` \|[^|]*\|([^|]*)\|",
                                                          profile_key_table(), re.MULTILINE)}
    fields = dict(field_infos(Profile))
    assert {key: cell for key, cell in shown.items() if key != "extends" and cell != shown_default(fields[key])} == {}


def field_infos(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """Each key of the reference with its field: a section's own (its default None when it may be absent) too."""
    infos = []
    for name, info in model.model_fields.items():
        nested = [arg for arg in (info.annotation, *typing.get_args(info.annotation))
                  if isinstance(arg, type) and issubclass(arg, BaseModel) and arg is not SecretRef]
        infos.append((prefix + name, info))
        if nested:
            infos += field_infos(nested[0], prefix + name + ".")
    return infos


def test_exit_code_table_matches_the_error_classes() -> None:
    section = (DOCS / "troubleshooting.md").read_text().split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.MULTILINE))
    assert {name: int(code) for code, name in rows.items()} == {cls.__name__: code for cls, code in EXIT_CODES.items()}


def test_every_reliability_promise_names_tests_that_exist() -> None:
    section = (DOCS / "testing.md").read_text().split("## Reliability", 1)[1].split("\n## ", 1)[0]
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
    """Each command line the task table of docs/commands.md writes in its first column, as argv: a cell's backticked
    pieces in order (a piece without a task continues the one before), optional parts kept, of `A\\|B` the first or the
    option, `/` and `...` dropped."""
    section = (DOCS / "commands.md").read_text().split("## Every task", 1)[1].split("\n## ", 1)[0]
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


def test_the_readmes_one_line_per_command_names_every_user_task_and_only_those() -> None:
    """The README's command table, one line a command: each name it gives is a task of the installed command, and
    every such task is there (a family as `patches.*`)."""
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    cells = [row.split(" | ", 1)[0] for row in section.splitlines() if row.startswith("| `")]
    named = {word.split()[0] for cell in cells for word in re.findall(r"`([^`]+)`", cell)}
    user = {alias for name, aliases in user_tasks().task_names.items() for alias in (name, *aliases)} - {"tune.tune"}
    families = {name[:-1] for name in named if name.endswith(".*")}
    assert sorted(name for name in named - user if not name.endswith(".*")) == [], "not a task of sglang-deploy"
    assert sorted(name for name in user - named if name.split(".", 1)[0] + "." not in families) == [], \
        "a task of sglang-deploy the README's command table leaves out"


PROFILE_PAGES = [ROOT / "README.md", DOCS / "getting-started.md", DOCS / "profiles.md"]


def test_every_profile_the_guide_shows_is_a_valid_profile() -> None:
    """Each ```yaml block of the README and the guide's first pages that starts with `model:` loads as a whole
    profile (the minimal one of two lines included): a user may copy it as it is."""
    blocks = [(page.name, block) for page in PROFILE_PAGES
              for block in re.findall(r"^ *```yaml\n(.*?)^ *```", page.read_text(), re.MULTILINE | re.DOTALL)]
    profiles = [(name, textwrap.dedent(block)) for name, block in blocks if textwrap.dedent(block).startswith("model:")]
    assert len(profiles) >= 4
    for name, text in profiles:
        assert Profile.model_validate(yaml.safe_load(text)).model.path, name
    assert {"model: {path: Qwen/Qwen3-8B}\nparallel: {tp: 1}\n"} <= {text for _, text in profiles}


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_resolves_to_a_page_and_a_heading() -> None:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    anchors = {page.resolve(): {slug(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.MULTILINE)}
               for page in pages}
    broken = []
    for page in pages:
        prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page.resolve()
            if not resolved.exists() or (anchor and resolved in anchors and anchor not in anchors[resolved]):
                broken.append(f"{page.name}: {target}")
    assert broken == []


# The user's pages: every page but the maintainers' (a new page is a user's until it is named here).
MAINTAINERS = {"architecture", "testing", "performance", "sandbox"}
USER_PAGES = [ROOT / "README.md", *(page for page in sorted(DOCS.glob("*.md")) if page.stem not in MAINTAINERS)]


def test_the_guides_nav_puts_the_maintainers_pages_in_their_own_section_and_only_those() -> None:
    """mkdocs.yml's nav (`make docs` fails on a page left out of it); the user's pages are checked below."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    sections = {next(iter(entry)): next(iter(entry.values())) for entry in nav}
    maintainers = {Path(next(iter(page.values()))).stem for page in sections["Maintainers"]}
    assert maintainers == MAINTAINERS


def test_the_users_pages_name_no_test_date_or_load_average() -> None:
    """Measured figures are dated on docs/performance.md; a user's page says what to do. Code blocks and inline
    code (a command's output, an example document) are not prose and may carry a date."""
    assert len(USER_PAGES) > 15
    found = []
    for page in USER_PAGES:
        prose = re.sub(r"`[^`]*`", "", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL))
        for pattern in (r"\btest_\w+", r"\btests/", r"\b20\d\d-[01]\d-[0-3]\d\b", r"load average", r"\bload \d"):
            found += [f"{page.name}: {hit}" for hit in re.findall(pattern, prose)]
    assert found == []


def test_every_inventory_the_guide_shows_loads(tmp_path: Path) -> None:
    """Each ```yaml block of docs/inventory.md that starts with `all:` loads as an inventory, its hosts named."""
    from deploy_lib.inventory.model import load_inventory
    blocks = [block for block in re.findall(r"^```yaml\n(.*?)^```", (DOCS / "inventory.md").read_text(),
                                            re.MULTILINE | re.DOTALL) if block.startswith("all:")]
    assert blocks
    for number, block in enumerate(blocks):
        (tmp_path / f"{number}.yaml").write_text(block)
        assert load_inventory(tmp_path / f"{number}.yaml").hosts


def test_the_committed_reference_is_what_the_code_generates() -> None:
    """docs/reference.md is generated from each task's definition and the error classes; an option, a help text or
    an exit code changed without regenerating it fails here (`python -m deploy_cli.reference > docs/reference.md`)."""
    from deploy_cli.reference import reference_page
    generated = reference_page()
    assert (DOCS / "reference.md").read_text() == generated
    named = set(re.findall(r"^### (\S+)$", generated, re.MULTILINE))
    assert named == {aliases[0] if aliases else name for name, aliases in user_tasks().task_names.items()}
    assert all(f"| {code} |" in generated for code in EXIT_CODES.values())
