"""A venv from a lock: reused when the venv of that lock on that interpreter is published, else built with the
pinned uv (`uv venv`, then `uv pip install --require-hashes --no-deps`) from the host's wheels, only the missing
ones sent, under the host's lock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.digests import short_hash
from deploy_lib.errors import StepFailed
from deploy_lib.host.store import host_lock
from deploy_lib.host.venv_publish import (
    VenvResult,
    clear_steps,
    jit_cache_warnings,
    publish_steps,
    relocate_step,
    staged_file_step,
)
from deploy_lib.host.venv_store import VenvFacts, read_facts
from deploy_lib.host_paths import venv_python
from deploy_lib.profile.settings import VenvSpec
from deploy_lib.progress import NullProgress, Progress
from deploy_lib.remote import Put, Remote, Step, StepResult, describe
from deploy_lib.store import StoreLayout, iso_time
from deploy_lib.venvs.host_scripts import (
    EXTRACT_UV_SCRIPT,
    FETCH_UV_SCRIPT,
    VERIFY_SCRIPT,
)
from deploy_lib.venvs.interpreter import PythonFacts
from deploy_lib.venvs.lock import Lock, load_lock
from deploy_lib.venvs.paths import staging_path, uv_binary, uv_cache, venv_path, wheel_dir
from deploy_lib.venvs.wheels import (
    UV_BINARY_MEMBER,
    LocalWheel,
    WheelTransfer,
    select_uv_wheel,
    select_wheels,
    uv_wheel,
    wheels_on_host,
)

LOCK_FILE = "requirements.lock"
INSTALL_TIMEOUT_S = 3600
INSTALLER_ERROR_LINES = 40
INSTALL_STEP = "venv build: uv pip install"
VERIFY_STEP = "venv build: verify wheels on the host"
FETCH_UV_STEP = "venv build: fetch uv from the index"


def venv_hash(lock: Lock, python: PythonFacts) -> str:
    """A built venv's hash: the normalised lock, the interpreter's version and ABI, the platform."""
    return short_hash(json.dumps({"kind": "built", "lock": lock.text(), "python": python.identity()}))


@dataclass(frozen=True)
class BuildPlan:
    """What building the venv of one lock takes on one host; empty (reuse) when it is already there."""

    hash: str
    path: PurePosixPath
    lock: Lock
    python: PythonFacts
    reuse: bool
    transfers: tuple[WheelTransfer, ...] = ()
    prepare: tuple[Step | Put, ...] = ()   # before the transfers: the wheel directories
    steps: tuple[Step | Put, ...] = ()     # after the transfers: clear, create, install, relocate, publish

    @property
    def bytes_to_send(self) -> int:
        return sum(transfer.wheel.size for transfer in self.transfers)

    def describe(self) -> list[str]:
        """Dry-run lines (the wheels are not read for this)."""
        if self.reuse:
            return [f"venv {self.hash}: reuse {self.path} (already built)"]
        sends = [f"send wheel {t.wheel.path.name} -> {t.dest} ({t.wheel.size} bytes)" for t in self.transfers]
        return [*describe(self.prepare), *sends, *describe(self.steps)]

    def batches(self) -> Iterator[list[Step | Put]]:
        """The batches to run in order; each wheel is read from disk only when its batch is reached."""
        if self.prepare:
            yield list(self.prepare)
        for transfer in self.transfers:
            yield [transfer.put()]
        if self.steps:
            yield list(self.steps)


def uv_options(layout: StoreLayout) -> tuple[str, ...]:
    """What every uv command on the host gets: no config files, no Python downloads, the store's cache."""
    return ("--no-config", "--no-python-downloads", "--color", "never", "--no-progress", "--cache-dir",
            str(uv_cache(layout)))


def uv_venv_argv(uv: PurePosixPath, layout: StoreLayout, interpreter: str, staging: PurePosixPath) -> tuple[str, ...]:
    return (str(uv), "venv", *uv_options(layout), "--offline", "--quiet", "--python", interpreter, "--",
            str(staging))


