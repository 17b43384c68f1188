"""Where a no-op `invoke deploy`'s own process spends its time, part by part: run as a fresh process (as a user's
command is) that does what the deploy task does, in its order, and prints each part's wall and CPU seconds as JSON.

    python -m bench.noop_parts STARTED INVENTORY PROFILE

STARTED is the caller's time.time() just before it started this process: the interpreter's start is the time until
the first line here runs. Each later part is measured here; what `invoke deploy` adds beyond them (its command line
parse, the output) is the whole process's time minus their sum (bench/run.py prints it).
"""

from __future__ import annotations

import time

ARRIVED = time.time()

import json  # noqa: E402  (the interpreter's start is measured up to the line above)
import os  # noqa: E402
import sys  # noqa: E402

PARTS: list[tuple[str, float, float]] = []


def _mark(name: str, wall_since: float, cpu_since: float) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    PARTS.append((name, wall - wall_since, cpu - cpu_since))
    return wall, cpu


def main(started: float, inventory: str, profile: str) -> dict[str, object]:
    cpu_at_start = time.process_time()  # the interpreter's own start and its site imports, in this process
    wall, cpu = time.perf_counter(), cpu_at_start
    import invoke.program  # noqa: F401  (what the `invoke` command has loaded before it reads tasks.py)

    import tasks
    wall, cpu = _mark("invoke and tasks.py", wall, cpu)
    from deploy_lib.commands import deploy as engine
    from deploy_lib.deploy.project import Project, load_for_host
    from deploy_lib.ops import dispatch, multinode, scope  # noqa: F401  (the deploy task imports them)
    from deploy_lib.progress import NullProgress
    from deploy_lib.remote import FabricRemote
    wall, cpu = _mark("the deploy engine's modules", wall, cpu)
    loaded, target = load_for_host(Project(tasks.CHECKOUT), profile, inventory, None)
    wall, cpu = _mark("profile and inventory", wall, cpu)
    with FabricRemote(target.ssh) as remote:
        remote._connect()  # the connection alone; the deploy reuses it
        wall, cpu = _mark("SSH connection (handshake, host key, auth)", wall, cpu)
        outcome = engine.deploy(loaded, target, remote, NullProgress(), engine.Options(environ=dict(os.environ)))
        wall, cpu = _mark("the deploy itself (round trips, plan)", wall, cpu)
    assert outcome.action == "unchanged", outcome.action
    return {"interpreter": {"wall_s": ARRIVED - started, "cpu_s": cpu_at_start},
            "parts": [{"name": name, "wall_s": w, "cpu_s": c} for name, w, c in PARTS],
            "round_trips": remote.round_trips}


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]), sys.argv[2], sys.argv[3])))
