"""Model weights staged as part of the release, on the sandbox VM, from a real hub: the guest's olah (sandbox/hub.py)
serves git repositories made here as hub repos, and the release's venv downloads with huggingface_hub for real."""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.hub_gate import HubGate
from helpers.projects import project_for_guest
from helpers.recording_progress import RecordingProgress
from helpers.waits import STATE_WAIT_S

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.host_contents import list_models
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.errors import Interrupted, PreflightError
from deploy_lib.facts.diagnose import diagnose
from deploy_lib.host.models import StoredModel
from deploy_lib.models import FACT_MODEL, STAGE_MODEL
from deploy_lib.remote import FabricRemote
from sandbox import hub, manage, names

pytestmark = pytest.mark.sandbox
REPO_ID = "tests/tiny"
CACHE = "/root/.cache/huggingface/hub/models--tests--tiny"
PROFILES = {"tiny": f"extends: glm5-nvfp4\nmodel:\n  path: {REPO_ID}\n",
            "tiny-v1": "extends: tiny\nmodel:\n  revision: v1\n"}
BUDGET = 256_000  # bytes of a held file's answer that pass the gate


@dataclass
class CtrlCOnceHeld(RecordingProgress):
    """At the first progress line of a transfer, waits until `held()` says the download is where the test wants it
    (its answer, True or False, kept in `was_held`), then sends this process SIGINT: Ctrl-C, as a terminal sends it.
    The progress callback runs in the connection's output thread; the signal lands in the main thread."""

    held: Callable[[], bool] = lambda: True
    was_held: bool | None = None

    def transfer(self, text: str) -> None:
        if not self.of_kind("transfer"):
            self.was_held = self.held()
            os.kill(os.getpid(), signal.SIGINT)
        super().transfer(text)


class CountingRemote(FabricRemote):
    """A FabricRemote that keeps, per batch, its step names and the round trips it took."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trips: list[tuple[tuple[str, ...], int]] = []

    def run(self, batch, on_output=None):  # type: ignore[no-untyped-def]
        before = self.round_trips
        try:
            return super().run(batch, on_output)
        finally:
            self.trips.append((tuple(step.name for step in batch), self.round_trips - before))


@dataclass
class ModelRig:
    guest: manage.Guest
    project: Project
    inventory: str
    first_commit: str = ""
    trips: list[tuple[tuple[str, ...], int]] = field(default_factory=list)

    def deploy(self, profile: str, progress: RecordingProgress | None = None,
               inventory: str | None = None) -> engine.Outcome:
        loaded, target = load_for_host(self.project, profile, inventory or self.inventory, None)
        with CountingRemote(target.ssh) as remote:
            try:
                return engine.deploy(loaded, target, remote, progress or RecordingProgress(), engine.Options())
            finally:
                self.trips = remote.trips

    def root(self, command: str) -> str:
        return manage.run_on(self.guest, command, user="root")

    def current(self) -> str:
        return self.root("readlink /opt/sglang-deploy/sglang/current").strip().removeprefix("releases/")

    def serving(self) -> bool:
        return self.root("systemctl is-active sglang.service || true").strip() == "active"

    def running(self, what: str) -> list[str]:
        """The running server's `cmdline` or `environ` from /proc: what the unit's launcher exec'd."""
        return self.root(f"cat /proc/$(systemctl show -p MainPID --value sglang.service)/{what}").split("\0")

    def snapshot(self, commit: str) -> set[str]:
        return set(self.root(f"ls {CACHE}/snapshots/{commit} 2>/dev/null || true").split())

    def commit(self, message: str, files: dict[str, bytes], tag: str | None = None) -> str:
        return hub.commit(self.guest.hub, REPO_ID, files, message, tag=tag)

    def stored(self) -> list[StoredModel]:
        """What `invoke model.list` shows of the test repo's revisions in the guest's cache."""
        _, target = load_for_host(self.project, "tiny", self.inventory, None)
        with FabricRemote(target.ssh) as remote:
            stored = list_models(target, "sglang", remote)
        return [item for item in stored if item.kind == "hub" and item.name == REPO_ID]

    def inventory_with(self, name: str, **host_vars: str) -> str:
        """An inventory file like the rig's whose guest has these host vars too (hf_home, hf_endpoint...)."""
        data = manage.inventory([self.guest])
        data["all"]["children"][names.GROUP]["hosts"][self.guest.name].update(host_vars)
        path = Path(self.inventory).with_name(f"{name}.yaml")
        path.write_text(json.dumps(data))
        return str(path)

    def wait_on_guest(self, condition: str) -> bool:
        """Whether the shell `condition` came true on the guest, looked at every 0.1 s (within waits.STATE_WAIT_S)."""
        loop = f"until {condition}; do sleep 0.1; done"
        return self.root(f"timeout {STATE_WAIT_S} sh -c {shlex.quote(loop)} && echo yes || echo no").strip() == "yes"


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRig]:
    project, inventory = project_for_guest(tmp_path_factory.mktemp("project"), sandbox_venv, PROFILES)
    rig = ModelRig(sandbox_venv, project, inventory)
    rig.root(f"rm -rf {CACHE}")
    rig.first_commit = rig.commit("first", hub.stand_in_files(REPO_ID), tag="v1")
    yield rig


