"""`make bench` (router part, issue 15): a rolling deploy (`--serial 1`) of 2 replicas behind the real sglang-router,
with a client sending requests through the router all along: the failed requests (target 0) and the p99 latency the
rollout adds over the same client's p99 before it. Two guests of the bench's own (the router on the first), always
stopped at the end. Figures are printed, never asserted.

    .venv/bin/python -m bench.router [--threads 4] [--steady-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from bench.fleet import guests, say
from deploy_lib import deploy as engine
from deploy_lib.fleet import Rollout, run_hosts
from deploy_lib.inventory import load_inventory
from deploy_lib.progress import NullProgress
from deploy_lib.project import Project, Target, load_for_target, resolve_group, resolve_target
from deploy_lib.remote import FabricRemote
from deploy_lib.router import replica_urls, router_site, worker_url
from deploy_lib.router_deploy import behind_router, deploy_router
from sandbox import manage, names, wheelhouse

REPO = Path(__file__).resolve().parents[1]
PROFILE = "glm5-nvfp4"
PORT = 30080


@dataclass
class Client:
    """Requests through the router on `threads` threads, one after another; each one's latency and outcome."""

    url: str
    threads: int
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self) -> None:
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 8}}).encode()
        request = urllib.request.Request(self.url + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
                failure = None if answer.status == 200 else f"HTTP {answer.status}"
        except (urllib.error.URLError, OSError) as error:
            failure = str(error)
        with self.lock:
            if failure:
                self.failures.append(failure)
            else:
                self.latencies.append(time.monotonic() - started)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.one()

    def window(self, action: Callable[[], object]) -> tuple[list[float], list[str]]:
        """The latencies and failures of the requests sent while `action()` ran."""
        self.latencies, self.failures, self.stop = [], [], threading.Event()
        workers = [threading.Thread(target=self.loop) for _ in range(self.threads)]
        for worker in workers:
            worker.start()
        try:
            action()
        finally:
            self.stop.set()
            for worker in workers:
                worker.join(timeout=120)
        return self.latencies, self.failures


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def rolling_deploy(project: Project, inventory: Path, profile: str) -> None:
    """`deploy --group sandbox --serial 1` as tasks.py runs it: each replica behind the router's drain."""
    known = load_inventory(inventory)
    targets = resolve_group(known, names.GROUP)
    site = router_site(known, [target.host for target in targets])
    assert site is not None
    router_target = resolve_target(known, site.host.name)

    def deploy_one(target: Target) -> engine.Outcome:
        loaded = load_for_target(project, profile, known, target)
        with FabricRemote(target.ssh) as remote:
            return behind_router(site, router_target, lambda t: FabricRemote(t.ssh),
                                 worker_url(target.host, loaded.profile.server.port), NullProgress(),
                                 lambda drain: engine.deploy(loaded, target, remote, NullProgress(),
                                                             replace(engine.Options(), before_restart=drain)))
    fleet = run_hosts(targets, deploy_one, NullProgress(), Rollout.parse(["1"]))
    failed = {run.host: run.error.message for run in fleet.runs if run.error is not None}
    if failed:
        raise SystemExit(f"bench: a replica's deploy failed: {failed}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=4, help="client threads sending requests through the router")
    parser.add_argument("--steady-s", type=float, default=20.0, help="how long the client runs before the rollout")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the router bench needs root (sandbox guests are systemd-nspawn machines)")
        return 2
    started = time.time()
    router_wheels = wheelhouse.download_with_dependencies(("sglang-router==0.3.2",))
    with guests(2) as booted, tempfile.TemporaryDirectory(prefix="sglang-bench-router-") as work:
        root = Path(work)
        shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
        (root / "inventory" / "profiles" / "router-bench.yaml").write_text(
            f"extends: {PROFILE}\nenv:\n  BENCH_RUN: router\n")
        house = root / "router-wheels"
        house.mkdir()
        for wheel in (*router_wheels, wheelhouse.download("uv", wheelhouse.UV_VERSION)):
            (house / wheel.name).symlink_to(wheel)
        document = manage.inventory(booted)
        document["all"]["children"][names.GROUP]["vars"] = {
            "router": booted[0].name, "router_port": PORT, "router_policy": "round_robin",
            "router_wheelhouse": str(house)}
        inventory = root / "inventory" / "sandbox.yaml"
        inventory.write_text(yaml.safe_dump(document, sort_keys=False))
        project, known = Project(root), load_inventory(inventory)
        say("replicas and router deployed (not measured)")
        rolling_deploy(project, inventory, PROFILE)
        targets = resolve_group(known, names.GROUP)
        site = router_site(known, [target.host for target in targets])
        assert site is not None
        router_target = resolve_target(known, site.host.name)
        with FabricRemote(router_target.ssh) as remote:
            deploy_router(site, router_target, remote, replica_urls(project, PROFILE, known, targets), names.GROUP,
                          NullProgress())
        client = Client(f"http://{booted[0].guest_ip}:{PORT}", options.threads)
        steady, steady_failed = client.window(lambda: time.sleep(options.steady_s))
        rollout_started = time.monotonic()
        during, failed = client.window(lambda: rolling_deploy(project, inventory, "router-bench"))
        rollout_s = time.monotonic() - rollout_started
    say(f"\nrolling deploy of 2 replicas behind sglang-router 0.3.2 (--serial 1; {options.threads} client threads; "
        f"{time.time() - started:.0f} s in all; load average {os.getloadavg()[0]:.1f}):")
    say(f"  before the rollout: {len(steady)} requests in {options.steady_s:.0f} s, {len(steady_failed)} failed, "
        f"p99 {p99(steady) * 1000:.0f} ms")
    say(f"  during the rollout ({rollout_s:.1f} s): {len(during)} requests, {len(failed)} failed "
        f"({'PASS' if not failed else 'MISS'}, target 0), p99 {p99(during) * 1000:.0f} ms")
    say(f"  added p99 latency during the rollout: {(p99(during) - p99(steady)) * 1000:+.0f} ms")
    if failed:
        say(f"  first failures: {failed[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
