"""Operator faults around rollback on the sandbox VM (issue 10): a hand rollback that would take the server down,
Ctrl-C / SIGTERM after the switch, a no-op redeploy of a release nobody verified, an old release.json."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import FAULT_OF_SHORT, GUEST_FAULT, TEST_PROFILES, Rig

from deploy_lib.commands import deploy as engine
from deploy_lib.deploy import plan
from deploy_lib.errors import PreflightError, ReadinessFailed, RollbackFailed
from sandbox import manage

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
FAULT_OF_HANG = "/etc/sglang-sim/fault-hang"
OLD_VENV = "/opt/ml-env-old"
STORE = "/opt/sglang-deploy/sglang"
PROFILES = {
    **TEST_PROFILES,
    # a release that reads its own fault file and waits long enough for a signal to arrive while it loads
    "glm5-hang": (f"extends: glm5-nvfp4\nenv:\n  SGLANG_SIM_FAULT: {FAULT_OF_HANG}\n"
                  "service:\n  startup_timeout_s: 300\n"),
    # the release whose release.json is rewritten as an earlier version would have written it
    "glm5-previous": "extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '3'\n",
}
# `invoke` run on the repo's tasks.py with the test project in place of the repo's (its profiles, its inventory)
TASKS_SHIM = """\
import importlib.util
import os
import sys

sys.path.insert(0, {repo!r})
os.environ["SGLANG_DEPLOY_PROJECT"] = {root!r}  # the project the tasks find (deploy_lib.deploy.project.Project.find)
spec = importlib.util.spec_from_file_location("sglang_deploy_tasks", {tasks!r})
tasks = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tasks  # dataclasses in tasks.py look their module up
spec.loader.exec_module(tasks)
ns = tasks.ns
"""


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    return Rig.on(sandbox_venv, tmp_path_factory, PROFILES)


@pytest.fixture
def healthy(rig: Rig) -> str:
    return rig.healthy_release(FAULT_OF_HANG)


class Cli:
    """`invoke ARGS` in a child process, its output read line by line as it comes."""

    def __init__(self, rig: Rig, tmp_path: Path, *args: str) -> None:
        shim = tmp_path / "shim"
        shim.mkdir(exist_ok=True)
        (shim / "tasks.py").write_text(TASKS_SHIM.format(repo=str(REPO), tasks=str(REPO / "tasks.py"),
                                                         root=str(rig.project.root)))
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "invoke", "--search-root", str(shim), *args, "--inventory", rig.inventory],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, needle: str, limit_s: float = 180) -> None:
        """Read output until a line holds `needle` (the limit only stops a test that would hang)."""
        while True:
            try:
                line = self._queue.get(timeout=limit_s)
            except queue.Empty:
                raise AssertionError(f"no line with {needle!r} within {limit_s} s:\n" + "\n".join(self.lines)
                                     ) from None
            if line is None:
                raise AssertionError(f"the command ended before {needle!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if needle in line:
                return

    def finish(self, limit_s: float = 300) -> int:
        code = self.proc.wait(timeout=limit_s)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)


def deploy_hanging_while_loading(rig: Rig, tmp_path: Path) -> Cli:
    """`invoke deploy` of glm5-hang, its release hanging while it loads, once the command waits on readiness (the
    fault is cleared after each test)."""
    rig.fault("hang-loading", FAULT_OF_HANG)
    cli = Cli(rig, tmp_path, "deploy", "--profile", "glm5-hang", "--yes")
    cli.wait_for("▸ readiness")
    return cli


# ---------------------------------------------------------------------------------------------------------
# 1. A hand rollback checks its target before switching, and switches back when the target fails to start


def test_hand_rollback_to_a_release_whose_venv_is_gone_is_refused_before_the_switch(rig: Rig, healthy: str) -> None:
    """Input tried: release A on /opt/ml-env-old, B on /opt/ml-env, then /opt/ml-env-old deleted; rollback --to A."""
    rig.root(f"rm -rf {OLD_VENV} && cp -a /opt/ml-env {OLD_VENV}")
    old = rig.deploy("glm5-omp4", patched=engine.PatchedVenv(plan.VenvChoice(OLD_VENV))).release_id
    assert rig.deploy("glm5-nvfp4").release_id == healthy
    rig.root(f"rm -rf {OLD_VENV}")
    before = (rig.current(), rig.history(), rig.release_dirs())
    with pytest.raises(PreflightError, match=f"no SGLang found in {OLD_VENV}") as caught:
        rig.rollback(old)
    assert caught.value.exit_code == 3 and old in str(caught.value)
    assert (rig.current(), rig.history(), rig.release_dirs()) == before, "nothing changed on the host"
    assert rig.unit_state() == "active"


def test_hand_rollback_whose_target_fails_to_start_switches_back_to_the_serving_release(rig: Rig,
                                                                                       healthy: str) -> None:
    older = rig.deploy("glm5-hang").release_id
    assert rig.deploy("glm5-nvfp4").release_id == healthy
    rig.fault("oom", FAULT_OF_HANG)  # only releases of glm5-hang read this file
    try:
        with pytest.raises(ReadinessFailed, match="out of memory") as caught:
            rig.rollback(older)
    finally:
        rig.fault(None, FAULT_OF_HANG)
    assert not isinstance(caught.value, RollbackFailed) and caught.value.exit_code == 6
    assert f"release {healthy} is serving" in str(caught.value)
    assert rig.current() == healthy and rig.unit_state() == "active"
    assert [(h["event"], h["outcome"], h["release"]) for h in rig.history()[-2:]] == [
        ("rollback", "failed", older), ("rollback", "healthy", healthy)]


def test_the_automatic_rollback_waits_the_same_grace_window_as_a_deploy(rig: Rig, healthy: str) -> None:
    """The rollback target answers the ladder's one generation and then dies: that is no rollback."""
    rig.fault("oom")  # the new release (glm5-faulty) cannot start
    rig.fault("die-after 1", GUEST_FAULT)  # the rollback target serves one request, then exits
    try:
        with pytest.raises(RollbackFailed, match="grace window") as caught:
            rig.deploy("glm5-faulty")
    finally:
        rig.fault(None)
        rig.fault(None, GUEST_FAULT)
    assert caught.value.exit_code == 8
    assert rig.unit_state() in ("inactive", "failed")
    assert [(h["event"], h["outcome"]) for h in rig.history()[-2:]] == [("deploy", "failed"), ("rollback", "failed")]