def staged_note(outcome: engine.Outcome) -> str:
    assert outcome.plan is not None
    return next(note for note in outcome.plan.notes if note.startswith(f"model {REPO_ID}"))


def test_first_stage_downloads_the_files_the_server_loads_then_a_redeploy_is_one_round_trip(rig: ModelRig) -> None:
    progress = RecordingProgress()
    outcome = rig.deploy("tiny", progress)
    assert outcome.action == "deployed" and rig.current() == outcome.release_id and rig.serving()
    assert outcome.plan is not None
    commit = outcome.plan.release.model["commit"]
    assert commit == rig.first_commit
    assert rig.snapshot(commit) == {"config.json", "tokenizer_config.json", "model.safetensors.index.json",
                                    "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert "model" in outcome.timings and progress.of_kind("transfer")
    argv = rig.running("cmdline")
    assert argv[argv.index("--revision") + 1] == commit and argv[argv.index("--model-path") + 1] == REPO_ID
    assert "HF_HUB_OFFLINE=1" in rig.running("environ")
    again = rig.deploy("tiny")
    assert again.action == "unchanged" and "model" not in again.timings
    # the model's plan shares the facts' round trip, and nothing is staged
    assert [trips for names, trips in rig.trips if FACT_MODEL in names] == [1]
    assert not any(STAGE_MODEL in names for names, _ in rig.trips)


def test_a_new_commit_is_a_visible_change_and_only_the_changed_file_travels(rig: ModelRig) -> None:
    before = rig.deploy("tiny")
    assert before.plan is not None
    first = before.plan.release.model["commit"]
    changed = hub.stand_in_files(REPO_ID, shard_values=(2048, 3000), seed=7)
    second = rig.commit("new second shard", {"model-00002-of-00002.safetensors":
                                            changed["model-00002-of-00002.safetensors"]})
    outcome = rig.deploy("tiny")
    assert outcome.action == "deployed" and outcome.plan is not None
    assert f"~ model commit: {first} -> {second}" in [str(change) for change in outcome.plan.changes]
    size = len(changed["model-00002-of-00002.safetensors"])
    assert f"5 of 5 files to stage, {size / 1000:.1f} KB to download" in staged_note(outcome)  # 4 only linked
    tagged = rig.deploy("tiny-v1")
    assert tagged.plan is not None and tagged.plan.release.model["commit"] == first
    assert "to stage" not in " ".join(tagged.plan.notes)  # v1's files are all in the cache


def test_a_pinned_commit_staged_before_deploys_while_the_hub_is_down(rig: ModelRig) -> None:
    first = rig.deploy("tiny-v1")
    assert first.plan is not None
    commit = first.plan.release.model["commit"]
    (rig.project.root / "inventory" / "profiles" / "tiny-pinned.yaml").write_text(
        f"extends: tiny\nmodel:\n  revision: {commit}\nenv:\n  OMP_NUM_THREADS: '2'\n")
    hub.stop(rig.guest.hub)
    try:
        with pytest.raises(PreflightError, match=r"cannot plan model tests/tiny at main from http://") as refused:
            rig.deploy("tiny")
        assert "current release keeps serving" in (refused.value.hint or "")
        assert rig.current() == first.release_id and rig.serving()
        pinned = rig.deploy("tiny-pinned")
        assert pinned.action == "deployed" and rig.serving()
    finally:
        hub.start(rig.guest.name, rig.guest.host_ip)


def test_a_disk_too_small_for_the_download_is_refused_before_anything_changes(rig: ModelRig) -> None:
    serving = rig.deploy("tiny").release_id
    rig.root("mkdir -p /mnt/tiny-hf && (mountpoint -q /mnt/tiny-hf || mount -t tmpfs -o size=64m tmpfs /mnt/tiny-hf)")
    inventory = rig.inventory_with("small-disk", hf_home="/mnt/tiny-hf")
    releases_before = rig.root("ls /opt/sglang-deploy/sglang/releases")
    try:
        with pytest.raises(PreflightError, match=r"still to download into /mnt/tiny-hf, but only 6\d\.\d MB is free"):
            rig.deploy("tiny", inventory=inventory)
    finally:
        rig.root("umount /mnt/tiny-hf")
    assert rig.current() == serving and rig.root("ls /opt/sglang-deploy/sglang/releases") == releases_before


def test_an_interrupted_download_leaves_the_old_release_serving_and_resumes(rig: ModelRig) -> None:
    """Ctrl-C while the download is held half done: the hub's answer for the big shard stops after BUDGET bytes at a
    gate (hub_gate.py) once the small shard is complete, so the download can neither finish nor fail first."""
    serving = rig.deploy("tiny").release_id
    big = hub.safetensors("big.weight", 500_000, seed=3)  # 2 MB, of which BUDGET passes the gate
    small = hub.safetensors("small.weight", 20_000, seed=4)
    commit = rig.commit("bigger shards", {"model-00001-of-00002.safetensors": small,
                                          "model-00002-of-00002.safetensors": big})
    small_linked = f"[ -e {CACHE}/snapshots/{commit}/model-00001-of-00002.safetensors ]"
    with HubGate(rig.guest.hub, "model-00002-of-00002.safetensors", BUDGET) as gate:
        ctrl_c = CtrlCOnceHeld(held=lambda: gate.holding.wait(STATE_WAIT_S) and rig.wait_on_guest(small_linked))
        with pytest.raises(Interrupted, match="before the switch; nothing was switched or restarted"):
            rig.deploy("tiny", ctrl_c, inventory=rig.inventory_with("gated-hub", hf_endpoint=gate.endpoint))
        assert ctrl_c.was_held, "the download never reached the gate with the small shard complete"
        assert rig.current() == serving and rig.serving()
        assert rig.root("ls /opt/sglang-deploy/sglang/lock 2>/dev/null || true").strip() == ""
        # the download stops at its next progress line (each second), once the connection is gone
        assert rig.wait_on_guest("! pgrep -f 'model_stage[.]py' >/dev/null"), "the download still runs"
        assert rig.root(f"ls {CACHE}/blobs | grep -c '[.]incomplete$' || true").strip() == "1"  # the big shard's
    # the half-staged revision is the tool's (staged, so a prune removes it should the deploy never be resumed)
    assert [(item.staged, item.releases) for item in rig.stored() if item.version == commit] == [(True, ())]
    resumed = rig.deploy("tiny")
    assert resumed.action == "deployed" and rig.serving()
    assert resumed.plan is not None and resumed.plan.release.model["commit"] == commit
    # the small shard finished before Ctrl-C and is not fetched again; the unfinished big one is
    assert f"{len(big) / 10**6:.1f} MB to download" in staged_note(resumed)
    assert rig.root(f"ls {CACHE}/blobs | grep -c '[.]incomplete$' || true").strip() == "0"


def test_the_simulator_refuses_to_start_offline_without_the_weights(rig: ModelRig) -> None:
    command = (f"HF_HUB_OFFLINE=1 HF_HOME=/tmp/no-such-cache timeout {STATE_WAIT_S} /opt/ml-env/bin/python -m "
               "sglang.launch_server --model-path tests/not-staged --tp-size 1 --port 8123 2>&1; echo exit=$?")
    output = rig.root(command)
    assert "exit=1" in output and "couldn't find them in the cached files" in output
    assert diagnose(output.splitlines()).signature == "model_not_found_offline"


def test_an_rsync_source_is_pushed_into_a_version_directory_and_only_changed_files_travel(
        rig: ModelRig, tmp_path: Path) -> None:
    local = tmp_path / "weights"
    local.mkdir()
    for name, data in hub.stand_in_files("pushed/tiny").items():
        (local / name).write_bytes(data)
    (rig.project.root / "inventory" / "profiles" / "pushed.yaml").write_text(
        f"extends: glm5-nvfp4\nmodel:\n  path: /srv/models/tiny\n  source: {{rsync: {local}}}\n")
    first = rig.deploy("pushed")
    assert first.action == "deployed" and first.plan is not None and rig.serving()
    version = first.plan.release.model["path"]
    argv = rig.running("cmdline")
    assert version.startswith("/srv/models/tiny/") and argv[argv.index("--model-path") + 1] == version
    assert set(rig.root(f"ls {version}").split()) == {p.name for p in local.iterdir()}
    shard = hub.safetensors("layer1.weight", 5000, seed=9)
    (local / "model-00002-of-00002.safetensors").write_bytes(shard)
    second = rig.deploy("pushed")
    assert second.action == "deployed" and second.plan is not None and rig.serving()
    newer = second.plan.release.model["path"]
    assert newer != version and f"1 of 6 files to stage, {len(shard) / 1000:.1f} KB to push" in " ".join(
        second.plan.notes)
    inodes = rig.root(f"stat -c %i {version}/config.json {newer}/config.json").split()
    assert inodes[0] == inodes[1]  # the unchanged file is a hard link to the earlier version's
    assert rig.deploy("pushed").action == "unchanged"


def test_model_list_shows_revisions_and_pruning_removes_what_no_kept_release_runs(rig: ModelRig) -> None:
    """Whatever the earlier tests left in the cache (revisions their deploys staged, whole or in part): two deploys
    that keep 2 releases leave exactly the revisions those two run, v1 and a main of this test's own."""
    main = rig.commit("the list test's own main", {"README.md": b"A commit of the model list test.\n"})
    (rig.project.root / "inventory" / "profiles" / "tiny-keep2.yaml").write_text(
        "extends: tiny\nservice:\n  keep_releases: 2\n")
    (rig.project.root / "inventory" / "profiles" / "tiny-v1-keep2.yaml").write_text(
        "extends: tiny-v1\nservice:\n  keep_releases: 2\n")
    rig.deploy("tiny-v1-keep2")
    rig.deploy("tiny-keep2")
    hub_revisions = rig.stored()
    assert hub_revisions and all(item.staged and item.releases for item in hub_revisions), hub_revisions
    assert {item.version for item in hub_revisions} == {rig.first_commit, main}
    assert set(rig.root(f"ls {CACHE}/snapshots").split()) == {rig.first_commit, main}
