"""What a check runs with (a release's or a profile's venv, TP size and NCCL environment), the report, and when a
deploy runs the check (preflight.gpu_check): what differs between the current and the new release."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deploy_lib.errors import PreflightError
from deploy_lib.gpu_check.allreduce import DEFAULT_SIZES, CheckResult, check_step, parse_check_result
from deploy_lib.gpu_check.topology import Advice, Topology, advise, parse_topology_results, topology_steps
from deploy_lib.host_paths import venv_python
from deploy_lib.profile import LoadedProfile, ParallelSpec, read_stored_profile
from deploy_lib.release.server_args import launch_environment
from deploy_lib.remote import Step, StepResult

if TYPE_CHECKING:
    from deploy_lib.deploy.project import Target
    from deploy_lib.gpu_check.p2p.verdict import P2pVerdict


@dataclass(frozen=True)
class CheckSubject:
    """What the check runs with: a release's (or a profile's) venv, TP size and non-secret environment."""

    source: str  # "release 1a2b3c4d5e6f" or "profile glm5-nvfp4"
    venv: str
    world_size: int
    environment: dict[str, str]
    venv_from: str = ""  # where `venv` was named: "release R's record", "the host's `venv` var", ...


def ranks_on_this_node(parallel: ParallelSpec) -> int:
    """One rank per GPU of a TP group, on this host's GPUs: a TP group spread over nodes checks this node's part."""
    return min(parallel.tp, parallel.gpus_per_node)


def subject_of_release(release_id: str, metadata: Mapping[str, Any]) -> CheckSubject:
    """A release as release.json records it (a deploy's new release: its metadata())."""
    return CheckSubject(f"release {release_id}", str(metadata["venv"]),
                        ranks_on_this_node(read_stored_profile(metadata.get("profile")).parallel),
                        dict(metadata.get("environment") or {}), f"release {release_id}'s record")


def subject_of_profile(loaded: LoadedProfile, target: Target | None = None) -> CheckSubject:
    """A profile on `target`: its venv as a deploy there resolves it (the host's `venv` var first)."""
    venv = target.venv_of(loaded.profile) if target is not None else loaded.profile.service.venv
    venv_from = f"{target.host.name}'s `venv` var" if target is not None and target.venv_override else \
        f"profile {loaded.name}'s service.venv"
    # as build_release does: the venv replaces the profile's, so PATH and VIRTUAL_ENV follow it
    profile = loaded.profile.model_copy(update={"service": loaded.profile.service.model_copy(update={"venv": venv})})
    return CheckSubject(f"profile {loaded.name}", venv, ranks_on_this_node(profile.parallel),
                        launch_environment(profile), venv_from)


NO_PYTHON = 3  # the python step's own exit for "not there" (sudo's own failures exit 1)


def python_step(subject: CheckSubject) -> Step:
    """Whether the venv's python is there, read under sudo (a venv under /root is hidden from other users)."""
    return Step("host facts: venv python (gpu-check)", ("sh", "-c", f'test -x "$1" || exit {NO_PYTHON}', "sh",
                                           str(venv_python(subject.venv))),
                sudo=True, ok=frozenset({0, NO_PYTHON}), timeout_s=15, repeatable=True)


def venv_has_python(host: str, subject: CheckSubject, result: StepResult) -> None:
    """python_step's result: a venv without python is a PreflightError naming the venv, where it was named, and what
    to run."""
    if result.exit_code == NO_PYTHON:
        raise PreflightError(
            f"{host}: {subject.source} checks with venv {subject.venv} ({subject.venv_from}), which has no "
            f"{venv_python(subject.venv)}: the all-reduce and the copies run under that python",
            f"create it on {host} (`python3 -m venv {subject.venv}`, then torch with CUDA into it), or point the "
            "host's `venv` var or the profile's service.venv at a venv that has them")


@dataclass(frozen=True)
class GpuCheckReport:
    subject: CheckSubject
    topology: Topology | None
    topology_error: str | None
    advice: Advice | None
    check: CheckResult
    peer_to_peer: P2pVerdict | None = None  # `invoke gpu-check`'s section; None in a deploy's preflight.gpu_check


def subject_step(subject: CheckSubject, sizes: Sequence[int], deadline_s: float) -> Step:
    return check_step(str(venv_python(subject.venv)), subject.world_size, subject.environment, sizes, deadline_s)


# what the all-reduce depends on besides the GPUs and the venv: NCCL's variables, torch's for NCCL, the GPUs a rank sees
CHECKED_ENV = re.compile(r"^(?:NCCL_|TORCH_NCCL_)|^CUDA_VISIBLE_DEVICES$")
REPORT_PREFIX = "gpu-check: "  # the report's lines as deploy's diagnosis reads them (diagnose.py: nccl_check)


def checked_setup(metadata: Mapping[str, Any]) -> dict[str, str | None]:
    """What a passed check proves of a release, from its release.json: TP size, torch, NCCL, NCCL environment."""
    environment = {f"env {name}": str(value) for name, value in sorted(dict(metadata.get("environment") or {}).items())
                   if CHECKED_ENV.match(name)}
    return {"TP": str(read_stored_profile(metadata.get("profile")).parallel.tp),
            "torch": metadata.get("torch_version"), "NCCL": metadata.get("nccl_version"), **environment}


def check_reasons(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> tuple[str, ...]:
    """Why a deploy from `current` to `new` (release.json forms) runs the check: what differs; () when nothing."""
    if current is None:
        return ("no current release to compare with",)
    before, after = checked_setup(current), checked_setup(new)
    return tuple(f"{key} {before.get(key) or '(none)'} -> {after.get(key) or '(none)'}"
                 for key in dict.fromkeys([*before, *after]) if before.get(key) != after.get(key))


def check_batch(subject: CheckSubject, sizes: Sequence[int] = DEFAULT_SIZES, deadline_s: float = 300) -> list[Step]:
    """Topology and the all-reduce in one round trip (the GPUs already free); read_check_batch reads it."""
    return [*topology_steps(), subject_step(subject, sizes, deadline_s)]


def read_check_batch(subject: CheckSubject, results: Sequence[StepResult]) -> GpuCheckReport:
    """check_batch's results (its last four) -> the report."""
    *topology_results, check = results[-4:]
    topology, topology_error = parse_topology_results(topology_results)
    advice = advise(topology, subject.environment) if topology else None
    return GpuCheckReport(subject, topology, topology_error, advice, parse_check_result(check, subject.world_size))
