"""A power loss at any point of a deploy loses nothing: the guest (its writable layer a disk of its own, which a
power cut takes back to what was synced) loses power at seeded random moments of changed deploys. After each boot:
`current` names a complete release whose files match the checksums release.json records, every release directory
is listed by `releases` (complete or damaged, never silently missing), history parses (a torn last line counted,
never fatal), and the next deploy succeeds with no `unlock` (the lock of the deploy that died with its host is
taken over: the host's boot id changed).

The same test runs again with `stress-ng --cpu 2` loading this machine (the guest's CPUs too), on a reduced set of
points (CRASH_POINTS_LOADED, default 6) drawn from CRASH_SEED + 1: the order of writes must not depend on timing.

CRASH_SEED replays a run (the points it used are in the failure message); CRASH_POINTS sets how many (default 20)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path, PurePosixPath

import pytest
from helpers.recording_progress import RecordingProgress
from helpers.rig import REFERENCE, Rig

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.releases import list_releases
from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
from deploy_lib.store import RELEASE_FILE, parse_history
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.own_disk]

SEED = int(os.environ.get("CRASH_SEED", "31"))
POINTS = int(os.environ.get("CRASH_POINTS", "20"))
LOADED_POINTS = int(os.environ.get("CRASH_POINTS_LOADED", "6"))  # under stress-ng --cpu 2: a reduced set
LATEST_S = 12.0  # crash points fall in the first LATEST_S seconds of a deploy: stage, switch, ladder, history, prune
PROFILES = ("glm5-omp4", REFERENCE)  # deployed in turn: every deploy is a change


class HostWentDown(BaseException):
    """The deploy ends with its host: nothing of it reaches the host after the power cut."""


class DiesWithHost:
    """The deploy's Remote: once the host is down, no round trip is sent and none returns."""

    def __init__(self, inner: FabricRemote) -> None:
        self.inner = inner
        self.down = threading.Event()

    def _after(self, call: object) -> object:
        if self.down.is_set():
            raise HostWentDown
        try:
            answer = call()  # type: ignore[operator]
        except Exception:
            if self.down.is_set():
                raise HostWentDown from None
            raise
        if self.down.is_set():
            raise HostWentDown
        return answer

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        return self._after(lambda: self.inner.run(batch, on_output))  # type: ignore[return-value]

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        return self._after(lambda: self.inner.push_directory(local_dir, dest, link_dest, on_output))  # type: ignore

    def close(self) -> None:
        self.inner.close()


def deploy_until_the_power_is_cut(rig: Rig, profile: str, after_s: float) -> str:
    """Deploy `profile` on a thread and cut the guest's power `after_s` seconds in; what the deploy got to."""
    loaded, target = rig.target(profile)
    remote = DiesWithHost(FabricRemote(target.ssh))
    ended: list[str] = []

    def deploy() -> None:
        try:
            ended.append(engine.deploy(loaded, target, remote, RecordingProgress(), engine.Options()).action)
        except HostWentDown:
            ended.append("cut")
        except Exception as error:
            ended.append(f"failed: {error}")

    worker = threading.Thread(target=deploy, daemon=True)
    worker.start()
    worker.join(after_s)
    remote.down.set()
    manage.crash(rig.guest.name)
    worker.join(120)
    remote.inner.close()
    assert not worker.is_alive(), "the deploy did not end with its host"
    return ended[0]


def assert_store_intact(rig: Rig, known: set[str], where: str) -> None:
    current = rig.current()
    assert current in known, f"{where}: current names {current!r}, a release no deploy finished staging"
    release = f"{rig.store}/releases/{current}"
    files = json.loads(rig.root(f"cat {release}/{RELEASE_FILE}"))["files"]
    sums = dict(reversed(line.split(maxsplit=1)) for line in
                rig.root(f"cd {release} && sha256sum -- {' '.join(files)}").splitlines())
    assert sums == files, f"{where}: release {current}'s files differ from their recorded checksums"
    with rig.connect() as (target, remote):
        listed = {row.id for row in list_releases(target, rig.service, remote)}
    dirs = {name for name in rig.release_dirs() if not name.endswith(".tmp")}
    assert dirs <= listed, f"{where}: releases not listed: {sorted(dirs - listed)}"
    entries, unreadable = parse_history(rig.root(f"cat {rig.store}/history.jsonl"))
    assert entries and unreadable <= 1, f"{where}: history has {unreadable} unreadable lines"


@contextmanager
def cpu_load(workers: int) -> Iterator[None]:
    """`stress-ng --cpu N` running on this machine (where the guest runs too) for the block; stopped by its PID."""
    stress = subprocess.Popen(["stress-ng", "--cpu", str(workers), "--quiet"], stdin=subprocess.DEVNULL,
                              start_new_session=True)  # its own process group: the workers it forks end with it
    try:
        yield
        loaded_throughout = stress.poll() is None
    finally:
        os.killpg(stress.pid, signal.SIGTERM)
        stress.wait(30)
    assert loaded_throughout, f"stress-ng ended (exit {stress.returncode}) before the crash points did"


@pytest.mark.parametrize(("load", "points"), [(0, POINTS), (2, LOADED_POINTS)], ids=["idle", "stress-ng-cpu-2"])
def test_a_power_loss_at_any_point_of_a_deploy_loses_nothing(rig: Rig, load: int, points: int) -> None:
    """Input tried: `points` power cuts at seeded moments of changed deploys; with `stress-ng --cpu 2` running for
    the `stress-ng-cpu-2` case (fewer points: each deploy is slower), whose points come from the seed + 1."""
    if load and shutil.which("stress-ng") is None:
        pytest.skip("stress-ng is not installed: `sandbox/testhost.sh deps` installs the host tools")
    seed = SEED + (1 if load else 0)
    draw = random.Random(seed)
    moments = [round(draw.uniform(0, LATEST_S), 2) for _ in range(points)]
    known = {rig.deploy(profile).release_id for profile in reversed(PROFILES)}  # both releases staged and healthy
    manage.reboot(rig.guest.name)  # ... and on the disk
    seen = []
    with cpu_load(load) if load else nullcontext():
        for number, after_s in enumerate(moments):
            profile = PROFILES[number % 2]
            where = (f"crash point {number} ({after_s} s into a deploy of {profile}; CRASH_SEED={SEED}, "
                     f"stress-ng --cpu {load}, seed {seed})")
            seen.append((after_s, deploy_until_the_power_is_cut(rig, profile, after_s)))
            assert_store_intact(rig, known, where)
            outcome = rig.deploy(profile)
            assert outcome.action in ("deployed", "unchanged"), where
            assert rig.current() == outcome.release_id, where
    assert len(seen) == points, seen
