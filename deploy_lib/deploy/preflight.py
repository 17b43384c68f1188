"""Preflight: what a deploy reads for it once it knows it changes the host (PreflightReads), and the read-only checks
that the host can run a release (new or recorded), PreflightError before anything changes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploy_lib.deploy.plan import Plan, hand_run_check, hand_run_pid
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts.cuda_toolkit import FIX_HINT, sm12x_problem
from deploy_lib.facts.host import FactRequest, HostFacts, preflight_batch, require_gpus, with_preflight_facts
from deploy_lib.profile import LoadedProfile, read_stored_profile
from deploy_lib.release.argv_check import check_argv
from deploy_lib.release.model import RecordedRelease
from deploy_lib.remote import Step
from deploy_lib.remote.readings import Readings
from deploy_lib.store import ENV_FILE, UNIT_FILE, ReleaseRecord, StoreFacts, StoreLayout

MIN_FREE_BYTES = 64 * 1024 * 1024  # a release is a few KB, but a full disk breaks journald and pip alike


@dataclass(frozen=True)
class PreflightReads:
    """What a deploy reads once it knows it changes the host, before it changes anything, from the `facts` it decided
    from: what only preflight needs (`preflight_batch`; a dry run read it with the rest: `read_already`) and whether
    the adopted server of a current release 0 still runs (`hand_run_check`)."""

    facts: HostFacts
    request: FactRequest  # the decision's read, whose preflight part this completes
    read_already: bool

    @property
    def metadata(self) -> Mapping[str, Any] | None:
        current = self.facts.store.release(self.facts.store.current or "")
        return current.metadata if current else None

    @property
    def steps(self) -> list[Step]:
        return [*([] if self.read_already else preflight_batch(self.request)), *hand_run_check(self.metadata)]

    def parse(self, readings: Readings) -> tuple[HostFacts, int | None]:
        """The facts completed from a batch holding `steps`, and the adopted server's pid if it still runs."""
        found = self.facts if self.read_already else with_preflight_facts(self.facts, readings, self.request)
        return found, hand_run_pid(self.metadata, readings)


def _listener_pids(listeners: tuple[str, ...]) -> set[int]:
    return {int(pid) for line in listeners for pid in re.findall(r"\bpid=(\d+)", line)}


def preflight(plan: Plan, loaded: LoadedProfile, target: Target, facts: HostFacts, hand_pid: int | None = None
              ) -> None:
    """Read-only checks that the host can run the new release; PreflightError before anything changes."""
    check_release(RecordedRelease.of_release(plan.release), target, facts, hand_pid, recorded=False)
    if plan.gpu_check_reasons and facts.sglang.torch_version is None:
        raise PreflightError(f"{target.host.name}: preflight.gpu_check: the NCCL check must run "
                             f"({'; '.join(plan.gpu_check_reasons)}), but {plan.release.venv} has no torch; the "
                             "check runs torch.distributed with NCCL in the release's venv",
                             f"install torch with CUDA into {plan.release.venv}, or set preflight.gpu_check: false "
                             f"in profile {loaded.name}; nothing was changed")


def check_release(release: RecordedRelease, target: Target, facts: HostFacts, hand_pid: int | None = None,
                  recorded: bool = True) -> None:
    """The one preflight, for a new release and for a recorded one (rollback): GPUs, SGLang in the venv and every
    flag known to it, port (free, or held by our unit or the adopted hand-run server `hand_pid`), disk;
    PreflightError before anything changes."""
    where = target.host.name
    gpus = require_gpus(facts, release.profile.parallel, where)
    declared = target.host.vars.gpu_arch
    if declared and gpus and gpus[0].arch != declared:
        raise PreflightError(f"{where}: the inventory declares {declared}, nvidia-smi reports {gpus[0].arch} "
                             f"({gpus[0].name})", "correct gpu_arch in the inventory")
    toolkit_problem = sm12x_problem(facts.sglang.flashinfer_version, gpus[0].compute_cap, facts.cuda_toolkit,
                                    release.environment) if release.profile.features.allreduce_fusion and gpus else None
    if toolkit_problem:
        raise PreflightError(f"{where}: allreduce fusion cannot start: {toolkit_problem}", FIX_HINT)
    if facts.sglang.sglang_version is None and not facts.sglang.options:
        raise PreflightError(f"{where}: release {release.id}: no SGLang found in {release.venv}: {facts.sglang.error}",
                             "the release runs from that venv: recreate it there, or choose a release whose venv "
                             "exists (`invoke releases`, `invoke venv.list`)")
    if facts.import_shadow:
        raise PreflightError(
            f"{where}: the server would import SGLang from {facts.import_shadow}, not from what {release.venv} "
            f"has installed: `python -m` puts its working directory {release.profile.service.working_directory} "
            "first on sys.path (a checkout's parent directory there is imported as a namespace package before an "
            "editable install's finder, and SGLang's own __init__ never runs)",
            "set service.working_directory to a directory without an `sglang` entry (e.g. the checkout's own)")
    # a recorded release runs as it ran: an abbreviation this SGLang accepts (release 0's hand-written `--tp`) only
    # refuses a command the tool is about to write
    tolerated = {"abbreviation"} if recorded else set()
    problems = [problem for problem in check_argv(facts.sglang.options, list(release.args))
                if problem.severity == "error" and problem.kind not in tolerated]
    if problems:
        listed = "\n  ".join(problem.message for problem in problems)
        raise PreflightError(f"{where}: SGLang {facts.sglang.sglang_version or release.sglang_version} in "
                             f"{release.venv} does not accept the launch command of release {release.id}:\n  {listed}",
                             "fix the profile (extra_args, backends) or deploy a venv with a matching SGLang")
    port = release.profile.server.port
    ours = facts.unit.active_state in ("active", "activating", "deactivating", "reloading") or \
        (hand_pid is not None and hand_pid in _listener_pids(facts.port_listeners))
    if facts.port_listeners and not ours:
        raise PreflightError(f"{where}: port {port} is already in use by another process: "
                             f"{facts.port_listeners[0].strip()}", "stop that process or change server.port")
    if facts.free_bytes is not None and facts.free_bytes < MIN_FREE_BYTES:
        raise PreflightError(f"{where}: only {facts.free_bytes // (1024 * 1024)} MiB free under "
                             f"{target.deploy_root}", "free some disk space on the host")


