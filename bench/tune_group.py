"""`make bench` (tune part, issue 26): one sweep of four candidates on one sandbox guest, then the same sweep over a
group of two guests (`tune --group`: two candidates each, at once), on guests of its own that are always stopped
at the end. The figure is the group's wall time over the one host's (about half: each guest benchmarks the base
once and runs its two candidates, both at once, and the group decides once, where the one host benchmarks the base
twice and re-runs its top two when they are within the noise), with each side's benchmark count and each host's
phases. Printed, never asserted.

Both guests share this machine's cores, so the simulated servers and the benchmark clients of two hosts compete for
CPU where two GPU hosts would not: the group's ratio here is an upper bound of what separate hosts see.

    .venv/bin/python -m bench.tune_group [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.fleet import guests
from bench.timeline import StampedProgress, say
from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import deploy as engine
from deploy_lib.commands.tune import tune
from deploy_lib.commands.tune_request import Request
from deploy_lib.deploy.project import Project, load_for_target, resolve_group
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.scope import Reach, Scope
from deploy_lib.ops.tune_group import GroupTune, tune_group
from deploy_lib.patches import list_patch_sets
from deploy_lib.progress import NullProgress
from deploy_lib.remote import FabricRemote
from deploy_lib.tune import TuneReport, sweep_spec
from sandbox import manage, names

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4-sandbox"
TOKENIZER = "/opt/sim-tokenizer"
# four caps above the pre-sweep release's 64; a short benchmark at one level keeps each run a few seconds
VARY = ("memory.max_running_requests=128,256,512,1024",)
SPEC = {"bench": {"tokenizer": TOKENIZER, "prompts": 256, "input_len": 32, "output_len": 32, "timeout_s": 300},
        "ladder": [256], "keep": "none"}
# two hosts take half the candidates each; the judged bound leaves room for a switch's overhead per host
GROUP_RATIO_MOST = 0.6


def _request() -> Request:
    spec, sources = sweep_spec(None, VARY, SPEC)
    return Request(spec, sources, tuple(list_patch_sets(ROLES_DIR)), dict(os.environ))


def benchmarks(progress: StampedProgress) -> int:
    """The host's benchmarks (the base's, the candidates', any re-run): the sweep's most of its time."""
    return sum(kind == "phase" and text == "benchmark" for _, kind, text in progress.events)


def timeline(title: str, started: float, hosts: dict[str, StampedProgress]) -> None:
    """Each host's phases (seconds since the sweep started, and how long until that host's next event)."""
    say(f"  {title}:")
    for name, progress in hosts.items():
        stamps = [(at, text) for at, kind, text in progress.events if kind == "phase"]
        ends = [at for at, _, _ in progress.events]
        for (at, text), nxt in zip(stamps, [*[at for at, _ in stamps[1:]], max(ends, default=started)], strict=True):
            say(f"    {name or 'group'} {at - started:7.1f} s +{nxt - at:5.1f} s  {text}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the same (one sweep each): checks that it runs")
    parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the tune bench needs root (sandbox guests are systemd-nspawn machines)")
        return 2
    with guests(2) as booted, tempfile.TemporaryDirectory(prefix="sglang-bench-tune-") as work:
        if len(booted) < 2:
            say("the tune bench needs two guests")
            return 2
        root = Path(work)
        shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
        (root / "inventory" / "profiles" / "tune-bench-64.yaml").write_text(
            f"extends: {PROFILE}\nmemory:\n  max_running_requests: 64\n")
        inventory = root / "inventory" / "sandbox.yaml"
        inventory.write_text(manage.inventory_text(booted))
        project = Project(root)
        known = load_inventory(inventory)
        targets = resolve_group(known, names.GROUP)
        for guest in booted:
            manage.run_on(guest, f"/opt/ml-env/bin/python -m sglang_sim.tokenizer {TOKENIZER}")
        loaded = load_for_target(project, PROFILE, known, targets[0])

        def serve_64() -> None:  # the pre-sweep release on every guest
            for target in targets:
                with FabricRemote(target.ssh) as remote:
                    engine.deploy(load_for_target(project, "tune-bench-64", known, target), target, remote,
                                  NullProgress(), engine.Options(skip_gate=True))
        serve_64()
        say(f"one host: {len(VARY[0].split(','))} candidates")
        one_progress = StampedProgress()
        one_at, started = time.time(), time.monotonic()
        with FabricRemote(targets[0].ssh) as remote:
            one = tune(loaded, targets[0], remote, one_progress, _request())
        one_s = time.monotonic() - started
        assert isinstance(one, TuneReport) and one.finished, one
        serve_64()
        say("a group of two: the same candidates, two each at once")
        stamped: dict[str, StampedProgress] = {}
        reach = Reach(lambda target, prefixed: FabricRemote(target.ssh),
                      lambda name: stamped.setdefault(name, StampedProgress()), lambda question: None,
                      dict(os.environ))
        two_at, started = time.time(), time.monotonic()
        two = tune_group(Scope(known, tuple(targets), names.GROUP), loaded, _request(), reach)
        two_s = time.monotonic() - started
        assert isinstance(two, GroupTune) and two.report.finished and not two.parts.failed, two
    say(f"\ntune, {len(one.rows)} candidates (load average {os.getloadavg()[0]:.1f}):")
    ratio = two_s / one_s
    say(f"  one host: {one_s:.1f} s; a group of two: {two_s:.1f} s; group / one host: {ratio:.2f}x "
        f"({'PASS' if ratio <= GROUP_RATIO_MOST else 'MISS'}, target <= {GROUP_RATIO_MOST}x: two hosts halve the "
        "candidates, each switch's overhead on top)")
    say(f"  benchmarks run: one host {benchmarks(one_progress)}; the group's hosts "
        f"{', '.join(str(benchmarks(progress)) for name, progress in stamped.items() if name)}")
    timeline("one host", one_at, {targets[0].host.name: one_progress})
    timeline("a group of two", two_at, stamped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
