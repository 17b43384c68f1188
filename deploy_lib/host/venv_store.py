"""What the store holds, read in one read-only batch: published venvs (their markers), interrupted builds and
strays in venvs/, the wheels in wheels/ and the uv binaries in tools/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, Fact, Readings, read
from deploy_lib.store import STAGING_SUFFIX, StoreLayout
from deploy_lib.venvs.interpreter import PythonFacts, python_fact
from deploy_lib.venvs.paths import HASH_RE, MARKER_FILE, tool_store, wheel_store

FACT_MARKERS = "venv facts: markers"
FACT_DIRS = "venv facts: venv directories"
FACT_WHEELS = "venv facts: wheels on the host"
FACT_TOOLS = "venv facts: uv binaries on the host"


def _found(result: StepResult) -> str:
    """What a find printed, or "" when the directory is not there yet."""
    return result.stdout if result.exit_code == 0 else ""


def _by_sha256(name: str, directory: PurePosixPath, file_name: str) -> Fact[frozenset[str]]:
    """The <sha256>/ directories of a content-addressed directory (wheels/, tools/) that hold such a file."""
    return Fact(Step(name, ("find", str(directory), "-mindepth", "2", "-maxdepth", "2", "-name", file_name,
                            "-type", "f", "-printf", "%P\\0"), ok=ABSENT_OK),
                lambda result: parse_wheel_names(_found(result)))


def store_facts(layout: StoreLayout) -> dict[str, Fact[Any]]:
    """The store's read-only facts by the VenvStoreFacts field each fills: the markers of published venvs (with
    their text), every entry of venvs/, the wheels and the uv binaries present."""
    venvs = str(layout.venvs)
    return {
        # "\0<hash>/venv.json\0<marker text>" per venv; a marker is one JSON line and JSON text holds no NUL.
        "markers": Fact(Step(FACT_MARKERS, ("find", venvs, "-mindepth", "2", "-maxdepth", "2", "-name", MARKER_FILE,
                                            "-printf", "\\0%P\\0", "-exec", "cat", "--", "{}", ";"), ok=ABSENT_OK),
                        lambda result: parse_markers(_found(result))),
        "entries": Fact(Step(FACT_DIRS, ("find", venvs, "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0"),
                             ok=ABSENT_OK),
                        lambda result: tuple(sorted(name for name in _found(result).split("\0") if name))),
        "wheels": _by_sha256(FACT_WHEELS, wheel_store(layout), "*.whl"),
        "tools": _by_sha256(FACT_TOOLS, tool_store(layout), "uv"),
    }


def store_fact_steps(layout: StoreLayout) -> list[Step]:
    return [fact.step for fact in store_facts(layout).values()]


@dataclass(frozen=True)
class VenvStoreFacts:
    markers: Mapping[str, Mapping[str, Any]]   # hash -> marker of every published venv
    entries: tuple[str, ...]                   # every name in venvs/: published, staging leftovers, strays
    wheels: frozenset[str]                     # sha256 of each wheel in wheels/
    tools: frozenset[str] = frozenset()        # sha256 of each uv wheel whose binary is in tools/

    def published(self, venv_hash: str) -> bool:
        return venv_hash in self.markers

    @property
    def leftovers(self) -> tuple[str, ...]:
        """Interrupted builds: <hash>.tmp directories."""
        return tuple(name for name in self.entries
                     if name.endswith(STAGING_SUFFIX) and HASH_RE.fullmatch(name.removesuffix(STAGING_SUFFIX)))

    @property
    def strays(self) -> tuple[str, ...]:
        """Entries that are neither published venvs nor interrupted builds (a damaged marker, a hand-made dir)."""
        return tuple(name for name in self.entries if name not in self.markers and name not in self.leftovers)


@dataclass(frozen=True)
class VenvFacts:
    python: PythonFacts
    store: VenvStoreFacts

    @property
    def interpreter(self) -> str:
        """The interpreter's path on the host (sys.executable); "" when it did not say."""
        return self.python.executable


def parse_markers(find_out: str) -> dict[str, dict[str, Any]]:
    """hash -> marker, from "\\0<hash>/venv.json\\0<json>" records; an unreadable marker counts as absent."""
    pieces = find_out.split("\0")[1:]
    markers = {}
    for name, text in zip(pieces[::2], pieces[1::2], strict=False):
        venv_hash = name.split("/", 1)[0]
        try:
            marker = json.loads(text)
        except ValueError:
            continue
        if isinstance(marker, dict) and marker.get("hash") == venv_hash and HASH_RE.fullmatch(venv_hash):
            markers[venv_hash] = marker
    return markers


def parse_wheel_names(find_out: str) -> frozenset[str]:
    """sha256 digests of the wheels in wheels/<sha256>/<file>."""
    return frozenset(entry.split("/", 1)[0] for entry in find_out.split("\0")
                     if "/" in entry and re.fullmatch(r"[0-9a-f]{64}", entry.split("/", 1)[0]))


def parse_store_facts(layout: StoreLayout, results: Sequence[StepResult] | Readings) -> VenvStoreFacts:
    found = Readings.of(results)
    return VenvStoreFacts(**{field: found.value(fact) for field, fact in store_facts(layout).items()})


def read_facts(remote: Remote, layout: StoreLayout, python: str) -> VenvFacts:
    """The host's interpreter and the store, in one round trip."""
    interpreter = python_fact(python)
    found = read(remote, [interpreter, *store_facts(layout).values()])
    return VenvFacts(found.value(interpreter), parse_store_facts(layout, found))
