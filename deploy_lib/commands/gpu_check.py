"""`invoke gpu-check` on one host: the topology and the all-reduce with the GPUs free, the server stopped and
restarted through the readiness ladder when asked, all under the host lock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from deploy_lib import deploy
from deploy_lib.errors import ConfigError, DeployError, PreflightError
from deploy_lib.facts.read import read_host_facts
from deploy_lib.gpu_check.allreduce import DEFAULT_SIZES, parse_sizes
from deploy_lib.gpu_check.subject import (
    CheckSubject,
    GpuCheckReport,
    read_check_batch,
    subject_of_profile,
    subject_of_release,
    subject_step,
)
from deploy_lib.gpu_check.topology import parse_topology_results, topology_steps
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.project import Target
from deploy_lib.remote import Remote
from deploy_lib.store import host_lock

# parse_sizes beside the command it feeds: the CLI parses --sizes and runs the check from this one module
__all__ = ["check_host", "parse_sizes", "run_gpu_check"]


def check_host(remote: Remote, progress: Progress, subject: CheckSubject, sizes: Sequence[int] = DEFAULT_SIZES,
               deadline_s: float = 300) -> GpuCheckReport:
    """Topology + advice, then the all-reduce; the GPUs must already be free (the caller stops the server)."""
    progress.phase_started("topology")
    topology_results = remote.run(topology_steps())
    topology, _ = parse_topology_results(topology_results)
    if topology is not None and topology.gpu_count < subject.world_size:
        raise PreflightError(f"{subject.source} runs TP {subject.world_size} but the host has "
                             f"{topology.gpu_count} GPUs")
    progress.phase_started(f"all-reduce over {subject.world_size} GPUs")
    return read_check_batch(subject, [*topology_results, *remote.run([subject_step(subject, sizes, deadline_s)])])


def run_gpu_check(target: Target, service: str, remote: Remote, progress: Progress, loaded: LoadedProfile | None,
                  stop_server: bool, environ: Mapping[str, str], sizes: Sequence[int] = DEFAULT_SIZES,
                  before_stop: Callable[[], None] | None = None) -> GpuCheckReport:
    """gpu-check on one host: refuse while the server holds the GPUs unless told to stop it; then restart the
    current release through the readiness ladder (deploy.start), whatever the check found. `before_stop` runs just
    before the server stops (a router takes the replica out); an error of the check carries the release serving
    again after the restart (`serving_id`), so the router takes the replica back."""
    layout = target.layout(service)
    facts = read_host_facts(remote, layout, venv=None, port=None)
    record = facts.store.release(facts.store.current) if facts.store.current else None
    if loaded is not None:
        subject = subject_of_profile(loaded)
    elif record is not None:
        subject = subject_of_release(record.id, record.metadata)
    else:
        raise ConfigError(f"{target.host.name}: no release is deployed for {service}, so there is no venv or NCCL "
                          "environment to check with", "give --profile P")
    running = facts.unit.active_state in ("active", "activating", "reloading")
    if running and not stop_server:
        raise PreflightError(f"{target.host.name}: {layout.unit_name} is running and holds the GPUs; the check needs "
                             "them free", "`invoke gpu-check --stop-server` stops it and restarts the current release "
                             "through the readiness ladder afterwards")
    # held from the stop to the restart, so no deploy starts a server on the GPUs while the check runs
    with host_lock(remote, layout, "gpu-check", target.host.name):
        if running:
            progress.note(f"stopping {layout.unit_name} for the check")
            deploy.stop(target, service, remote, before_stop=before_stop)
        try:
            return check_host(remote, progress, subject, sizes)
        except DeployError as failed:  # raised only once the restart below served the release again
            if running:
                failed.serving_id = facts.store.current
            raise
        finally:
            if running:
                progress.note(f"restarting {layout.unit_name}")
                deploy.start(target, service, remote, progress, environ, restart=False)