def check_release_files(release: RecordedRelease, layout: StoreLayout, facts: HostFacts, where: str) -> None:
    """A recorded release's unit, env file and launcher are on the host and as they were written
    (`facts.release_sums`)."""
    for name in dict.fromkeys((UNIT_FILE, ENV_FILE, *release.files)):
        path = layout.release(release.id) / name
        found, recorded = facts.release_sums.get(name), release.files.get(name)
        if found is None:
            raise PreflightError(f"{where}: release {release.id} cannot run: {path} is missing",
                                 "deploy its profile again to write the release afresh, or choose another release")
        if recorded is not None and found != recorded:
            raise PreflightError(f"{where}: release {release.id}: {path} was changed since the release was written "
                                 f"(sha256 {found[:12]}..., recorded {recorded[:12]}...)",
                                 "deploy its profile again to write the release afresh, or choose another release")


def rollback_record(store: StoreFacts, to: str | None, where: str, layout: StoreLayout) -> ReleaseRecord:
    """The release a rollback switches to: `to`, default the last healthy one before current; refused when absent."""
    target_id = to or store.last_healthy(exclude=store.current)
    if target_id is None:
        raise ConfigError(f"{where}: no healthy release to roll back to (current: {store.current or 'none'})",
                          "`invoke releases` lists what is on the host")
    record = store.release(target_id)
    damaged = store.damaged_release(target_id)
    if damaged is not None:
        raise PreflightError(f"{where}: cannot roll back to release {target_id}: it is damaged: "
                             f"{damaged.reason}, in {layout.release(target_id)}",
                             "`invoke releases` lists the releases and what is wrong with each; nothing was changed")
    if record is None:
        known = ", ".join(r.id for r in store.releases) or "none"
        raise ConfigError(f"{where}: release {target_id!r} is not on the host", f"releases: {known}")
    return record


def current_record(store: StoreFacts, where: str) -> ReleaseRecord:
    """The current release of a start, restart or stop; ConfigError when none is deployed."""
    record = store.release(store.current) if store.current else None
    if record is None or "tags" not in record.metadata:
        raise ConfigError(f"{where}: no release is deployed (current: {store.current or 'none'})",
                          "`invoke deploy --profile P` first, or `invoke adopt` a server that runs by hand")
    return record


def refuse_one_node(store: StoreFacts, release_ids: tuple[str | None, ...], where: str, command: str,
                    whole: str) -> None:
    """A node of a multi-node release is switched, started and stopped with its other nodes, never alone: the
    others would wait at the rendezvous for it (or it for them). ConfigError naming the release and `whole`, the
    command that acts on every node; nothing is changed."""
    for release_id in dict.fromkeys(release_ids):
        record = store.release(release_id) if release_id else None
        parallel = read_stored_profile(record.metadata.get("profile")).parallel if record else None
        if parallel is not None and parallel.nnodes > 1:
            raise ConfigError(f"{where}: release {release_id} is node {parallel.node_rank} of a {parallel.nnodes}-node "
                              f"release: its nodes start, stop and switch together, so {where} alone is not "
                              f"{command}; nothing was changed", whole)
