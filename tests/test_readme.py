"""The README's profile reference and exit codes stay in step with the code."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from deploy_lib.errors import EXIT_CODES
from deploy_lib.profile import Profile, SecretRef

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


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
