"""The host facts read (a host action): fact_batch run through a Remote in one round trip, parsed into HostFacts."""

from __future__ import annotations

from deploy_lib.facts.host import FactRequest, HostFacts, fact_batch, parse_host_facts
from deploy_lib.remote import Remote
from deploy_lib.remote.readings import read


def read_host_facts(remote: Remote, request: FactRequest) -> HostFacts:
    return parse_host_facts(read(remote, fact_batch(request)), request)
