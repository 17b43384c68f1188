"""An inventory of fake hosts and the releases installed on them, for the operations tests."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from deploy_lib import store
from deploy_lib.errors import ConfigError
from deploy_lib.facts import host as host_facts
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.fleet import Rollout
from deploy_lib.ops.scope import Reach, Scope, select
from deploy_lib.store import StoreLayout
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress

HOSTS = """\
all:
  vars: {gpu_count: 8}
  hosts:
    edge: {ansible_host: 192.0.2.9}
  children:
    pair:
      hosts:
        n1: {ansible_host: 192.0.2.11}
        n2: {ansible_host: 192.0.2.12}
    replicas:
      hosts:
        a: {ansible_host: 192.0.2.2}
        b: {ansible_host: 192.0.2.3}
      vars: {router: edge, router_port: 31000}
"""


TAGS = {"who": "u@m", "host": "h", "release": "r1", "profile": "p", "profile_hash": "x", "versions": {}}


def release(release_id: str, nnodes: int = 1, node_rank: int = 0) -> dict[str, Any]:
    return {"id": release_id, "tags": TAGS | {"release": release_id}, "venv": "/opt/ml-env",
            "profile": {"server": {"port": 8000}, "parallel": {"tp": 4, "nnodes": nnodes, "node_rank": node_rank,
                                                               "dist_init_addr": "192.0.2.11:5000"}}}


def installed(*releases: dict[str, Any]) -> FakeRemote:
    """A host whose store holds `releases`, the last one current and its unit running."""
    layout = StoreLayout("sglang")
    ids = [r["id"] for r in releases]
    return (FakeRemote()
            .reply(store.FACT_LOCK, exit_code=1)
            .reply(store.FACT_CURRENT, stdout=f"releases/{ids[-1]}\n")
            .reply(store.FACT_RELEASE_DIRS, stdout="".join(f"{i}\0" + "".join(f"{i}/{name}\0" for name in (
                store.RELEASE_FILE, store.UNIT_FILE, store.ENV_FILE)) for i in ids))
            .reply(store.FACT_RELEASE_FILES, stdout="".join(f"{layout.releases}/{r['id']}/release.json\0"
                                                            f"{json.dumps(r)}\n" for r in releases))
            .reply("router: serving release", stdout=json.dumps(releases[-1]))
            .reply(host_facts.FACT_UNIT, stdout="ActiveState=active\nSubState=running\nLoadState=loaded\n"))


class Hosts:
    """The fake hosts by name, reached as ops.scope.Reach reaches them; records the consent questions."""

    def __init__(self, **remotes: FakeRemote) -> None:
        self.remotes = remotes
        self.asked: list[str] = []
        self.connected: list[str] = []

    def reach(self, agree: bool = True) -> Reach:
        def connect(target: Any, prefixed: bool) -> Any:
            self.connected.append(target.host.name)
            return nullcontext(self.remotes[target.host.name])

        def consent(question: str) -> None:
            self.asked.append(question)
            if not agree:
                raise ConfigError("cancelled: nothing was changed")
        return Reach(connect, lambda host: RecordingProgress(), consent, {})


def scope(tmp_path: Path, host: str | None = None, group: str | None = None, rollout: Rollout | None = None
          ) -> Scope:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS)
    return select(load_inventory(path), host, group, rollout=rollout)
