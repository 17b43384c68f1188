"""`invoke adopt`: take over a server that runs by hand as release 0 and write the profile that reproduces it.

Read-only first: the process's argv, environment, working directory and user (/proc/PID), the venv its interpreter
belongs to, and the options of the SGLang installed there; deploy_lib/facts/hand_process.py turns them into the profile
(pure). Secrets go by reference: their values go only into release 0's env file on the host (0600), never into the
profile.

Release 0 runs exactly the adopted command (its own arguments, as written) from the same venv, directory, user and
environment, under the tool's unit. While the hand-run process still holds the port, the first managed deploy
stops it (SIGTERM, as Ctrl-C or `systemctl stop` would) before starting its release; a failed deploy rolls back
to release 0.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from deploy_lib.deploy.plan import keep_replaced_unit
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts.hand_process import (
    RELEASE_ZERO,
    HandProcess,
    ProcessFacts,
    adopt_profile,
    interpreter_candidates,
    interpreter_fact,
    profile_yaml,
    split_launch,
)
from deploy_lib.facts.host import FactRequest, HostFacts, parse_systemctl_show
from deploy_lib.facts.sglang_config import check_config_name, config_fact, config_path, merged_arguments
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.store import host_lock
from deploy_lib.profile import LoadedProfile
from deploy_lib.program_name import spoken
from deploy_lib.release.model import build_release
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.remote.readings import Fact, read
from deploy_lib.store import (
    HEALTHY,
    Tags,
    append_history,
    history_entry,
    operator_name,
    release_json,
    stage_release,
    switch_current,
)


@dataclass(frozen=True)
class Adopted:
    """What `invoke adopt` did: release 0 on the host, and the profile text to write on this machine."""

    host: str
    pid: int
    release_id: str
    profile_name: str
    profile_text: str
    sglang_version: str
    venv: str
    notes: tuple[str, ...]
    secret_names: tuple[str, ...]


def read_process(remote: Remote, pid: int, where: str) -> HandProcess:
    process = ProcessFacts(pid)
    return process.process(read(remote, process.facts()), where)


def _refuse_managed(facts: HostFacts, target: Target, service: str, from_unit: bool) -> None:
    layout = target.layout(service)
    if facts.store.current or facts.store.releases:
        raise ConfigError(f"{target.host.name}: service {service} is already managed (current release "
                          f"{facts.store.current or 'none'})", "adopt under another --service name, or "
                          "`invoke uninstall` first")
    if not from_unit and (facts.unit_link is not None or facts.unit.load_state == "loaded"):
        raise PreflightError(f"{target.host.name}: a unit {layout.unit_name} already exists ({layout.unit_link})",
                             f"adopt that unit with --unit {layout.service}, or give --service a name no unit uses")


STEP_UNIT = "adopt: unit"
STEP_UNIT_FILE = "adopt: unit file"


def _running_unit(unit_name: str, where: str, shown: StepResult) -> tuple[int, str]:
    props = parse_systemctl_show(shown.stdout)
    pid, fragment = props.get("MainPID", "0"), props.get("FragmentPath", "")
    if props.get("ActiveState") != "active" or not pid.isdigit() or pid == "0" or not fragment:
        raise PreflightError(f"{where}: unit {unit_name} is not running (ActiveState={props.get('ActiveState')}, "
                             f"MainPID={pid})", "start it first, or adopt a hand-run process with --pid")
    return int(pid), fragment


def read_unit(remote: Remote, unit_name: str, where: str) -> tuple[int, str, str]:
    """(main pid, unit file path, its text) of a running hand-written unit."""
    running = Fact(Step(STEP_UNIT, ("systemctl", "show", "-p", "MainPID,FragmentPath,ActiveState", "--", unit_name)),
                   partial(_running_unit, unit_name, where))
    pid, fragment = read(remote, [running]).value(running)
    text = Fact(Step(STEP_UNIT_FILE, ("cat", "--", fragment), sudo=True), lambda result: result.stdout)
    return pid, fragment, read(remote, [text]).value(text)


def _config_merged(remote: Remote, args: tuple[str, ...], cwd: str, options: dict[str, dict[str, Any]],
                   where: str, version: str) -> tuple[str, ...] | None:
    """The arguments SGLang `version` parses from a `--config FILE` command (the file read on the host), or None;
    PreflightError for a file it would refuse (facts/sglang_config.py)."""
    path = config_path(args, cwd)
    if path is None:
        return None
    check_config_name(path, where)
    text = config_fact(path, where)
    return merged_arguments(args, read(remote, [text]).value(text), options, path, where, version)


def adopt(target: Target, service: str, remote: Remote, profile_name: str, pid: int | None = None,
          from_unit: bool = False, now: datetime | None = None) -> Adopted:
    """Record the server running as `pid` (or as the main process of the hand-written unit `service`, `from_unit`)
    as release 0 of `service`, and return the profile that reproduces it."""
    where, layout, now = target.host.name, target.layout(service), now or datetime.now(UTC)
    unit_file = read_unit(remote, layout.unit_name, where) if from_unit else None
    pid = unit_file[0] if unit_file else pid
    if pid is None:
        raise ConfigError("adopt needs --pid PID or --unit NAME")
    process = read_process(remote, pid, where)
    launch = split_launch(process, where)
    candidates = interpreter_candidates(process, launch.interpreter)
    venv_fact = interpreter_fact(candidates, where)
    interpreter, venv = read(remote, [venv_fact]).value(venv_fact)
    facts = read_host_facts(remote, FactRequest(layout, venv, port=None))
    version = facts.sglang.sglang_version
    if version is None:
        raise PreflightError(f"{where}: no SGLang found in {venv}: {facts.sglang.error}")
    _refuse_managed(facts, target, service, from_unit)
    source = f"unit {layout.unit_name} (pid {pid})" if unit_file else f"pid {pid}"
    description = f"adopted from {source} on {where} ({now.astimezone(UTC):%Y-%m-%d %H:%M} UTC)"
    merged = _config_merged(remote, launch.args, process.cwd, facts.sglang.options, where, version)
    adopted = adopt_profile(process, launch, venv, facts.sglang.options, version, description, service, merged)
    loaded = LoadedProfile(name=profile_name, path=Path(f"{profile_name}.yaml"), chain=(profile_name,),
                           profile=adopted.profile)
    release = build_release(loaded, layout, version, adopted.secrets, venv=venv,
                            flashinfer_version=facts.sglang.flashinfer_version,
                            extra_environment=adopted.venv_environment, launch_args=adopted.launch_args,
                            release_id=RELEASE_ZERO, torch_version=facts.sglang.torch_version,
                            nccl_version=facts.sglang.nccl_version)
    tags = Tags(operator_name(), where, RELEASE_ZERO, profile_name, release.profile_hash,
                {"sglang": version, **({"flashinfer": release.flashinfer_version} if release.flashinfer_version
                                       else {})})
    record: dict[str, Any] = {"interpreter": interpreter, "user": process.user, "cwd": process.cwd}
    takeover: list[Step | Put] = []
    if unit_file:
        # release 0 is the hand-written unit itself; systemd stops its process when a deploy restarts the unit
        release = replace(release, hand_written_unit=unit_file[2])
        record |= {"unit": layout.unit_name, "unit_file": unit_file[1]}
        takeover = [*keep_replaced_unit(layout, now)[0]]
    else:
        cmdline = "".join(f"{arg}\0" for arg in process.argv).encode()
        record |= {"pid": pid, "cmdline_sha256": hashlib.sha256(cmdline).hexdigest()}
    metadata = {**release.record(), "adopted": record}
    reload = [Step("systemd: daemon-reload", ("systemctl", "daemon-reload"), sudo=True)] if unit_file else []
    with host_lock(remote, layout, f"adopt {source}", where):
        remote.run([*stage_release(layout, RELEASE_ZERO, release.unit_text, release.env_text,
                                   release_json(metadata, tags, now), launcher_text=release.launcher_text),
                    *takeover, *switch_current(layout, RELEASE_ZERO), *reload,
                    *append_history(layout, history_entry("adopt", HEALTHY, tags, now, f"adopted {source}"))])
    how = f"--unit {service}" if unit_file else f"--pid {pid}"
    header = spoken(f"Written by `invoke adopt {how}` on {where}: SGLang {version} in {venv}.\n"
              f"Release 0 on the host runs exactly that {'unit' if unit_file else 'command'}; deploying this "
              "profile replaces it.")
    if release.secret_names:
        header += f"\nSecrets by reference: export {', '.join(release.secret_names)} before deploying."
    return Adopted(where, pid, RELEASE_ZERO, profile_name, profile_yaml(adopted.profile, header), version, venv,
                   adopted.notes, release.secret_names)
