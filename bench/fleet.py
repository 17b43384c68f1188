"""`make bench` (fleet part, issues 15 and 30): a changed deploy, then a no-op, to 1, 2, 4 and 8 sandbox guests in
parallel through the group deploy's own runner (deploy_lib.ops.fleet.run_hosts over the per-host deploy), on guests
of its own that are always stopped at the end. Figures are printed, never asserted.

Every guest is a systemd-nspawn machine on this machine, so N guests share its cores: the simulated servers' start
grows with N here (CPU contention separate GPU hosts do not share). So the figure judged is the tool's own time: the
slowest host's time from the group's start to its end minus its own server start (restart -> "fired up", from its
guest's journal; the grace window after Ready stays in it, the same 2 s at every size). With every host's server
starting as fast, that is the group's wall time minus the start; the group's wall time minus the slowest start,
judged before, is smaller whenever the host that ends last is not the one whose server started slowest (it was the
tool's time of no host). Target 8 hosts <= 1.5x one. Beside it the client's CPU per host (what limits a large fleet
on one core; target <= 0.1 s per host for a no-op), the round trips per host, and where each host's time went.

    .venv/bin/python -m bench.fleet [--runs 3] [--guests 8] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.timeline import Journal, JournalEntry, StampedRemote, ready_instant, restart_instant, say
from deploy_lib.commands import deploy as engine
from deploy_lib.deploy.project import Project, Target, load_for_target, resolve_group
from deploy_lib.errors import DeployError
from deploy_lib.health import Rung
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.fleet import run_hosts
from deploy_lib.progress import NullProgress
from deploy_lib.remote import FabricRemote
from sandbox import manage, names, wheelhouse

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4"
TARGET_RATIO = 1.5
CPU_PER_HOST_S = 0.1
SIZES = (1, 2, 4, 8)


@contextmanager
def guests(count: int) -> Iterator[list[manage.Guest]]:
    """Up to `count` guests of the bench's own over the wheelhouse's venv layer, always stopped; when one cannot
    start (this machine's memory, its load), it says why and yields those that did."""
    layer = manage.venv_layer(wheelhouse.prepare())
    started: list[manage.Guest] = []
    try:
        for name in [f"bf{os.getpid()}g{n}"[:12] for n in range(1, count + 1)]:
            try:
                started.append(manage.up(name, record=False, layers=(layer,)))
            except (DeployError, OSError) as error:  # a partly started guest is stopped below as well
                say(f"guest {len(started) + 1} of {count} did not start ({error}): measuring up to {len(started)}")
                manage.down(name, record=False)
                break
        yield started
    finally:
        for guest in started:
            manage.down(guest.name, record=False)


@dataclass(frozen=True)
class HostPhases:
    """One host's changed deploy, seconds from the group's start: its thread's start and end, the restart and the
    server's "fired up" from its journal, the ends of its last ladder probe and of its last grace probe."""

    began: float
    restarted: float
    ready: float
    noticed: float
    grace_ended: float
    ended: float
    cpu_to_restart: float  # the host's thread's CPU from its start to sending the restart (its SSH thread's aside)

    @property
    def start_s(self) -> float:
        return self.ready - self.restarted

    @property
    def own_s(self) -> float:
        """From the group's start to this host's end, less its server's start."""
        return self.ended - self.start_s


@dataclass(frozen=True)
class GroupRun:
    hosts: int
    seconds: float
    cpu_s: float             # this process's CPU (all threads) over the whole group deploy
    round_trips: int         # all hosts together
    guests_cpu_s: float      # every guest's CPU over it together: sshd, the steps, the servers' stop and start
    phases: tuple[HostPhases, ...] = ()  # a changed deploy's, one per host

    @property
    def slowest_start_s(self) -> float:
        """The slowest host's server start (restart -> fired up); 0 for a no-op."""
        return max((host.start_s for host in self.phases), default=0.0)

    @property
    def own_s(self) -> float:
        """The slowest host's own time (a no-op: the group's wall time)."""
        return max((host.own_s for host in self.phases), default=self.seconds)


def group_deploy(project: Project, inventory: Path, targets: list[Target], profile: str,
                 journals: dict[str, Journal], action: str) -> GroupRun:
    """One group deploy of `profile` to `targets` in parallel; every host must end with `action`."""
    known = load_inventory(inventory)
    loaded = {t.host.name: load_for_target(project, profile, known, t) for t in targets}
    cursors = {t.host.name: journals[t.host.name].cursor() for t in targets}
    remotes: dict[str, StampedRemote] = {}
    spans: dict[str, tuple[float, float, float]] = {}

    def deploy_one(target: Target) -> engine.Outcome:
        remote = remotes[target.host.name] = StampedRemote(FabricRemote(target.ssh))
        began, cpu = time.time(), time.thread_time()
        try:
            return engine.deploy(loaded[target.host.name], target, remote, NullProgress(), engine.Options())
        finally:
            remote.close()
            spans[target.host.name] = (began, time.time(), cpu)
    guests_cpu = sum(manage.cpu_s(journals[t.host.name].guest) for t in targets)
    cpu, started, wall_started = time.process_time(), time.monotonic(), time.time()
    fleet = run_hosts(targets, deploy_one, NullProgress())
    seconds, cpu_s = time.monotonic() - started, time.process_time() - cpu
    guests_cpu = sum(manage.cpu_s(journals[t.host.name].guest) for t in targets) - guests_cpu
    failed = {run.host: run.error.message for run in fleet.runs if run.error is not None}
    if failed:
        raise SystemExit(f"bench: a deploy failed: {failed}")
    actions = {run.host: run.result.action for run in fleet.runs if run.result is not None}
    assert set(actions.values()) == {action}, actions
    phases = tuple(host_phases(remote, journals[host].since(cursors[host]), spans[host], wall_started)
                   for host, remote in remotes.items()) if action == "deployed" else ()
    return GroupRun(len(targets), seconds, cpu_s, sum(remote.inner.round_trips for remote in remotes.values()),
                    guests_cpu, phases)


def host_phases(remote: StampedRemote, entries: Sequence[JournalEntry], span: tuple[float, float, float],
                group_started: float) -> HostPhases:
    [restart] = remote.restarts()
    restarted = restart_instant(entries, restart.started)
    ready = ready_instant(entries, restarted)

    def last_end(probe: str) -> float:
        return max(batch.ended for batch in remote.batches if batch.names == (probe,))
    return HostPhases(span[0] - group_started, restarted - group_started, ready - group_started,
                      last_end(f"readiness probe ({Rung.GENERATE})") - group_started,
                      last_end(f"readiness probe ({Rung.HEALTH})") - group_started, span[1] - group_started,
                      restart.thread_cpu - span[2])


def report(changed: dict[int, list[GroupRun]], no_ops: dict[int, list[GroupRun]]) -> list[str]:
    def median(runs: Sequence[GroupRun], value: str) -> float:
        return statistics.median(getattr(run, value) for run in runs)
    one = median(changed[1], "own_s")
    lines = [f"{'hosts':>5}  {'changed: total':>14}  {'slowest start':>13}  {'own time':>8}  {'of one':>6}  "
             f"{'CPU/host':>8}  {'guest CPU':>9}  {'trips/host':>10}  {'no-op: total':>12}  {'CPU/host':>8}  "
             f"{'trips/host':>10}"]
    for size, runs in changed.items():
        own = median(runs, "own_s")
        quiet = no_ops[size]
        lines.append(f"{size:>5}  {median(runs, 'seconds'):>12.2f} s  {median(runs, 'slowest_start_s'):>11.2f} s  "
                     f"{own:>6.2f} s  {own / one:>5.2f}x  {median(runs, 'cpu_s') / size:>6.3f} s  "
                     f"{median(runs, 'guests_cpu_s') / size:>7.2f} s  "
                     f"{median(runs, 'round_trips') / size:>10.1f}  {median(quiet, 'seconds'):>10.2f} s  "
                     f"{median(quiet, 'cpu_s') / size:>6.3f} s  {median(quiet, 'round_trips') / size:>10.1f}")
    largest = max(changed)
    ratio = median(changed[largest], "own_s") / one
    cpu = median(no_ops[largest], "cpu_s") / largest
    verdict, cpu_verdict = ("PASS" if ratio <= TARGET_RATIO else "MISS"), ("PASS" if cpu <= CPU_PER_HOST_S else "MISS")
    demand = median(changed[largest], "guests_cpu_s") + median(changed[largest], "cpu_s")
    lines.append(f"a changed deploy to {largest} hosts asked {demand:.1f} s of CPU (guests and this process) of this "
                 f"machine's {os.cpu_count()} cores in {median(changed[largest], 'seconds'):.1f} s: guest CPU/host is "
                 "what separate hosts each run on their own")
    lines.append(f"own time, {largest} hosts / one: {ratio:.2f}x ({verdict}, target <= {TARGET_RATIO}x for 8 hosts); "
                 f"no-op client CPU per host at {largest}: {cpu:.3f} s ({cpu_verdict}, target <= {CPU_PER_HOST_S} s)")
    return lines


PHASES = {  # a changed deploy's parts on one host, from HostPhases
    "thread": lambda host: host.began,
    "to restart": lambda host: host.restarted - host.began,
    "server start": lambda host: host.start_s,
    "noticed": lambda host: host.noticed - host.ready,
    "grace": lambda host: host.grace_ended - host.noticed,
    "record": lambda host: host.ended - host.grace_ended,
    "own": lambda host: host.own_s,
}


def phase_report(changed: dict[int, list[GroupRun]]) -> list[str]:
    """Where each host's changed deploy went, median over every host of every run and (after /) the slowest; and the
    CPU every host's thread used before its restart, all hosts together (what one interpreter lock serialises)."""
    lines = [f"{'hosts':>5}  " + "  ".join(f"{name:>13}" for name in PHASES) + "  client CPU to the restarts"]
    for size, runs in changed.items():
        hosts = [host for run in runs for host in run.phases]
        cells = [f"{statistics.median(map(part, hosts)):>5.2f} /{max(map(part, hosts)):>5.2f} s"
                 for part in PHASES.values()]
        serial = statistics.median(sum(host.cpu_to_restart for host in run.phases) for run in runs)
        lines.append(f"{size:>5}  " + "  ".join(cells) + f"  {serial:>24.2f} s")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="changed deploys and no-ops per group size (medians)")
    parser.add_argument("--guests", type=int, default=max(SIZES), choices=range(2, names.MAX_GUESTS + 1),
                        help="the largest group (sizes 1, 2, 4, 8 up to it, and it)")
    parser.add_argument("--quick", action="store_true", help="one run of 1 and 2 guests: checks that it runs")
    options = parser.parse_args(argv)
    if options.quick:
        options.runs, options.guests = 1, 2
    if os.geteuid() != 0:
        say("the fleet bench needs root (sandbox guests are systemd-nspawn machines)")
        return 2
    started = time.time()
    with guests(options.guests) as booted, tempfile.TemporaryDirectory(prefix="sglang-bench-fleet-") as work:
        sizes = sorted({size for size in (*SIZES, options.guests) if size <= len(booted)})
        root = Path(work)
        shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
        changes = [f"fleet-bench-{n}" for n in range(options.runs * len(sizes) + 1)]
        for name in changes:  # each deploy a change: its own env value, so a new release and a restart
            (root / "inventory" / "profiles" / f"{name}.yaml").write_text(
                f"extends: {PROFILE}\nenv:\n  BENCH_RUN: '{name}'\n")
        inventory = root / "inventory" / "sandbox.yaml"
        inventory.write_text(manage.inventory_text(booted))
        project = Project(root)
        everyone = resolve_group(load_inventory(inventory), names.GROUP)
        journals = {guest.name: Journal(guest) for guest in booted}
        say(f"first deploy to {len(everyone)} guests (not measured)")
        group_deploy(project, inventory, everyone, changes.pop(), journals, "deployed")
        changed: dict[int, list[GroupRun]] = {size: [] for size in sizes}
        no_ops: dict[int, list[GroupRun]] = {size: [] for size in sizes}
        for run in range(options.runs):
            for size in sizes:
                profile = changes.pop()
                changed[size].append(group_deploy(project, inventory, everyone[:size], profile, journals, "deployed"))
                no_ops[size].append(group_deploy(project, inventory, everyone[:size], profile, journals, "unchanged"))
                say(f"  run {run + 1}: {size} guest(s): changed {changed[size][-1].seconds:.1f} s (own "
                    f"{changed[size][-1].own_s:.2f} s), no-op {no_ops[size][-1].seconds:.2f} s")
    say(f"\ngroup deploys, guests in parallel (median of {options.runs}; {time.time() - started:.0f} s in all; "
        f"load average {os.getloadavg()[0]:.1f}):")
    for line in report(changed, no_ops):
        say(f"  {line}")
    say("a changed deploy's parts per host (median of the hosts / the slowest; seconds from the group's start to the "
        "thread's start, restart and ready from the guest's journal):")
    for line in phase_report(changed):
        say(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
