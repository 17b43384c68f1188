"""A scripted host holding a recorded history in place of the SSH connection, for the `report` task's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy_lib import store
from helpers.rollback import a_host


def scripted_host(monkeypatch: pytest.MonkeyPatch, history: Path) -> None:
    """A scripted host holding `history` in place of the SSH connection to the default inventory's host."""
    from deploy_lib import remote

    host = a_host()
    host.reply(store.FACT_HISTORY, stdout=history.read_text())

    class Connection:
        def __init__(self, *_: object, **__: object) -> None:
            pass

        def __enter__(self) -> object:
            return host

        def __exit__(self, *_: object) -> None:
            pass

    monkeypatch.setattr(remote, "FabricRemote", Connection)
    monkeypatch.delenv("SGLANG_DEPLOY_INVENTORY", raising=False)
