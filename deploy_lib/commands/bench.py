"""`invoke bench` and `invoke compare`: SGLang's serving benchmark against the current release, and the
recorded benchmarks of releases side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deploy_lib.deploy.project import Target
from deploy_lib.errors import ConfigError
from deploy_lib.host.benchmark import bench_on_demand
from deploy_lib.host.store import host_lock, read_store_facts
from deploy_lib.host.switch import probe_target
from deploy_lib.profile import LoadedProfile
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote
from deploy_lib.store import Tags
from deploy_lib.throughput import BenchResult, ComparisonRow, compare_releases


def bench_current(target: Target, loaded: LoadedProfile, remote: Remote, environ: Mapping[str, str],
                  progress: Progress) -> BenchResult:
    """`invoke bench`: SGLang's serving benchmark against the current release, recorded in history.

    Under the host's lock: no deploy restarts the server under the benchmark, and its files and history line are
    written like any other change."""
    layout = target.layout(loaded.profile.service.name)
    with host_lock(remote, layout, "benchmark", target.host.name):
        store = read_store_facts(remote, layout)
        record = store.release(store.current) if store.current else None
        if record is None:
            raise ConfigError(f"{target.host.name}: {store.current_problem() or 'no release is deployed'}",
                              "`invoke deploy` first")
        probe = probe_target(layout, record.metadata, environ)
        return bench_on_demand(remote, layout, record.metadata, Tags.from_dict(record.metadata["tags"]),
                               loaded.profile.bench, progress, probe.api_key)


def compare_benchmarks(target: Target, service: str, remote: Remote, releases: Sequence[str],
                       workload_names: Sequence[str] = ()) -> tuple[list[BenchResult], list[ComparisonRow]]:
    layout = target.layout(service)
    return compare_releases(read_store_facts(remote, layout).history, releases, workload_names)