def uv_install_argv(uv: PurePosixPath, layout: StoreLayout, python: PurePosixPath, lock_file: PurePosixPath,
                    spec: VenvSpec, find_links: Iterable[PurePosixPath]) -> tuple[str, ...]:
    """uv pip install of the lock into the venv of `python`: hashes required, no resolution, hard links from the
    cache (uv copies, with a warning, where the cache is on another filesystem)."""
    argv = [str(uv), "pip", "install", *uv_options(layout), "--python", str(python), "--link-mode", "hardlink",
            "--require-hashes", "--no-deps", "--only-binary", ":all:"]
    if spec.wheelhouse is not None:
        argv += ["--offline", "--no-index"]
        for directory in find_links:
            argv += ["--find-links", str(directory)]
    else:
        argv += ["--index-url", str(spec.index)]
    return (*argv, "-r", str(lock_file))


def build_marker(venv_hash: str, lock: Lock, python: PythonFacts, wheels: Iterable[str],
                 now: datetime) -> dict[str, Any]:
    return {"hash": venv_hash, "kind": "built", "lock_sha256": lock.sha256, "python": python.as_dict(),
            "created": iso_time(now), "distributions": lock.distributions(), "wheels": sorted(set(wheels))}


@dataclass(frozen=True)
class UvSteps:
    """The pinned uv wheel on a host: fetched by the host in index mode (a wheelhouse sends it like any wheel), and
    its binary taken out into tools/<sha256>/ once the wheel is verified; no step once they are there."""

    sha256: str
    fetch: tuple[Step, ...]     # before the wheels are verified
    extract: tuple[Step, ...]   # after


def uv_steps(spec: VenvSpec, layout: StoreLayout, facts: VenvFacts, interpreter: str) -> UvSteps:
    filename, sha = uv_wheel(facts.python)
    fetch: tuple[Step, ...] = ()
    if spec.index is not None and sha not in facts.store.wheels:
        fetch = (Step(FETCH_UV_STEP, (interpreter, "-I", "-c", FETCH_UV_SCRIPT, spec.index, filename, sha,
                                      str(wheel_dir(layout, sha))), sudo=True, timeout_s=900),)
    extract: tuple[Step, ...] = ()
    if sha not in facts.store.tools:
        extract = (Step("venv build: uv binary", (interpreter, "-I", "-c", EXTRACT_UV_SCRIPT,
                                                  str(wheel_dir(layout, sha)), UV_BINARY_MEMBER,
                                                  str(uv_binary(layout, sha).parent)), sudo=True, timeout_s=300),)
    return UvSteps(sha, fetch, extract)


def plan_build(spec: VenvSpec, lock: Lock, layout: StoreLayout, facts: VenvFacts, now: datetime) -> BuildPlan:
    """Reuse the published venv of this lock on this interpreter, or the steps that build it.

    Only wheels the host lacks are read here (hashed) and sent; the uv wheel travels the same way.
    """
    digest = venv_hash(lock, facts.python)
    final, staging = venv_path(layout, digest), staging_path(layout, digest)
    if facts.store.published(digest):
        return BuildPlan(digest, final, lock, facts.python, reuse=True)
    interpreter = facts.interpreter or spec.python
    on_host = wheels_on_host(lock, facts.store.wheels) if spec.wheelhouse is not None else frozenset()
    local: tuple[LocalWheel, ...] = ()
    if spec.wheelhouse is not None:
        local = select_wheels(lock, spec.wheelhouse, facts.python, facts.store.wheels)
    installer = uv_steps(spec, layout, facts, interpreter)
    uv_sha = installer.sha256
    if spec.wheelhouse is not None and uv_sha not in facts.store.wheels:
        local = (*local, select_uv_wheel(spec.wheelhouse, facts.python))
    unique = {wheel.sha256: wheel for wheel in local}
    transfers = tuple(WheelTransfer(wheel, wheel_dir(layout, sha) / wheel.path.name)
                      for sha, wheel in sorted(unique.items()))
    prepare: tuple[Step | Put, ...] = ()
    if transfers:
        prepare = (Step("venv build: wheel directories",
                        ("mkdir", "-p", "--", *(str(t.dest.parent) for t in transfers)), sudo=True),)
    used = sorted({*on_host, *unique, uv_sha})
    verify = Step(VERIFY_STEP, (interpreter, "-I", "-c", VERIFY_SCRIPT,
                                *(part for sha in used for part in (sha, str(wheel_dir(layout, sha))))),
                  sudo=True, timeout_s=1800)
    python = venv_python(staging)
    lock_file = staging / LOCK_FILE
    uv = uv_binary(layout, uv_sha)
    find_links = [wheel_dir(layout, sha) for sha in used if sha != uv_sha]
    steps = [
        *clear_steps("venv build", layout, digest, facts.store),
        *installer.fetch,
        verify,
        *installer.extract,
        Step("venv build: create", uv_venv_argv(uv, layout, interpreter, staging), sudo=True, timeout_s=300),
        staged_file_step("venv build: lock file", lock_file, lock.text().encode()),
        Step(INSTALL_STEP, uv_install_argv(uv, layout, python, lock_file, spec, find_links), sudo=True,
             timeout_s=INSTALL_TIMEOUT_S),
        relocate_step("venv build: relocate scripts", python, staging, staging, final),
        *publish_steps("venv build", staging, final, build_marker(digest, lock, facts.python, used, now)),
    ]
    return BuildPlan(digest, final, lock, facts.python, reuse=False, transfers=transfers, prepare=prepare,
                     steps=tuple(steps))


