"""status, releases, logs, bench, gpu-check: what runs on the hosts and how well; only gpu-check --stop-server and
bench touch the server."""

from __future__ import annotations

import os

from invoke import Context, Exit

from deploy_cli import common, reports
from deploy_cli import present as ui
from deploy_cli.options import task
from deploy_lib.errors import EXIT_CODES, PreflightError


@task
def releases(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
             service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """List the releases on the host with their outcome and measured throughput."""
    from deploy_lib.metrics.workload import recorded_names
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.releases(hosts, common.service_name(service), common.reach(),
                                                 recorded_names(common.project().workloads_dir)))
    common.show_each(fleet, reports.print_releases, hosts.one_host)


@task
def status(c: Context, host: str | None = None, group: str | None = None, inventory: str | None = None,
           service: str | None = None, json: bool = False, verbose: bool = False) -> None:
    """Current release and its age, unit state, readiness, versions, patches and a per-GPU table."""
    from deploy_lib.ops import dispatch
    name = common.service_name(service)
    common.report_as(json, verbose, lambda error: ui.status_failure_json(error, host, name))
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.status(hosts, name, common.reach()))
    common.show_each(fleet, reports.print_status, hosts.one_host)


@task(help={"lines": "number of lines (default 100)", "follow": "keep printing new lines (Ctrl-C stops)"})
def logs(c: Context, lines: int = 100, follow: bool = False, host: str | None = None, group: str | None = None,
         inventory: str | None = None, service: str | None = None, json: bool = False, verbose: bool = False
         ) -> None:
    """Print the server's log from the host's journal."""
    from deploy_lib.commands import logs as host_logs
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    if group is not None and follow:
        raise Exit("error: --follow follows one host's journal: give --host, or --group without --follow",
                   code=common.BAD_OPTION)
    if json and follow:
        raise Exit("error: --json prints one document when the command ends, and --follow does not end: give one",
                   code=common.BAD_OPTION)
    name = common.service_name(service)
    if follow:
        target = common.target(inventory, host)
        with common.remote(target) as remote:
            common.run(lambda: ui.print_lines(host_logs.follow_log(target, name, remote, lines)))
        return
    hosts = common.scope(inventory, host, group)
    fleet = common.run(lambda: dispatch.logs(hosts, name, lines, common.reach()))
    common.show_each(fleet, ui.print_lines, hosts.one_host)


@task(help={"profile": common.IN_USE_HELP + " (its bench settings are used)",
            "compare": "a release id; repeat for two or more: their newest benchmarks side by side (no new run)"},
      iterable=["compare"])
def bench(c: Context, profile: str | None = None, compare: list[str] | None = None, host: str | None = None,
          inventory: str | None = None, service: str | None = None, json: bool = False, verbose: bool = False
          ) -> None:
    """Run SGLang's serving benchmark against the current release and record it (`--compare A --compare B`)."""
    from deploy_lib.commands import bench as host_bench
    from deploy_lib.metrics.workload import recorded_names
    from deploy_lib.throughput import comparison_records
    common.report_as(json, verbose)
    if compare and len(compare) < 2:
        raise Exit("error: --compare takes two release ids or more: --compare A --compare B [--compare C ...]",
                   code=2)
    common.release_ids("--compare", compare or [])
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        loaded = common.profile_in_use(profile, target, remote, service)
        if compare:
            results, rows = common.run(lambda: host_bench.compare_benchmarks(
                target, loaded.profile.service.name, remote, compare, recorded_names(common.project().workloads_dir)))
            common.show({"results": results, "rows": rows, "records": comparison_records(results, rows)},
                        lambda _: reports.print_comparison(results, rows))
            return
        common.show(common.run(lambda: host_bench.bench_current(target, loaded, remote, dict(os.environ),
                                                                 common.progress())), reports.print_bench)


@task(help={"name": "the workload's name: written to inventory/workloads/NAME.yaml (replaced if there)",
            "window": "how long to read the served traffic: 90s, 10m, 1h (default 10m)",
            "every": "how often /metrics is read within the window, for the peak of running requests (default 10s)"})
def workload(c: Context, name: str, window: str = "10m", every: str = "10s", host: str | None = None,
             group: str | None = None, inventory: str | None = None, service: str | None = None, json: bool = False,
             verbose: bool = False) -> None:
    """Read the serving release's traffic from its /metrics over a window and write it as a workload file."""
    from deploy_lib.metrics.workload import check_name, parse_duration
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    checked = common.run(lambda: check_name(name, "--name"))
    window_s = common.run(lambda: parse_duration(window, "--window"))
    every_s = common.run(lambda: parse_duration(every, "--every"))
    hosts = common.scope(inventory, host, group)
    read, path = common.run(lambda: dispatch.workload(common.project(), hosts, common.service_name(service), checked,
                                                      window_s, every_s, common.reach()))
    common.show({"workload": read, "path": str(path)}, lambda _: reports.print_workload(read, path))


@task(iterable=["sizes"], help={
    "profile": "check with this profile's venv, TP size and NCCL environment (default: the current release's)",
    "stop_server": "stop the running server for the check, then restart the current release through the readiness "
                   "ladder",
    "sizes": "an all-reduce size in bytes; repeat for several (default 1 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB)"})
def gpu_check(c: Context, profile: str | None = None, stop_server: bool = False, sizes: list[str] | None = None,
              host: str | None = None, inventory: str | None = None, service: str | None = None, json: bool = False,
              verbose: bool = False) -> None:
    """Prove the host's GPUs and NCCL settings: topology and P2P advice, then an exactly verified all-reduce."""
    from deploy_lib.commands.gpu_check import parse_sizes
    from deploy_lib.ops import dispatch
    common.report_as(json, verbose)
    hosts = common.scope(inventory, host)
    loaded = common.run(lambda: common.project().profile(profile)) if profile else None
    byte_sizes = common.run(lambda: parse_sizes(sizes or []))
    fleet = common.run(lambda: dispatch.gpu_check(hosts, common.service_name(service), loaded, stop_server,
                                                  byte_sizes, common.reach()))
    report = dispatch.one(fleet)
    failed = 0 if report.check.verified else EXIT_CODES[PreflightError]
    common.show(report, reports.print_gpu_check, exit_code=failed)
    if failed:
        raise Exit(code=failed)
