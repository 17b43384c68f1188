"""Fixtures for the sandbox VM and the simulated SGLang server.

- `sandbox_guest` (module): a fresh guest of each test module's own (name pt<pid>m<n>, so concurrent test runs do
  not collide), always stopped at the module's end: every module's tests may rely on what they leave on the host
  (the service `sglang` in /opt/sglang-deploy above all) and on nothing another module left. It boots over the
  session's venv layer, so /opt/ml-env (real sglang + flashinfer, the sim) is there at once: a new guest costs
  ~1.5-5 s to start and ~1-2 s to stop (killed, not powered off: a clean poweroff waited up to 30 s on the
  services the tests left running), a reset of a shared one would cost as much and restore less;
  `sandbox_venv`: the same guest, named for tests that use /opt/ml-env;
  `sandbox_ssh`: a deploy_lib FabricRemote logged in as `deploy` (sudo -n works).
- `wheelhouse_default`, `venv_layer`, `sim_venv` (session): the wheels, the guests' venv layer (built once per
  wheelhouse and rootfs, kept in the cache), and a venv on this machine for the sim's loopback tests.
- `guest_shell`: a GuestShell (guest_shell.py): paramiko, RejectPolicy, the guest's known_hosts.

A new sandbox test module takes `sandbox_venv` (or `sandbox_guest`) and builds its rig from it, e.g.
`Rig.on(sandbox_venv, tmp_path_factory, PROFILES)` (rig.py); tests in one module share its guest and run in order.
A test that needs more guests at once starts them with `manage.up(name, record=False, layers=(venv_layer,))` under
a unique name and always stops them. A module that reboots its guest or cuts its power (`manage.reboot`,
`manage.crash`) is marked `pytest.mark.own_disk`: its guest then starts with `disk=True`, so that its writable layer
is a disk of its own (test_reboot_sandbox.py, test_power_loss_sandbox.py).
`make test` runs modules in parallel (pytest-xdist, --dist loadfile): a
module must not rely on anything outside its own guests, and what it shares on this machine (the cache) is locked.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.guest_shell import GuestShell
from helpers.rig import Rig

from deploy_lib.remote import FabricRemote, SSHTarget
from sandbox import manage, wheelhouse

# the sim's pure parts are unit-tested from source; it has no dependencies
sys.path.insert(0, str(Path(manage.SANDBOX_DIR) / "sim"))


@pytest.fixture(scope="session")
def wheelhouse_default() -> wheelhouse.Wheelhouse:
    return wheelhouse.prepare()


@pytest.fixture(scope="session")
def sim_venv(wheelhouse_default: wheelhouse.Wheelhouse) -> Path:
    """A venv on this machine: real sglang + flashinfer (--no-deps), msgspec, ninja and the sim wheel (kept in the
    cache, one per set of wheels, so checkouts with different wheelhouses do not rebuild each other's venv)."""
    wheels = hashlib.sha256("\n".join(p.name for p in wheelhouse_default.wheels[:-1]).encode()).hexdigest()[:12]
    venv = wheelhouse.cache_root() / "local-venvs" / f"sim-{wheelhouse.DEFAULT_SGLANG}-{wheels}"
    return wheelhouse.build_local_venv(venv, wheelhouse_default)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the sandbox VM needs root (netns, overlay mount, systemd-nspawn)")


@pytest.fixture(scope="session")
def venv_layer(wheelhouse_default: wheelhouse.Wheelhouse) -> Path:
    needs_root()
    return manage.venv_layer(wheelhouse_default)


_guests = itertools.count(1)


@pytest.fixture(scope="module")
def sandbox_guest(venv_layer: Path, request: pytest.FixtureRequest) -> Iterator[manage.Guest]:
    name = f"pt{os.getpid()}m{next(_guests)}"[:12]
    own_disk = request.node.get_closest_marker("own_disk") is not None  # the module reboots or crashes its guest
    try:
        yield manage.up(name, record=False, layers=(venv_layer,), disk=own_disk)
    finally:
        manage.down(name, record=False, poweroff_s=0)  # its writable layer is thrown away: no clean shutdown needed


@pytest.fixture(scope="module")
def sandbox_ssh(sandbox_guest: manage.Guest) -> Iterator[FabricRemote]:
    remote = FabricRemote(SSHTarget(host=sandbox_guest.guest_ip, user=manage.GUEST_USER,
                                    key_files=(sandbox_guest.key,), known_hosts_file=sandbox_guest.known_hosts))
    yield remote
    remote.close()


@pytest.fixture(scope="module")
def sandbox_venv(sandbox_guest: manage.Guest) -> manage.Guest:
    """The module's guest, whose /opt/ml-env holds the wheelhouse (from the venv layer)."""
    return sandbox_guest


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Rig:
    """The module's deploy rig with rig.py's test profiles; a module with profiles of its own defines its own."""
    return Rig.on(sandbox_venv, tmp_path_factory)


@pytest.fixture
def healthy(rig: Rig) -> str:
    """The reference profile deployed and serving on the module's rig; its release id."""
    return rig.healthy_release()


@pytest.fixture(scope="module")
def guest_shell(sandbox_guest: manage.Guest) -> Iterator[GuestShell]:
    shell = GuestShell(sandbox_guest)
    yield shell
    shell.close()
