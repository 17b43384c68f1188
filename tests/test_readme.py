"""The README's profile reference and exit codes stay in step with the code."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from deploy_lib.errors import EXIT_CODES
from deploy_lib.profile import Profile, SecretRef

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


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
