"""The host facts read (a host action): fact_batch run through a Remote in one round trip, parsed into HostFacts."""

from __future__ import annotations

from collections.abc import Sequence

from deploy_lib.facts.host import HostFacts, fact_batch, parse_host_facts
from deploy_lib.facts.readings import read
from deploy_lib.remote import Remote, Step
from deploy_lib.store import StoreLayout


def read_host_facts(remote: Remote, layout: StoreLayout, venv: str | None, port: int | None,
                    cuda_home: str | None = None, working_directory: str | None = None,
                    model_steps: Sequence[Step] = (), release_id: str | None = None,
                    write_caches: bool = True) -> HostFacts:
    readings = read(remote, fact_batch(layout, venv, port, cuda_home, working_directory, model_steps, release_id,
                                       write_caches))
    return parse_host_facts(readings, layout, venv, port, cuda_home, working_directory, model_steps, release_id,
                            write_caches)
