"""Adopt a venv made by hand: its distributions and their RECORDs are inspected by its own python, and it is
copied with hard links into the store as a managed, immutable venv; drifted files are reported, not refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import PurePosixPath

from deploy_lib.digests import short_hash
from deploy_lib.errors import ConfigError, PreflightError, StepFailed
from deploy_lib.host.store import host_lock
from deploy_lib.host.venv_publish import (
    COPY_TIMEOUT_S,
    VenvResult,
    clear_steps,
    jit_cache_warnings,
    publish_steps,
    relocate_step,
)
from deploy_lib.host.venv_store import VenvStoreFacts, parse_store_facts, store_fact_steps
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.remote.readings import Fact, read
from deploy_lib.store import StoreLayout, iso_time
from deploy_lib.venvs.host_scripts import INSPECT_SCRIPT
from deploy_lib.venvs.installed import file_url_path
from deploy_lib.venvs.interpreter import PythonFacts, python_fact
from deploy_lib.venvs.paths import staging_path, venv_path

INSPECT_TIMEOUT_S = 1800
FACT_INSPECT = "venv adopt: inspect"
FACT_ADOPT_PYTHON = "venv adopt: inspect interpreter"


def _check_host_path(path: PurePosixPath) -> PurePosixPath:
    if not path.is_absolute() or ".." in path.parts or str(path) == "/":
        raise ConfigError(f"{str(path)!r} must be an absolute path to a venv, without '..'")
    return path


def inspect_step(venv: PurePosixPath) -> Step:
    """The venv's own python lists its distributions and checks every file against their RECORD."""
    return Step(FACT_INSPECT, (str(venv_python(_check_host_path(venv))), "-I", "-c", INSPECT_SCRIPT),
                sudo=True, ok=frozenset({0, 126, 127}), timeout_s=INSPECT_TIMEOUT_S)


def inspect_fact(venv: PurePosixPath) -> Fact[Inspection]:
    return Fact(inspect_step(venv), partial(parse_inspection, venv))


def adopt_python_fact(venv: PurePosixPath) -> Fact[PythonFacts]:
    """The venv's own interpreter, read as root like the inspection (a hand-made venv is often under /root)."""
    return python_fact(str(venv_python(_check_host_path(venv))), FACT_ADOPT_PYTHON, sudo=True)


@dataclass(frozen=True)
class Inspection:
    """What the venv's own python finds installed (host_scripts/venv_inspect.py); its interpreter is a fact of its
    own."""

    source: PurePosixPath
    distributions: Mapping[str, str]             # name -> version
    record_sha256: Mapping[str, str]             # name -> sha256 of its RECORD file
    drift: Mapping[str, tuple[tuple[str, str], ...]]   # name -> (path, actual sha256 or "missing"), drifted only
    editable: Mapping[str, str] = field(default_factory=dict)  # name -> source directory of an editable install


def parse_inspection(source: PurePosixPath, result: StepResult) -> Inspection:
    """The venv's distributions, as `inspect_step` printed them."""
    if result.exit_code != 0:
        raise PreflightError(f"{source} is not a usable venv: {venv_python(source)} exited {result.exit_code}",
                             hint=(result.stderr or result.stdout).strip()[-300:] or None)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        dists = data["distributions"]
        inspection = Inspection(
            source=source, distributions={name: str(d["version"]) for name, d in dists.items()},
            record_sha256={name: str(d["record_sha256"]) for name, d in dists.items()},
            drift={name: tuple((str(p), str(s)) for p, s in d["drift"]) for name, d in dists.items() if d["drift"]},
            editable={name: file_url_path(str(d["editable"])) for name, d in dists.items() if d.get("editable")})
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise PreflightError(f"cannot read the inspection of {source}: {result.stdout[-300:]!r}") from error
    if data["prefix"] == data["base_prefix"]:
        raise PreflightError(f"{source} is not a virtual environment (its python's prefix is {data['prefix']})",
                             hint="adopt the directory made by `python3 -m venv`, not a system python")
    return inspection


def adopted_hash(inspection: Inspection, python: PythonFacts) -> str:
    """From the interpreter, each distribution's version and RECORD, and the actual hash of each drifted file."""
    dists = sorted((name, inspection.distributions[name], inspection.record_sha256[name],
                    sorted(inspection.drift.get(name, ()))) for name in inspection.distributions)
    return short_hash(json.dumps({"kind": "adopted", "python": python.identity(), "dists": dists}))


def adopt_steps(layout: StoreLayout, inspection: Inspection, python: PythonFacts, facts: VenvStoreFacts,
                now: datetime) -> tuple[str, list[Step | Put]]:
    """Hard-linked copy into venvs/<hash>.tmp, paths rewritten (new files), marker, rename; nothing if published."""
    digest = adopted_hash(inspection, python)
    if facts.published(digest):
        return digest, []
    staging, final = staging_path(layout, digest), venv_path(layout, digest)
    marker = {"hash": digest, "kind": "adopted", "source": str(inspection.source),
              "python": python.as_dict(), "created": iso_time(now),
              "distributions": dict(inspection.distributions),
              "drift": {name: [list(entry) for entry in files] for name, files in inspection.drift.items()}}
    if inspection.editable:  # their files stay in the checkout: the managed copy imports from there, as the original
        marker["editable"] = dict(inspection.editable)
    return digest, [
        *clear_steps("venv adopt", layout, digest, facts),
        Step("venv adopt: hard-linked copy", ("cp", "-al", "--", str(inspection.source), str(staging)), sudo=True,
             timeout_s=COPY_TIMEOUT_S),
        relocate_step("venv adopt: relocate scripts", venv_python(staging), staging, inspection.source,
                      final),
        *publish_steps("venv adopt", staging, final, marker),
    ]


def adopt(remote: Remote, layout: StoreLayout, source: PurePosixPath, now: datetime | None = None,
          where: str = "the host") -> VenvResult:
    """Record a hand-made venv as a managed, immutable one; drifted distributions are reported, not refused."""
    with host_lock(remote, layout, f"venv adopt {source}", where):
        return _adopt(remote, layout, source, now)


def _adopt(remote: Remote, layout: StoreLayout, source: PurePosixPath, now: datetime | None) -> VenvResult:
    inspected, python = inspect_fact(source), adopt_python_fact(source)
    found = read(remote, [inspected, python, *store_fact_steps(layout)])
    inspection = found.value(inspected)
    digest, steps = adopt_steps(layout, inspection, found.value(python), parse_store_facts(layout, found),
                                now or datetime.now(UTC))
    try:
        if steps:
            remote.run(steps)
    except StepFailed as failure:
        if getattr(failure.step, "name", None) == "venv adopt: hard-linked copy":
            raise type(failure)(failure.message, step=failure.step, result=failure.result,
                                hint="hard links need the venv and the store on one filesystem") from failure
        raise
    return VenvResult(digest, venv_path(layout, digest), reused=not steps, distributions=inspection.distributions,
                      warnings=tuple(jit_cache_warnings(inspection.distributions)), drift=inspection.drift,
                      editable=inspection.editable)
