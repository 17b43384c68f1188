"""`make bench` (router part, issue 15): a rolling deploy (`--serial 1`) of 2 replicas behind the real sglang-router,
with a client sending requests through the router all along: the failed requests (target 0) and the p99 latency the
rollout adds over the same client's p99 before it. Two guests of the bench's own (the router on the first), always
stopped at the end. Figures are printed, never asserted.

    .venv/bin/python -m bench.router [--threads 4] [--steady-s 20] [--quick]
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

from bench.fleet import guests, say
from deploy_lib.commands import deploy as engine
from deploy_lib.deploy.project import Project, resolve_group, resolve_target
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops import dispatch
from deploy_lib.ops.fleet import Rollout
from deploy_lib.ops.router import replica_urls, router_site
from deploy_lib.ops.router_deploy import deploy_router
from deploy_lib.ops.scope import Reach, select
from deploy_lib.progress import NullProgress
from deploy_lib.remote import FabricRemote
from sandbox import manage, names
from sandbox.traffic import Client

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4"
PORT = manage.ROUTER_PORT


def rolling_deploy(project: Project, inventory: Path, profile: str) -> None:
    """`deploy --group sandbox --serial 1` through the library's own operation (deploy_lib.ops.dispatch.deploy, what
    the task calls): each replica behind the router's drain."""
    scope = select(load_inventory(inventory), None, names.GROUP, rollout=Rollout.parse(["1"]))
    reach = Reach(lambda target, _prefixed: FabricRemote(target.ssh), lambda _host: NullProgress(), lambda _q: None)
    fleet = dispatch.deploy(project, scope, profile, engine.Options(), reach)
    failed = {run.host: run.error.message for run in fleet.runs if run.error is not None}
    if failed:
        raise SystemExit(f"bench: a replica's deploy failed: {failed}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=4, help="client threads sending requests through the router")
    parser.add_argument("--steady-s", type=float, default=20.0, help="how long the client runs before the rollout")
    parser.add_argument("--quick", action="store_true", help="1 client thread, 2 s before the rollout: checks it runs")
    options = parser.parse_args(argv)
    if options.quick:
        options.threads, options.steady_s = 1, 2.0
    if os.geteuid() != 0:
        say("the router bench needs root (sandbox guests are systemd-nspawn machines)")
        return 2
    started = time.time()
    with guests(2) as booted, tempfile.TemporaryDirectory(prefix="sglang-bench-router-") as work:
        root = Path(work)
        shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
        (root / "inventory" / "profiles" / "router-bench.yaml").write_text(
            f"extends: {PROFILE}\nenv:\n  BENCH_RUN: router\n")
        inventory = root / "inventory" / "sandbox.yaml"
        inventory.write_text(manage.inventory_text(booted, router=booted[0].name))
        project, known = Project(root), load_inventory(inventory)
        say("deploying the replicas, then the router in front of them (not measured)")
        rolling_deploy(project, inventory, PROFILE)
        targets = resolve_group(known, names.GROUP)
        site = router_site(known, [target.host for target in targets])
        assert site is not None
        router_target = resolve_target(known, site.host.name)
        with FabricRemote(router_target.ssh) as remote:
            deploy_router(site, router_target, remote, replica_urls(project, PROFILE, known, targets), names.GROUP,
                          NullProgress())
        client = Client(f"http://{booted[0].guest_ip}:{PORT}", options.threads)
        steady = client.during(lambda: time.sleep(options.steady_s))
        rollout_started = time.monotonic()
        during = client.during(lambda: rolling_deploy(project, inventory, "router-bench"))
        rollout_s = time.monotonic() - rollout_started
    say(f"\nrolling deploy of 2 replicas behind sglang-router 0.3.2 (--serial 1; {options.threads} client threads; "
        f"{time.time() - started:.0f} s in all; load average {os.getloadavg()[0]:.1f}):")
    say(f"  before the rollout: {len(steady.latencies)} requests in {options.steady_s:.0f} s, "
        f"{len(steady.failures)} failed, p99 {steady.p99_s * 1000:.0f} ms")
    say(f"  during the rollout ({rollout_s:.1f} s): {len(during.latencies) + len(during.failures)} requests, "
        f"{len(during.failures)} failed ({'PASS' if not during.failures else 'MISS'}, target 0), "
        f"p99 {during.p99_s * 1000:.0f} ms")
    say(f"  added p99 latency during the rollout: {(during.p99_s - steady.p99_s) * 1000:+.0f} ms")
    if during.failures:
        say(f"  first failures: {during.failures[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
