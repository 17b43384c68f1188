"""`invoke gpu-check` on one host: the topology and the all-reduce with the GPUs free, the server stopped and
restarted through the readiness ladder when asked, all under the host lock; then, when asked, the peer-to-peer
section (gpu_check.p2p: the per-pair copy measurement while the GPUs are still free, the VM-side reads on the host,
the Proxmox node's when the host names one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from deploy_lib.commands import deploy
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError, DeployError, PreflightError
from deploy_lib.facts.host import FactRequest
from deploy_lib.gpu_check.allreduce import DEFAULT_SIZES, parse_sizes
from deploy_lib.gpu_check.subject import (
    CheckSubject,
    GpuCheckReport,
    python_step,
    read_check_batch,
    subject_of_profile,
    subject_of_release,
    subject_step,
    venv_has_python,
)
from deploy_lib.gpu_check.topology import parse_topology_results, topology_steps
from deploy_lib.host.facts import read_host_facts
from deploy_lib.host.store import host_lock
from deploy_lib.host_paths import venv_python
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote, Step

if TYPE_CHECKING:
    from deploy_lib.gpu_check.p2p.measure import Measurement
    from deploy_lib.host.p2p_reading import NodeReader

# parse_sizes beside the command it feeds: the CLI parses --sizes and runs the check from this one module
__all__ = ["check_host", "parse_sizes", "run_gpu_check"]
TOPO_DUMP_NAME = "gpu-check-nccl-topo.xml"  # NCCL_TOPO_DUMP_FILE of gpu-check's all-reduce, in the service's base


def check_host(remote: Remote, progress: Progress, subject: CheckSubject, sizes: Sequence[int] = DEFAULT_SIZES,
               deadline_s: float = 300, topo_dump: PurePosixPath | None = None) -> GpuCheckReport:
    """Topology + advice, then the all-reduce; the GPUs must already be free (the caller stops the server). With
    `topo_dump`, NCCL writes its topology there during the all-reduce (an older dump removed first); the report's
    subject keeps the release's own environment."""
    progress.phase_started("topology")
    topology_results = remote.run(topology_steps())
    topology, _ = parse_topology_results(topology_results)
    if topology is not None and topology.gpu_count < subject.world_size:
        raise PreflightError(f"{subject.source} runs TP {subject.world_size} but the host has "
                             f"{topology.gpu_count} GPUs")
    progress.phase_started(f"all-reduce over {subject.world_size} GPUs")
    run_with = subject if topo_dump is None else replace(
        subject, environment={**subject.environment, "NCCL_TOPO_DUMP_FILE": str(topo_dump)})
    clear = [] if topo_dump is None else [Step("p2p: remove an older NCCL topology dump", ("rm", "-f", "--",
                                                                                          str(topo_dump)), sudo=True)]
    *_, check = remote.run([*clear, subject_step(run_with, sizes, deadline_s)])
    return read_check_batch(subject, [*topology_results, check])


def measure_pairs(remote: Remote, progress: Progress, subject: CheckSubject, gpu_count: int) -> Measurement:
    """The per-pair copies (read-only, ended by timeout(1)); the GPUs must already be free. One GPU: skipped, and
    said why."""
    from deploy_lib.gpu_check.p2p.measure import Measurement, measure_step, parse_measure_result
    if gpu_count < 2:
        seen = "one GPU on the host" if gpu_count == 1 else "no GPU seen on the host (topo -m, the GPU table and " \
            "the all-reduce named none)"
        return Measurement(None, skipped=f"{seen}, no pair to copy between")
    progress.phase_started(f"P2P copies between {gpu_count} GPUs (each ordered pair)")
    (result,) = remote.run([measure_step(str(venv_python(subject.venv)))])
    return parse_measure_result(result)


def run_gpu_check(target: Target, service: str, remote: Remote, progress: Progress, loaded: LoadedProfile | None,
                  stop_server: bool, environ: Mapping[str, str], sizes: Sequence[int] = DEFAULT_SIZES,
                  before_stop: Callable[[], None] | None = None, peer_to_peer: NodeReader | None = None
                  ) -> GpuCheckReport:
    """gpu-check on one host: refuse while the server holds the GPUs unless told to stop it; then restart the
    current release through the readiness ladder (deploy.start), whatever the check found. `before_stop` runs just
    before the server stops (a router takes the replica out); an error of the check carries the release serving
    again after the restart (`serving_id`), so the router takes the replica back. With `peer_to_peer` (the reader of
    the host's Proxmox node), the report carries the peer-to-peer verdict, read once the GPUs serve again."""
    layout = target.layout(service)
    facts = read_host_facts(remote, FactRequest(layout, venv=None, port=None))
    record = facts.store.release(facts.store.current) if facts.store.current else None
    if loaded is not None:
        subject = subject_of_profile(loaded, target)
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
    (has_python,) = remote.run([python_step(subject)])
    venv_has_python(target.host.name, subject, has_python)  # before anything stops
    topo_dump = layout.base / TOPO_DUMP_NAME if peer_to_peer is not None else None
    measurement: Measurement | None = None
    # held from the stop to the restart, so no deploy starts a server on the GPUs while the check runs
    with host_lock(remote, layout, "gpu-check", target.host.name):
        if running:
            progress.note(f"stopping {layout.unit_name} for the check")
            deploy.stop(target, service, remote, before_stop=before_stop)
        try:
            report = check_host(remote, progress, subject, sizes, topo_dump=topo_dump)
            if peer_to_peer is not None:  # after the all-reduce, while the GPUs are still free
                # topo -m lists no link on a one-GPU host: the facts' GPU table and the check's ranks count too
                gpu_count = max(report.topology.gpu_count if report.topology else 0, len(facts.gpus or ()),
                                len(report.check.gpus))
                measurement = measure_pairs(remote, progress, subject, gpu_count)
        except DeployError as failed:  # raised only once the restart below served the release again
            if running:
                failed.serving_id = facts.store.current
            raise
        finally:
            if running:
                progress.note(f"restarting {layout.unit_name}")
                deploy.start(target, service, remote, progress, environ, restart=False)
    if peer_to_peer is None:
        return report
    from deploy_lib.host.p2p_reading import check_peer_to_peer
    progress.phase_started("peer-to-peer (read-only: the VM, and its Proxmox node where named)")
    node_readings = peer_to_peer(target)
    gpu_names = tuple(gpu.name for gpu in facts.gpus or ())
    return replace(report, peer_to_peer=check_peer_to_peer(report, remote, node_readings, gpu_names,
                                                           str(topo_dump), measurement))