def installer_error_lines(output: str) -> list[str]:
    """uv's own error: from its first `error:` line on (capped), else the last lines it printed."""
    lines = output.rstrip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(("error:", "ERROR:"))), None)
    return lines[first:first + INSTALLER_ERROR_LINES] if first is not None else lines[-12:]


def installer_failure(failure: StepFailed, venv_hash: str) -> StepFailed:
    result = failure.result
    output = "" if not isinstance(result, StepResult) else (result.stderr or result.stdout)
    lines = "\n".join("    " + line for line in installer_error_lines(output))
    first_line = failure.message.splitlines()[0]
    return type(failure)(f"uv could not build venv {venv_hash}; nothing was published ({first_line})\n"
                         f"  uv said:\n{lines}", step=failure.step, result=failure.result,
                         hint=failure.hint or "fix the lock or the wheelhouse; the unfinished build is cleared "
                                              "before the next attempt")


def run_build(remote: Remote, plan: BuildPlan, progress: Progress) -> VenvResult:
    result = VenvResult(plan.hash, plan.path, plan.reuse, plan.lock.distributions(),
                        warnings=tuple(jit_cache_warnings(plan.lock.distributions())))
    if plan.reuse:
        progress.note(f"venv {plan.hash}: reusing {plan.path}")
        return result
    progress.phase_started(f"venv {plan.hash}: build ({len(plan.transfers)} wheels, {plan.bytes_to_send} bytes "
                           "to send)")
    for batch in plan.batches():
        try:
            for step_result in remote.run(batch):
                progress.step_done(step_result.step.name, step_result.duration_s)
        except StepFailed as failure:
            name = getattr(failure.step, "name", None)
            if name == INSTALL_STEP:
                raise installer_failure(failure, plan.hash) from failure
            if name == VERIFY_STEP:
                raise StepFailed(failure.message, step=failure.step, result=failure.result,
                                 hint="wheels on the host were damaged and have been removed; rerun to send them "
                                      "again") from failure
            raise
    return replace(result, bytes_sent=plan.bytes_to_send,
                   wheels_sent=tuple(t.wheel.path.name for t in plan.transfers))


def ensure_venv(remote: Remote, layout: StoreLayout, spec: VenvSpec, now: datetime | None = None,
                progress: Progress | None = None, lock: Lock | None = None, where: str = "the host") -> VenvResult:
    """The venv of the spec's lock on this host: reused when published, else built (only missing wheels sent).

    Under the host's lock, so that no prune removes the build or its wheels while it runs."""
    lock = lock if lock is not None else load_lock(spec.lock)
    with host_lock(remote, layout, "venv build", where):
        facts = read_facts(remote, layout, spec.python)
        plan = plan_build(spec, lock, layout, facts, now or datetime.now(UTC))
        return run_build(remote, plan, progress or NullProgress())
