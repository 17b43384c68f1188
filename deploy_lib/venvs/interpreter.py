"""Who a python on the host is (implementation, version, ABI, platform): what a venv's hash covers of its
interpreter. One script reads it, for the host's python before a build and for a venv's own before an adoption.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from deploy_lib.errors import PreflightError
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import Fact
from deploy_lib.venvs.host_scripts import PYTHON_FACTS_SCRIPT

FACT_PYTHON = "venv facts: host python"


@dataclass(frozen=True)
class PythonFacts:
    implementation: str
    version: str
    platform: str
    soabi: str
    machine: str
    # Where it is (sys.executable), for `uv venv --python`; not part of who it is, nor of a marker.
    executable: str = field(default="", compare=False)

    def identity(self) -> str:
        """What a venv's hash covers of its interpreter: implementation, version, ABI and platform."""
        return f"{self.implementation}-{self.version}-{self.soabi}-{self.platform}"

    def as_dict(self) -> dict[str, str]:
        return {"implementation": self.implementation, "version": self.version, "platform": self.platform,
                "soabi": self.soabi, "machine": self.machine}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PythonFacts:
        executable = data.get("executable")
        return cls(**{key: str(data[key]) for key in ("implementation", "version", "platform", "soabi", "machine")},
                   executable=executable if isinstance(executable, str) else "")


def python_step(python: str, name: str = FACT_PYTHON, sudo: bool = False) -> Step:
    """Who the interpreter is: the host's (for a build) or a venv's own (for an adoption, as root)."""
    return Step(name, (python, "-I", "-c", PYTHON_FACTS_SCRIPT), sudo=sudo, ok=frozenset({0, 126, 127}))


def python_fact(python: str, name: str = FACT_PYTHON, sudo: bool = False) -> Fact[PythonFacts]:
    return Fact(python_step(python, name, sudo), partial(parse_python_facts, python=python))


def parse_python_facts(result: StepResult, python: str) -> PythonFacts:
    if result.exit_code != 0:
        raise PreflightError(f"the host has no usable interpreter {python!r} (exit {result.exit_code})",
                             hint="install python3 and python3-venv on the host, or set the venv's `python`")
    try:
        return PythonFacts.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise PreflightError(f"cannot read the facts of {python!r} on the host: {result.stdout[-300:]!r}") from error
