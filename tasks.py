"""The checkout's tasks: every user task of the package (deploy_cli.collection, what `sglang-deploy` runs), plus
the sandbox VMs and the demos, which need this checkout's test rig. `invoke --list` shows them all."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from invoke import Collection, Context, Exit

from deploy_cli import present as ui
from deploy_cli.collection import user_tasks
from deploy_cli.deploy import deploy, rollback
from deploy_cli.inspect import releases, status
from deploy_cli.options import task
from deploy_cli.patches import patch_fusion
from deploy_cli.report import report
from deploy_cli.router import router_deploy
from deploy_cli.tune import tune
from deploy_lib.deploy.project import SANDBOX_INVENTORY
from sandbox import tasks as sandbox_tasks

CHECKOUT = Path(__file__).resolve().parent  # the sandbox's inventory is the checkout's own, wherever invoke runs


def _demo_step(title: str, command: str, action: Callable[[], None]) -> None:
    """One step of the demo: its title, the command a user would type, its output (an expected exit is shown)."""
    ui.console.rule(title)
    ui.console.print(f"$ invoke {command}", markup=False, style="bold")
    try:
        action()
    except Exit as stopped:
        ui.console.print(f"(exit {stopped.code})")


@task
def demo(c: Context) -> None:
    """Our users' week on the sandbox VM: a gated deploy, a fusion release that cannot start, the patched one the gate
    rolls back, a slow release kept without a gate and rolled back by hand, the releases with their figures, a short
    tune sweep that keeps the faster candidate, and the report that draws them."""
    started = time.monotonic()
    sandbox_tasks.up(c, venv=True)  # a running guest keeps its venv when the wheels are the same
    sandbox_tasks.empty(c)  # the story starts on an empty host
    inventory = str(CHECKOUT / SANDBOX_INVENTORY)
    th1 = sandbox_tasks.names.DEFAULT_NAME  # the inventory may list more guests (sandbox.up --count)
    on = {"inventory": inventory, "host": th1, "yes": True}
    _demo_step("1. deploy the reference profile with the throughput gate: the first figures are recorded",
               "deploy --profile glm5-nvfp4-sandbox", lambda: deploy(c, "glm5-nvfp4-sandbox", **on))
    _demo_step("2. status", "status", lambda: status(c, inventory=inventory, host=th1))
    _demo_step("3. fusion on SM120 with the gates unpatched: it cannot start, is rolled back and diagnosed",
               "deploy --profile glm5-nvfp4-fusion", lambda: deploy(c, "glm5-nvfp4-fusion", **on))
    _demo_step("4. the fusion patch set: it starts healthy, the gate measures it slow and rolls it back",
               "patch-fusion --enable --profile glm5-nvfp4-sandbox",
               lambda: patch_fusion(c, enable=True, profile="glm5-nvfp4-sandbox", **on))
    _demo_step("5. the patched release without a gate, as before the gate existed: it stays until rolled back",
               "patch-fusion --enable --profile glm5-nvfp4",
               lambda: patch_fusion(c, enable=True, profile="glm5-nvfp4", **on))
    _demo_step("6. roll back by hand", "rollback", lambda: rollback(c, **on))
    _demo_step("7. releases: outcome, measured throughput and GPU power", "releases",
               lambda: releases(c, inventory=inventory, host=th1))
    _demo_step("8. tune: each candidate a release, benchmarked; the winner kept when it beats the serving release",
               "tune --profile glm5-nvfp4-sandbox --spec tune/demo-sandbox.yaml",
               lambda: tune(c, "glm5-nvfp4-sandbox", spec=str(CHECKOUT / "tune" / "demo-sandbox.yaml"), **on))
    _demo_step("9. the host's story in pictures: throughput per release, power against the limit, start phases",
               "report --out report", lambda: report(c, inventory=inventory, host=th1, out=str(CHECKOUT / "report")))
    ui.console.print(f"demo done in {time.monotonic() - started:.0f} s")


FLEET_GUESTS = 3


@task(name="demo-fleet")
def demo_fleet(c: Context) -> None:
    """A group of three sandbox guests: a parallel deploy to all, then a rolling deploy whose first host fails (rolled
    back on its own) and stops the rollout at --max-fail, leaving the others untouched; the releases of each; then
    SGLang's router in front of them and a rolling deploy behind it with a client running through it (0 failed); one
    multi-node server over the three as one release."""
    started = time.monotonic()
    sandbox_tasks.up(c, count=FLEET_GUESTS, venv=True, router="th1")
    for number in range(1, FLEET_GUESTS + 1):
        sandbox_tasks.empty(c, name=f"th{number}")  # the story starts on empty hosts
    inventory = str(CHECKOUT / SANDBOX_INVENTORY)
    on = {"inventory": inventory, "group": sandbox_tasks.names.GROUP}
    _demo_step("1. one deploy to every guest of group sandbox, in parallel", "deploy --profile glm5-nvfp4 --group "
               "sandbox", lambda: deploy(c, "glm5-nvfp4", yes=True, **on))
    _demo_step("2. a rolling deploy, one host per batch, no failure allowed: fusion cannot start on SM120, so the "
               "first host rolls back and the rollout stops", "deploy --profile glm5-nvfp4-fusion --group sandbox "
               "--serial 1 --max-fail 0", lambda: deploy(c, "glm5-nvfp4-fusion", serial=["1"], max_fail="0",
                                                          yes=True, **on))
    _demo_step("3. releases on each guest", "releases --group sandbox", lambda: releases(c, **on))
    _demo_step("4. SGLang's router (sglang-router) on th1, in front of the three guests", "router.deploy --group "
               "sandbox --profile glm5-nvfp4", lambda: router_deploy(c, profile="glm5-nvfp4", yes=True, **on))
    from sandbox import manage
    from sandbox.traffic import Client
    client = Client(f"http://{manage.guest('th1').guest_ip}:{manage.ROUTER_PORT}")
    traffic = client.during(lambda: _demo_step(
        "5. a rolling deploy behind the router while a client sends requests through it: each replica is taken out "
        "before its restart and added back once verified", "deploy --profile glm5-nvfp4-replica --group sandbox "
        "--serial 1", lambda: deploy(c, "glm5-nvfp4-replica", serial=["1"], yes=True, **on)))
    ui.console.print(f"client: {len(traffic.latencies) + len(traffic.failures)} requests through the router during "
                     f"the rollout, {len(traffic.failures)} failed (p99 {traffic.p99_s * 1000:.0f} ms)")
    _demo_step("6. one server over the three guests (nnodes 3): node 0 waits for the other two at its "
               "--dist-init-addr, one release id on every node", "deploy --profile glm5-nvfp4-3nodes --group sandbox",
               lambda: deploy(c, "glm5-nvfp4-3nodes", yes=True, **on))
    ui.console.print(f"demo-fleet done in {time.monotonic() - started:.0f} s")


ns = user_tasks()
ns.add_task(demo)
ns.add_task(demo_fleet)
ns.add_collection(Collection.from_module(sandbox_tasks), name="sandbox")
