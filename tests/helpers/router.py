"""Router hosts and their releases, for the router tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from deploy_lib import store
from deploy_lib.facts import host as host_facts
from deploy_lib.host.switch import Transition
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.router import (
    RouterSite,
    build_router_release,
    router_site,
)
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import StoreLayout
from helpers.deploy_plan import target
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.rollback import ScriptedHost

GROUP = """\
all:
  hosts:
    edge: {ansible_host: 192.0.2.9}
  children:
    replicas:
      hosts:
        a: {ansible_host: 192.0.2.2}
        b: {ansible_host: "2001:db8::3"}
      vars: {router: edge, router_port: 31000, router_policy: round_robin%s}
"""


def inventory(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(GROUP % extra)
    return path


def site_of(tmp_path: Path, extra: str = "") -> RouterSite:
    loaded = load_inventory(inventory(tmp_path, extra))
    site = router_site(loaded, loaded.group("replicas"))
    assert site is not None
    return site


def answering(**answers: dict) -> FakeRemote:
    """The router's host: each router action answers its JSON object."""
    remote = FakeRemote()
    for action, answer in answers.items():
        remote.reply(lambda step, action=action: step.name.startswith(f"router: {action}"),
                     stdout=json.dumps(answer) + "\n")
    return remote


def config_of(remote: FakeRemote) -> list[dict]:
    """What each router step asked, from the call appended to the script."""
    calls = [step.stdin.decode().rsplit("run_and_print(", 1)[1] for batch in remote.batches for step in batch]
    return [json.loads(eval(call.rsplit(")", 1)[0])) for call in calls]


class StoppableHost(ScriptedHost):
    """ScriptedHost whose unit reads inactive once `systemctl stop` ran, until it is restarted."""

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results = super().run(batch, on_output)
        if any(step.name == "systemd: stop" for step in batch):
            self.reply(host_facts.FACT_UNIT, stdout="ActiveState=inactive\nSubState=dead\nLoadState=loaded\n",
                       times=1)
        return results


class RouterHost(FakeRemote):
    """The router's host: `current` follows the switch, and each readiness probe answers for the release it names
    (`answers[release]`, a probe snapshot)."""

    def __init__(self, answers: dict[str, dict]) -> None:
        super().__init__()
        self.current, self.answers = "", answers

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        for step in batch:
            if step.name == "switch: temp link":
                self.current = step.argv[-2].removeprefix("releases/")  # type: ignore[union-attr]
        if batch and batch[0].name.startswith("readiness probe"):
            self.reply(batch[0].name, stdout=json.dumps(self.answers[self.current]), times=1)
        return super().run(batch, on_output)

    def switches(self) -> list[str]:
        return [step.argv[-2].removeprefix("releases/") for step in self.ran  # type: ignore[union-attr]
                if getattr(step, "name", "") == "switch: temp link"]

    def history(self) -> list[tuple[str, str, str]]:
        lines = [json.loads(step.stdin) for step in self.ran if getattr(step, "name", "") == "history: append"]
        return [(line["event"], line["outcome"], line["release"]) for line in lines]


def router_releases(tmp_path: Path, healthy_before: bool) -> tuple[store.StoreFacts, object, store.Tags, str]:
    """The router's store with its release for one worker current (recorded healthy, or never), the release for one
    worker more, its tags, and the current one's id."""
    from datetime import UTC, datetime

    from deploy_lib.ops.router import SERVICE
    site, layout = site_of(tmp_path), StoreLayout(SERVICE)
    venv = PurePosixPath("/opt/sglang/sglang-router/venvs/v1")
    old, new = (build_router_release(site, venv, "v1", workers, layout.env_file, "replicas")
                for workers in (["http://192.0.2.2:8000"], ["http://192.0.2.2:8000", "http://192.0.2.3:8000"]))
    tags = {release.id: store.Tags("u@m", "edge", release.id, SERVICE, "v1") for release in (old, new)}
    record = store.ReleaseRecord(old.id, "2026-12-01T00:00:00+00:00",
                                 {**old.metadata, "tags": tags[old.id].as_dict()})
    when = datetime(2026, 12, 1, tzinfo=UTC)
    history = (store.history_entry("deploy", store.HEALTHY, tags[old.id], when),) if healthy_before else ()
    return (store.StoreFacts(current=old.id, releases=(record,), incomplete=(), history=history, lock=None), new,
            tags[new.id], old.id)


def router_run(remote: RouterHost) -> Transition:
    from deploy_lib.ops.router import SERVICE
    from deploy_lib.ops.router_deploy import ROUTER_RELEASE
    return Transition(remote, StoreLayout(SERVICE), target(), RecordingProgress(), {}, grace_s=0,
                      kind=ROUTER_RELEASE)
