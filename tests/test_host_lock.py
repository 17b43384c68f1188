"""One lock for every host change: deploy (venv build included), venv build/adopt/derive and patch-fusion take the
host's lock before their first step that changes the host, and a command that runs another reuses its lock."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from helpers.deploy_plan import PROJECT, target
from helpers.fake_remote import FakeRemote
from helpers.host_lock import HOLDER
from helpers.recording_progress import RecordingProgress

from deploy_lib import venvs
from deploy_lib.commands import deploy as engine
from deploy_lib.commands import patches as on_host
from deploy_lib.errors import LockHeld
from deploy_lib.host import venv_adopt, venv_derive
from deploy_lib.host import venv_build as host_venv_build
from deploy_lib.host.store import host_lock, lock_on_first_change
from deploy_lib.patches import find_patch_set
from deploy_lib.store import FACT_CLOCK, FACT_LOCK, FACT_LOCK_OWNER, LOCK_TAKE, LockOwner, StoreLayout

REPO = Path(__file__).resolve().parent.parent
LAYOUT = StoreLayout("sglang")


def held_elsewhere() -> FakeRemote:
    """A host whose lock another run holds (alive, on another machine)."""
    return (FakeRemote()
            .reply(LOCK_TAKE, exit_code=1, stderr="mkdir: cannot create directory: File exists")
            .reply(FACT_CLOCK, stdout="1764522000\n")
            .reply(FACT_LOCK, stdout="1764521990\n")
            .reply(FACT_LOCK_OWNER, stdout=HOLDER.to_json().decode()))


def only_lock_steps(remote: FakeRemote) -> bool:
    return all(step.name.startswith(("lock:", "store facts: clock", "store facts: lock")) for step in remote.ran)


def test_the_lock_is_reentrant_within_one_process_and_released_once() -> None:
    remote = FakeRemote()
    with host_lock(remote, LAYOUT, "patch and deploy", "gpu1") as outer:
        with host_lock(remote, LAYOUT, "deploy", "gpu1") as inner:
            assert inner == outer
        assert "lock: release" not in remote.ran_names(), "the inner command does not release the outer's lock"
    assert remote.ran_names().count("lock: take") == 1 and remote.ran_names()[-1] == "lock: release"
    assert "patch and deploy" in remote.file_text(LAYOUT.lock_owner)


def test_a_lock_this_process_holds_is_reentered_through_the_deploys_first_change_remote() -> None:
    """A deploy with service.venv_build holds the lock from its first step and builds the venv through its
    LockOnFirstChange remote; the build's own host_lock failed on the deploy's lock (a CI run: LockHeld naming
    this very pid)."""
    remote = FakeRemote()
    with host_lock(remote, LAYOUT, "deploy glm5-lock-a", "gpu1") as outer:
        with lock_on_first_change(remote, LAYOUT, "deploy glm5-lock-a", "gpu1") as through:
            with host_lock(through, LAYOUT, "venv build", "gpu1") as inner:
                assert inner == outer
    assert remote.ran_names().count("lock: take") == 1 and remote.ran_names().count("lock: release") == 1


def test_a_lock_held_by_someone_else_names_what_they_are_doing() -> None:
    with pytest.raises(LockHeld, match=r"held by other@elsewhere \(pid 77\).*\(deploy glm5-omp4\)"):
        with host_lock(held_elsewhere(), LAYOUT, "venv build", "gpu1"):
            pass


def test_an_owner_file_of_the_previous_version_is_still_read() -> None:
    old = '{"host":"laptop","pid":1,"release":"3a9f","time":"t","token":"x","user":"u"}'
    assert str(LockOwner.from_json(old)).endswith("(deploy of release 3a9f)")


def test_deploy_takes_the_lock_before_it_builds_the_locked_venv(tmp_path: Path) -> None:
    """Input tried: a profile with service.venv_build, on a host whose lock another deploy holds."""
    (tmp_path / "lock.txt").write_text("alpha==1.0 --hash=sha256:" + "a" * 64 + "\n")
    loaded = PROJECT.profile("glm5-nvfp4")
    service = loaded.profile.service.model_copy(update={"venv_build": venvs.VenvSpec(
        lock=tmp_path / "lock.txt", wheelhouse=tmp_path)})
    loaded = loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"service": service})})
    remote = held_elsewhere()
    with pytest.raises(LockHeld):
        engine.deploy(loaded, target(), remote, RecordingProgress(), engine.Options())
    assert only_lock_steps(remote), "nothing was read or built before the lock"


def test_venv_build_adopt_and_derive_refuse_while_the_lock_is_held(tmp_path: Path) -> None:
    (tmp_path / "lock.txt").write_text("alpha==1.0 --hash=sha256:" + "a" * 64 + "\n")
    spec = venvs.VenvSpec(lock=tmp_path / "lock.txt", wheelhouse=tmp_path)
    for act in (lambda remote: host_venv_build.ensure_venv(remote, LAYOUT, spec),
                lambda remote: venv_adopt.adopt(remote, LAYOUT, PurePosixPath("/root/ml-env")),
                lambda remote: venv_derive.derive(remote, LAYOUT, "0" * 16, {"x.py": b"x"})):
        remote = held_elsewhere()
        with pytest.raises(LockHeld):
            act(remote)
        assert only_lock_steps(remote)


def test_patch_fusion_enable_and_disable_take_the_lock_before_adopting_or_deriving() -> None:
    patch_set = find_patch_set(REPO / "roles", "fusion-sm120")
    base = PROJECT.profile("glm5-nvfp4")
    for act in (lambda remote: on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set),
                                               target(), RecordingProgress(), engine.Options()),
                lambda remote: on_host.disable(remote, patch_set, base, target(), RecordingProgress(),
                                                engine.Options())):
        remote = held_elsewhere()
        with pytest.raises(LockHeld):
            act(remote)
        assert only_lock_steps(remote)


class InterruptedAfterTaking(FakeRemote):
    """The host runs the lock's mkdir and owner write, then Ctrl-C lands before the answer reaches this process."""

    def run(self, batch, on_output=None):  # type: ignore[no-untyped-def]
        results = super().run(batch, on_output)
        if any(step.name == LOCK_TAKE for step in batch):
            raise KeyboardInterrupt
        return results


def test_ctrl_c_while_the_lock_is_being_taken_leaves_no_lock_behind() -> None:
    """Input tried: SIGINT arriving after the host created the lock, before `take` returned (a CI run saw every
    later test refused with LockHeld, the lock's owner being the interrupted run itself)."""
    remote = InterruptedAfterTaking()
    with pytest.raises(KeyboardInterrupt):
        with host_lock(remote, LAYOUT, "deploy glm5-nvfp4", "gpu1"):
            pytest.fail("the block must not run without the lock")
    assert remote.ran_names()[-1] == "lock: release"
