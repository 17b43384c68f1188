"""What a host keeps besides releases: its managed venvs and its model revisions, each with the
releases that use it."""

from __future__ import annotations

from deploy_lib.deploy.project import Target
from deploy_lib.host.models import StoredModel, read_stored
from deploy_lib.host.store import read_store_facts
from deploy_lib.host.venv_lifecycle import VenvRecord, list_venvs
from deploy_lib.remote import Remote
from deploy_lib.venvs import release_venv_hash


def list_managed_venvs(target: Target, service: str, remote: Remote) -> list[VenvRecord]:
    """The host's managed venvs with the releases that use them."""
    layout = target.layout(service)
    store = read_store_facts(remote, layout)
    return list_venvs(remote, layout, {r.id: release_venv_hash(layout, str(r.metadata.get("venv", "")))
                                       for r in store.releases})


def list_models(target: Target, service: str, remote: Remote) -> list[StoredModel]:
    """Model revisions and pushed versions in the places the host's releases keep weights, with their users."""
    store = read_store_facts(remote, target.layout(service))
    return read_stored(remote, store.releases)
