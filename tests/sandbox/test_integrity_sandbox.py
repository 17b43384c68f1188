"""Operator faults on the sandbox guest (issue 10): damaged or missing release files, a venv gone under a release,
a full disk while writing the env file, and a venv build racing a deploy that prunes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import TEST_PROFILES, Rig

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.releases import list_releases
from deploy_lib.deploy import plan
from deploy_lib.deploy.project import load_for_host
from deploy_lib.errors import LockHeld, PreflightError, ReadinessFailed, StepFailed
from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
from sandbox import manage, wheelhouse

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
STORE = "/opt/sglang-deploy/sglang"
SECRET = "hunter2-never-shown"
PROFILES = {
    **TEST_PROFILES,
    "glm5-omp6": "extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '6'\n",
    "glm5-omp2": "extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '2'\n",
    "glm5-secret": "extends: glm5-nvfp4\nsecrets:\n  HF_TOKEN: {env: A2_TEST_TOKEN}\n",
}


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return Rig.on(sandbox_venv, tmp_path_factory, PROFILES)


def invoke_status(rig: Rig) -> str:
    done = subprocess.run([sys.executable, "-m", "invoke", "status", "--inventory", rig.inventory], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_damaged_release_is_listed_refused_as_a_rollback_target_and_pruned_by_name(rig: Rig, healthy: str) -> None:
    """Input tried: garbage in an older release's release.json (`{garbage`)."""
    newer = rig.deploy("glm5-omp4").release_id
    rig.write(f"{STORE}/releases/{healthy}/release.json", "{garbage\n")
    with rig.connect() as (target, remote):
        rows = {row.id: row for row in list_releases(target, "sglang", remote)}
    assert rows[healthy].outcome.startswith("damaged (release.json is not valid JSON (")
    with pytest.raises(PreflightError, match=rf"release {healthy}: it is damaged: release\.json is not valid JSON"
                                             rf".*in {STORE}/releases/{healthy}"):
        rig.rollback(healthy)
    assert rig.current() == newer and rig.unit_state() == "active"
    progress = RecordingProgress()
    rig.deploy("glm5-omp6", progress)
    notes = " ".join(str(note) for note in progress.of_kind("note"))
    assert f"damaged release {healthy} (release.json is not valid JSON" in notes
    assert healthy not in rig.release_dirs()
    prunes = [line for line in rig.history() if line["event"] == "prune"]
    assert f"damaged release {healthy} (release.json is not valid JSON" in str(prunes[-1]["cause"])


def test_status_says_when_the_current_release_is_damaged_or_missing(rig: Rig, healthy: str) -> None:
    """Input tried: release.json of the current release replaced by a JSON list; then its directory moved away."""
    release_dir = f"{STORE}/releases/{healthy}"
    saved = rig.root(f"cat {release_dir}/release.json")
    try:
        rig.write(f"{release_dir}/release.json", "[1, 2]\n")
        report = rig.status()
        assert report.current_problem == f"current release {healthy} is damaged: release.json is not a JSON object"
        shown = invoke_status(rig)
        assert f"current release {healthy} is damaged: release.json is not a JSON object" in shown
        assert "None" not in shown
    finally:
        rig.write(f"{release_dir}/release.json", saved)
    rig.root(f"mv {release_dir} /root/moved-{healthy}")
    try:
        shown = invoke_status(rig)
        assert f"current release {healthy} is missing: its directory releases/{healthy} is gone" in shown
        assert "None" not in shown
    finally:
        rig.root(f"mv /root/moved-{healthy} {release_dir}")


class BeforeBatch:
    """A Remote that runs `action` once, just before the first step for which `when` is true (splitting its batch)."""

    def __init__(self, inner: FabricRemote, when: Callable[[Step | Put], bool], action: Callable[[], object]) -> None:
        self.inner, self.when, self.action, self.done = inner, when, action, False

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        index = next((i for i, step in enumerate(batch) if self.when(step)), None)
        if self.done or index is None:
            return self.inner.run(batch, on_output)
        results = self.inner.run(batch[:index], on_output) if index else []
        self.action()
        self.done = True
        return results + self.inner.run(batch[index:], on_output)

    def close(self) -> None:
        self.inner.close()