# ---------------------------------------------------------------------------------------------------------
# 2. Interrupts after the switch finish the transition; a no-op needs a verified, live release


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_new_release_loads_rolls_back_and_says_which_release_serves(
        rig: Rig, healthy: str, tmp_path: Path, signum: int, code: int) -> None:
    cli = deploy_hanging_while_loading(rig, tmp_path)
    cli.signal(signum)
    exit_code = cli.finish()
    name = signal.Signals(signum).name
    assert exit_code == code, "\n".join(cli.lines)
    assert any(name in line and f"release {healthy} is serving" in line for line in cli.lines), cli.lines
    assert rig.current() == healthy and rig.unit_state() == "active"
    history = rig.history()[-2:]
    assert [(h["event"], h["outcome"]) for h in history] == [("deploy", "failed"), ("rollback", "healthy")]
    assert name in str(history[0]["cause"])
    assert rig.root(f"test -e {STORE}/lock && echo held || echo free").strip() == "free"


def test_a_second_ctrl_c_during_the_rollback_says_what_state_the_host_is_in(rig: Rig, healthy: str,
                                                                          tmp_path: Path) -> None:
    cli = deploy_hanging_while_loading(rig, tmp_path)
    cli.signal(signal.SIGINT)
    cli.wait_for(f"rolling back to release {healthy}")
    cli.wait_for("▸ readiness")  # the rollback's own: its switch is done (earlier, the signal races the switch)
    cli.signal(signal.SIGINT)
    exit_code = cli.finish()
    assert exit_code == 130, "\n".join(cli.lines)
    output = "\n".join(cli.lines)
    # the second signal lands while the restored release loads: the line tells the state the host is in
    assert "interrupted again" in output and f"the host now: current: {rig.current()}, unit " in output, output
    assert rig.root(f"test -e {STORE}/lock && echo held || echo free").strip() == "free"
    assert [(h["event"], h["outcome"]) for h in rig.history()[-2:]] == [("deploy", "failed"), ("rollback", "failed")]
    # the next deploy does not take the unverified release for a healthy one
    assert rig.deploy("glm5-nvfp4").action == "deployed"


def test_redeploying_a_release_that_was_never_verified_verifies_it_instead_of_no_changes(rig: Rig, healthy: str,
                                                                                        tmp_path: Path) -> None:
    """Input tried: the deploy killed (SIGKILL, no chance to clean up) while the new release hangs loading."""
    cli = deploy_hanging_while_loading(rig, tmp_path)
    cli.signal(signal.SIGKILL)
    cli.finish()
    rig.root(f"rm -rf {STORE}/lock")  # what `invoke unlock` does for a dead owner
    hung = rig.current()
    assert hung != healthy and rig.unit_state() == "active"
    rig.fault(None, FAULT_OF_HANG)
    outcome = rig.deploy("glm5-hang")
    assert outcome.action == "deployed" and outcome.release_id == hung and outcome.ready is not None
    assert (rig.history()[-1]["event"], rig.history()[-1]["outcome"]) == ("deploy", "healthy")
    assert rig.deploy("glm5-hang").action == "unchanged", "verified and live: now it is a no-op"


def test_redeploying_a_release_whose_directory_was_deleted_restages_it(rig: Rig, healthy: str) -> None:
    rig.root(f"rm -rf {STORE}/releases/{healthy}")
    outcome = rig.deploy("glm5-nvfp4")
    assert outcome.action == "deployed" and outcome.release_id == healthy
    assert healthy in rig.release_dirs() and rig.unit_state() == "active"
    assert rig.root("systemctl show -p LoadState --value sglang.service").strip() == "loaded"


# ---------------------------------------------------------------------------------------------------------
# 6. A release written by an earlier version of the tool stays rollback-able


def test_rollback_to_a_release_written_by_a_previous_version(rig: Rig, healthy: str) -> None:
    """Input tried: release.json whose profile has a key today's schema lacks and lacks one it has."""
    old = rig.deploy("glm5-previous").release_id
    assert rig.deploy("glm5-nvfp4").release_id == healthy
    path = f"{STORE}/releases/{old}/release.json"
    metadata = json.loads(rig.root(f"cat {path}"))
    metadata["profile"]["service"]["health_path"] = "/health"   # a key that was removed since
    del metadata["profile"]["features"]["metrics"]               # a key that was added since
    rig.write(path, json.dumps(metadata) + "\n")
    progress = RecordingProgress()
    with rig.connect() as (target, remote):
        outcome = engine.rollback(target, "sglang", remote, progress, old, {})
    assert outcome.release_id == old and rig.current() == old and rig.unit_state() == "active"
    assert any("service.health_path" in str(note) for note in progress.of_kind("note")), progress.events
    assert "health_path" in rig.root(f"cat {path}"), "the unknown key is kept"


@pytest.fixture(autouse=True)
def _no_faults_left(rig: Rig) -> Iterator[None]:
    yield
    for path in (FAULT_OF_SHORT, GUEST_FAULT, FAULT_OF_HANG):
        rig.fault(None, path)
