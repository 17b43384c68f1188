"""`make bench` (fleet part, issue 15): wall time of a changed deploy to 1, 2 and 4 sandbox guests in parallel, the
group deploy's own runner (deploy_lib.ops.fleet.run_hosts over the per-host deploy), on guests of its own that are
always stopped at the end. Target: 4 guests within 1.5x of one. Figures are printed, never asserted.

Every guest is a systemd-nspawn machine on this machine, so N guests share its cores: what grows with N here is CPU
contention (sshd, systemd, the simulated servers' startup), which separate GPU hosts do not share.

    .venv/bin/python -m bench.fleet [--runs 3] [--guests 4]
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
from pathlib import Path

from deploy_lib import deploy as engine
from deploy_lib.inventory import load_inventory
from deploy_lib.ops.fleet import run_hosts
from deploy_lib.progress import NullProgress
from deploy_lib.project import Project, Target, load_for_target, resolve_group
from deploy_lib.remote import FabricRemote
from sandbox import manage, names, wheelhouse

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4"
TARGET_RATIO = 1.5


def say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def guests(count: int) -> Iterator[list[manage.Guest]]:
    """`count` guests of the bench's own over the wheelhouse's venv layer; always stopped."""
    layer = manage.venv_layer(wheelhouse.prepare())
    names = [f"bf{os.getpid()}g{n}"[:12] for n in range(1, count + 1)]
    try:
        yield [manage.up(name, record=False, layers=(layer,)) for name in names]
    finally:
        for name in names:
            manage.down(name, record=False)


def group_deploy(project: Project, inventory: Path, targets: list[Target], profile: str) -> float:
    """One group deploy of `profile` to `targets` in parallel; its wall time. Every host must end deployed."""
    known = load_inventory(inventory)
    loaded = {t.host.name: load_for_target(project, profile, known, t) for t in targets}

    def deploy_one(target: Target) -> engine.Outcome:
        with FabricRemote(target.ssh) as remote:
            return engine.deploy(loaded[target.host.name], target, remote, NullProgress(), engine.Options())
    started = time.monotonic()
    fleet = run_hosts(targets, deploy_one, NullProgress())
    seconds = time.monotonic() - started
    failed = {run.host: run.error.message for run in fleet.runs if run.error is not None}
    if failed:
        raise SystemExit(f"bench: a deploy failed: {failed}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="changed deploys per group size (the median is shown)")
    parser.add_argument("--guests", type=int, default=4, choices=range(2, names.MAX_GUESTS + 1),
                        help="the largest group (sizes 1, 2 and this)")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the fleet bench needs root (sandbox guests are systemd-nspawn machines)")
        return 2
    sizes = sorted({1, 2, options.guests})
    started = time.time()
    with guests(options.guests) as booted, tempfile.TemporaryDirectory(prefix="sglang-bench-fleet-") as work:
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
        say(f"first deploy to {len(everyone)} guests (not measured)")
        group_deploy(project, inventory, everyone, changes.pop())
        figures: dict[int, list[float]] = {size: [] for size in sizes}
        for run in range(options.runs):
            for size in sizes:
                seconds = group_deploy(project, inventory, everyone[:size], changes.pop())
                figures[size].append(seconds)
                say(f"  run {run + 1}: {size} guest(s): {seconds:.1f} s")
    one = statistics.median(figures[1])
    say(f"\nchanged deploy, guests in parallel (median of {options.runs}; {time.time() - started:.0f} s in all; "
        f"load average {os.getloadavg()[0]:.1f}):")
    for size in sizes:
        median = statistics.median(figures[size])
        verdict = "" if size == 1 else \
            f"  {median / one:.2f}x of one ({'PASS' if median / one <= TARGET_RATIO else 'MISS'}, target <= " \
            f"{TARGET_RATIO}x)"
        say(f"  {size} guest(s): {median:5.1f} s{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