def test_a_venv_gone_before_the_restart_is_diagnosed_and_rolled_back(rig: Rig, healthy: str) -> None:
    """Input tried: the release's venv (a copy of /opt/ml-env) deleted between preflight and the restart."""
    rig.root("rm -rf /opt/ml-env-doomed && cp -al /opt/ml-env /opt/ml-env-doomed")
    loaded, target = rig.target("glm5-short")
    with FabricRemote(target.ssh) as inner, pytest.raises(ReadinessFailed) as caught:
        remote = BeforeBatch(inner, lambda step: step.name.startswith("switch:"),
                             lambda: rig.root("rm -rf /opt/ml-env-doomed"))
        engine.deploy(loaded, target, remote, RecordingProgress(), engine.Options(),
                      patched=engine.PatchedVenv(plan.VenvChoice("/opt/ml-env-doomed")))
    message = str(caught.value)
    assert "the release's venv is gone: /opt/ml-env-doomed/bin/python3 does not exist" in message
    assert f"release {healthy} is serving" in message
    assert rig.current() == healthy and rig.unit_state() == "active"


def test_a_full_disk_while_writing_the_env_file_shows_the_os_error_and_never_the_secret(
        rig: Rig, healthy: str, tmp_path: Path) -> None:
    """Input tried: deploy_root on a 100 MiB tmpfs that fills up just before the env file (with a secret) is put."""
    rig.root("mkdir -p /srv/a2full && mount -t tmpfs -o size=100m tmpfs /srv/a2full")
    try:
        inventory = tmp_path / "full.yaml"
        inventory.write_text(Path(rig.inventory).read_text().replace(
            "  vars:\n", "  vars:\n    deploy_root: /srv/a2full/store\n", 1))
        # a service of its own: the guest's sglang.service belongs to the other store (deploying over it is exit 9)
        (rig.project.profiles_dir / "glm5-secret-full.yaml").write_text(
            "extends: glm5-secret\nservice: {name: sglfull}\nserver: {port: 8020}\n")
        loaded, target = load_for_host(rig.project, "glm5-secret-full", str(inventory), None)
        fill = "dd if=/dev/zero of=/srv/a2full/filler bs=1M 2>/dev/null; true"
        with FabricRemote(target.ssh) as inner, pytest.raises(StepFailed) as caught:
            remote = BeforeBatch(inner, lambda step: isinstance(step, Put) and step.dest.name == "sglang.env",
                                 lambda: rig.root(fill))
            engine.deploy(loaded, target, remote, RecordingProgress(),
                          engine.Options(environ={"A2_TEST_TOKEN": SECRET}))
        message = str(caught.value)
        assert "sglang.env" in message and "No space left on device" in message
        assert SECRET not in message and "not shown" not in message
        assert caught.value.hint and "filesystem is full" in caught.value.hint
        assert rig.root("ls -A /srv/a2full/store/sglfull").split() == ["releases"], "the lock was released"
        assert rig.current() == healthy
    finally:
        rig.root("umount /srv/a2full")


RACE_BUILD = """
import sys
from pathlib import Path
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.host import venv_build
from deploy_lib.remote import FabricRemote
root, inventory = sys.argv[1:3]
loaded, target = load_for_host(Project(Path(root)), "glm5-race", inventory, None)
with FabricRemote(target.ssh) as remote:
    built = venv_build.ensure_venv(remote, target.layout("sglang"), loaded.profile.service.venv_build,
                                   where=target.host.name)
print("built", built.hash, built.path)
"""


def test_a_venv_build_racing_a_deploy_that_prunes_keeps_its_build(rig: Rig, healthy: str) -> None:
    """Two processes at once: `venv.build` of a new lock (process A), and a deploy whose prune would remove every
    unfinished `<hash>.tmp` build (process B, started once A's build directory exists)."""
    sandbox_wheels = wheelhouse.prepare()
    sandbox_wheels.link_into(rig.project.root / "wheelhouse")
    wheels = [w for w in sandbox_wheels.wheels if not w.name.startswith("sglang_sim")]  # a lock of its own
    wheelhouse.write_lock(rig.project.root / "lock-race.txt", wheels)
    (rig.project.profiles_dir / "glm5-race.yaml").write_text(
        "extends: glm5-nvfp4\nservice:\n  venv_build:\n    lock: lock-race.txt\n    wheelhouse: wheelhouse\n")
    build = subprocess.Popen([sys.executable, "-c", RACE_BUILD, str(rig.project.root), rig.inventory], cwd=REPO,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 600
        while not rig.root(f"ls {STORE}/venvs 2>/dev/null | grep '[.]tmp$' || true").strip():
            assert build.poll() is None, f"the build ended before it started: {build.communicate()}"
            assert time.monotonic() < deadline, "the build never created its directory"
            time.sleep(0.2)
        with pytest.raises(LockHeld, match=r"\(venv build\)"):
            rig.deploy("glm5-omp2")
        out, err = build.communicate(timeout=1800)
    finally:
        if build.poll() is None:
            build.kill()
    assert build.returncode == 0, err[-3000:]
    venv = out.split()[-1]
    assert rig.root(f"test -f {venv}/venv.json && echo published").strip() == "published"
    assert rig.current() == healthy and rig.unit_state() == "active"
