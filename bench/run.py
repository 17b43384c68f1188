"""`make bench`: the performance figures of issues 4 (deploy, readiness, rollback), 5 (venvs) and 12 (model
staging), measured on a sandbox guest of its own that is always stopped at the end.

Every figure is the median of several runs, printed with its target and PASS/MISS; the exit code is 0 either way
(figures, not assertions). Instants on the host (the restart, "fired up", the process exit) are the journal's
__REALTIME_TIMESTAMP; the guest is a container on this machine, so its clock is this machine's clock and they
compare directly with time.time() taken here.

    .venv/bin/python -m bench.run [--runs 5] [--venv-runs 3] [--quick] [--no-peer]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench import page_cache
from bench import peer as peer_module
from bench.downtime import downtime_figures
from bench.figures import Figure, deploy_figures, table
from bench.live_probe import live_probe_cpu, live_probe_figures
from bench.measure import (
    FAULT_FILE,
    PROFILE,
    Rig,
    changed_deploy,
    crash_and_roll_back,
    long_step_cpu,
    make_rig,
    no_op_parts,
    no_op_redeploy,
    whole_process_no_op,
)
from bench.peer import Peer
from bench.staging import MODEL_SHARD_VALUES, OTHER_FLASHINFER, QUICK_SHARD_VALUES, measure_models, measure_venvs
from bench.timeline import say
from sandbox import manage, wheelhouse


def measure_deploys(rig: Rig, runs: int, peer_work: Path | None) -> list[Figure]:
    """Our deploy figures; with `peer_work`, pyinfra's beside them (its files there), each of its runs right after
    ours (interleaved) so a change of the machine's load hits both."""
    rig.root(f"mkdir -p /etc/sglang-sim && echo oom > {FAULT_FILE}")
    with rig.command(PROFILE) as (_remote, _progress, deploy):
        outcome = deploy()
        say(f"first deploy of {PROFILE}: {outcome.action}")
    assert outcome.plan is not None
    peer = Peer(rig, outcome.plan.release, peer_work) if peer_work else None
    if peer:
        peer.first()
        say(f"first deploy of {peer_module.SERVICE} by pyinfra")
    no_ops = [no_op_redeploy(rig) for _ in range(runs)]
    say(f"no-op redeploys: {', '.join(f'{run.seconds:.2f} s' for run in no_ops)}")
    probes = [live_probe_cpu(rig, outcome.plan.release.metadata()) for _ in range(runs)]
    say(f"live probe, the guest's CPU: forwarded {', '.join(f'{run.forwarded_s:.3f} s' for run in probes)}; "
        f"on the host {', '.join(f'{run.host_s:.3f} s' for run in probes)}")
    pycache = Path(tempfile.mkdtemp(prefix="sglang-bench-pycache-"))
    whole_process_no_op(rig, pycache, write_pyc=True)  # writes the bytecode cache
    processes, peer_no_ops, floors = [], [], []
    for _ in range(runs):
        processes.append(whole_process_no_op(rig, pycache))
        floors.append(peer_module.floor(rig))
        if peer:
            peer_no_ops.append(peer.no_op())
    parts = [no_op_parts(rig, pycache) for _ in range(runs)]
    shutil.rmtree(pycache)
    say(f"no-op deploys, whole process: {', '.join(f'{run.seconds:.2f} s' for run in processes)}"
        + (f"; pyinfra {', '.join(f'{run.seconds:.2f} s' for run in peer_no_ops)}" if peer else ""))
    changed, peer_changed = [], []
    for run in range(runs):
        changed.append(changed_deploy(rig, f"bench-{run}"))
        say(f"changed deploy {run + 1}/{runs}: total {changed[-1].total_s:.2f} s, "
            f"server start {changed[-1].server_start_s:.2f} s; {changed[-1].downtime.line()}")
        if peer:
            peer_changed.append(peer.changed(run))
            say(f"  pyinfra: total {peer_changed[-1].total_s:.2f} s, server start "
                f"{peer_changed[-1].server_start_s:.2f} s")
    crashes = []
    for run in range(runs):
        crashes.append(crash_and_roll_back(rig))
        say(f"crash {run + 1}/{runs}: noticed {crashes[-1].noticed_s:.2f} s, rollback {crashes[-1].rollback_s:.2f} s")
    long_steps = [long_step_cpu(rig) for _ in range(runs)]
    say(f"long steps: client CPU {', '.join(f'{run.cpu_s:.3f} s' for run in long_steps)}")
    figures = peer_module.peer_figures(processes, peer_no_ops, floors, changed, peer_changed) if peer else []
    return (figures + live_probe_figures(probes) + deploy_figures(no_ops, processes, parts, changed, crashes,
                                                                  long_steps) + downtime_figures(changed))


@contextmanager
def guest_for_bench(existing: str | None) -> Iterator[manage.Guest]:
    """A guest of this run's own (name bn<pid>), always stopped at the end; or a running one, left running."""
    if existing:
        yield manage.guest(existing)
        return
    name = f"bn{os.getpid()}"[:12]
    say(f"sandbox guest {name}: starting")
    try:
        yield manage.up(name, record=False)
    finally:
        manage.down(name, record=False)
        say(f"sandbox guest {name}: stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per deploy figure and per unchanged-lock figure")
    parser.add_argument("--venv-runs", type=int, default=3, choices=range(1, len(OTHER_FLASHINFER) + 1),
                        help="one-changed-package builds (each a new venv in the guest)")
    parser.add_argument("--guest", help="measure on this running guest (neither started nor stopped here)")
    parser.add_argument("--only", choices=("deploys", "venvs", "models", "page-cache"),
                        help="measure this group of figures only")
    parser.add_argument("--no-peer", action="store_true", help="without pyinfra's figures beside ours")
    parser.add_argument("--quick", action="store_true",
                        help="one run of everything at the smallest sizes (1 MB of weights): checks that it runs")
    options = parser.parse_args(argv)
    if options.quick:
        options.runs, options.venv_runs = 1, 1
    if os.geteuid() != 0:
        say("make bench needs root (the sandbox guest is a systemd-nspawn machine)")
        return 2
    started = time.time()
    with guest_for_bench(options.guest) as guest, tempfile.TemporaryDirectory(prefix="sglang-bench-") as work:
        house = wheelhouse.prepare()
        if not manage.guest_venv_is(guest, house):
            manage.build_guest_venv(guest, house)
        rig = make_rig(guest, Path(work), options.runs)
        peer_module.write_profiles(rig.project.root / "inventory" / "profiles", options.runs)
        wanted = {options.only} if options.only else {"deploys", "venvs", "models", "page-cache"}
        peer_work = None if options.no_peer else Path(work) / "peer"
        figures = measure_deploys(rig, options.runs, peer_work) if "deploys" in wanted else []
        if "venvs" in wanted:
            figures += measure_venvs(rig, house, options.runs, options.venv_runs, Path(work))
        if "models" in wanted:
            figures += measure_models(rig, options.runs, QUICK_SHARD_VALUES if options.quick else MODEL_SHARD_VALUES)
        if "page-cache" in wanted:
            figures += page_cache.measure_pre_read(rig, min(options.runs, 3), page_cache.QUICK_SHARD_VALUES
                                                   if options.quick else page_cache.SHARD_VALUES)
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    say(f"\nmake bench on the sandbox guest ({time.time() - started:.0f} s in all; load average now {load})\n")
    say(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
