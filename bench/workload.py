"""`make bench` (served traffic, issue 42): one release benchmarked on the default benchmark and on a workload read
from its own live traffic, side by side, on a sandbox guest of its own that is always stopped at the end. Figures
are printed, never asserted.

1. The release (the sandbox profile with features.metrics and the radix cache on, its benchmark sized small) serves
   traffic of a known shape, sent from here at a fixed rate: long prompts (2,400 tokens, the first 1,024 shared by
   every request) and short answers (8 tokens).
2. `workload` reads it over a window into the project's inventory/workloads/served.yaml.
3. The same release is benchmarked twice at the same concurrency levels, as `invoke bench` does: on the profile's
   default benchmark, then with `bench: {workload: served}` (the workload's shape at each level).
4. Each benchmark's table is titled by the benchmark it ran (default, or workload NAME, with its lengths), then one
   table puts them side by side.

    .venv/bin/python -m bench.workload [--window 20] [--rate 8] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.timeline import StampedProgress, say
from bench.tune import serving_rig
from deploy_lib.commands.bench import bench_current
from deploy_lib.commands.workload import HostScrapes, read_host_scrapes, record_workload
from deploy_lib.deploy.project import Target, load_for_host
from deploy_lib.metrics.workload import Workload
from deploy_lib.profile import LoadedProfile
from deploy_lib.remote import FabricRemote
from deploy_lib.throughput import BenchResult
from sandbox.traffic import Paced, Shape

NAME = "served"
PROFILE_TEXT = ("extends: glm5-nvfp4-sandbox\nfeatures:\n  metrics: true\n  radix_cache: true\n"
                "bench:\n  prompts: 64\n  input_len: 32\n  output_len: 32\n  concurrency: [8, 32]\n")
ON_WORKLOAD = "bench-on-workload"
SENT = Shape(2400, 8, shared_tokens=1024)
EVERY_S = 5.0
QUICK_WINDOW_S = 10.0


def read_served(workloads_dir: Path, loaded: LoadedProfile, target: Target, rate: float, window_s: float
                ) -> Workload:
    """The workload the release of `loaded` serves while this sends SENT at `rate` requests a second, written into
    `workloads_dir`."""
    url = f"http://{target.ssh.host}:{loaded.profile.server.port}"
    read: list[HostScrapes] = []
    with FabricRemote(target.ssh) as remote:
        traffic = Paced(url, rate, SENT.body).during(lambda: read.append(read_host_scrapes(
            target, loaded.profile.service.name, remote, window_s, EVERY_S, StampedProgress())))
    say(f"sent {len(traffic.latencies)} requests ({len(traffic.failures)} failed) while `workload` read the release")
    workload, path = record_workload(NAME, read, workloads_dir)
    say(f"written: {path}")
    return workload


def level_table(title: str, result: BenchResult) -> str:
    """One benchmark's levels, under the benchmark it ran."""
    rows = [("concurrency", "completed", "output tok/s", "p99 TTFT", "p99 ITL")]
    rows += [(f"{level.concurrency}", f"{level.completed}", f"{level.output_tok_s:,.1f}",
              _ms(level.ttft.p99_ms), _ms(level.itl.p99_ms)) for level in result.levels]
    return f"{title}\n{_columns(rows)}"


def side_by_side(default: BenchResult, shaped: BenchResult) -> str:
    """Both benchmarks of the release per level; the header names each one's benchmark."""
    label = f"workload {shaped.settings.workload_name}"
    rows = [("concurrency", "default tok/s", f"{label} tok/s", "default p99 TTFT", f"{label} p99 TTFT")]
    for level in default.levels:
        other = shaped.level(level.concurrency)
        rows.append((f"{level.concurrency}", f"{level.output_tok_s:,.1f}",
                     f"{other.output_tok_s:,.1f}" if other else "-", _ms(level.ttft.p99_ms),
                     _ms(other.ttft.p99_ms) if other else "-"))
    return (f"release {default.release_id}, default benchmark and {label}, side by side\n{_columns(rows)}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=20.0, help="seconds `workload` reads the live traffic")
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second sent during the window")
    parser.add_argument("--quick", action="store_true", help=f"a window of {QUICK_WINDOW_S:g} s: checks that it runs")
    options = parser.parse_args(argv)
    if options.quick:
        options.window = QUICK_WINDOW_S
    if os.geteuid() != 0:
        say("make bench needs root (the sandbox guest is a systemd-nspawn machine)")
        return 2
    with serving_rig(PROFILE_TEXT) as (rig, loaded, target):
        workload = read_served(rig.project.workloads_dir, loaded, target, options.rate, options.window)
        say("\n".join(workload.lines()))
        (rig.project.root / "inventory" / "profiles" / f"{ON_WORKLOAD}.yaml").write_text(
            f"extends: {loaded.name}\nbench:\n  workload: {NAME}\n")
        shaped_profile, _ = load_for_host(rig.project, ON_WORKLOAD, rig.inventory, None)
        results = []
        for profile in (loaded, shaped_profile):
            with FabricRemote(target.ssh) as remote:
                results.append(bench_current(target, profile, remote, {}, StampedProgress()))
        default, shaped = results
    failed = [f"{r.settings.workload_name or 'default'}: {r.error}" for r in results if not r.ok]
    if failed:
        say("a benchmark did not run to the end: " + "; ".join(failed))
        return 1
    say("\n" + level_table(f"default benchmark: {default.settings.describe()}", default))
    say("\n" + level_table(shaped.settings.describe(), shaped))  # it starts with "workload NAME: "
    say("\n" + side_by_side(default, shaped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
