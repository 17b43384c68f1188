"""model.list: the model revisions on a host."""

from __future__ import annotations

from invoke import Context

from deploy_cli import common, reports
from deploy_cli.options import task


@task(name="list")
def model_list(c: Context, host: str | None = None, inventory: str | None = None, service: str | None = None,
               json: bool = False, verbose: bool = False) -> None:
    """List model revisions in the host's HF caches and pushed versions: size, staged by us, the releases using them."""
    from deploy_lib.commands import host_contents
    common.report_as(json, verbose)
    target = common.target(inventory, host)
    with common.remote(target) as remote:
        common.show(common.run(lambda: host_contents.list_models(target, common.service_name(service), remote)),
                    reports.print_models)
