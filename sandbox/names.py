"""The sandbox's default names and versions, apart from the code that uses them: `invoke --list` shows them in the
sandbox tasks' help without importing the rig (sandbox/manage.py, hub.py, wheelhouse.py)."""

from __future__ import annotations

from pathlib import PurePosixPath

from deploy_lib.errors import ConfigError

DEFAULT_NAME = "th1"
GROUP = "sandbox"  # the inventory group of every guest sandbox.up brought up
MAX_GUESTS = 8  # guests share this machine's cores; each runs sshd, systemd and a simulated server
GUEST_VENV = PurePosixPath("/opt/ml-env")  # a real host uses /root/ml-env
GUEST_USER = "deploy"
DEFAULT_SGLANG = "0.5.23"
DEFAULT_FLASHINFER = "0.7.2"  # the version sglang 0.5.23 pins


def guest_names(names: list[str], count: int) -> list[str]:
    """The guests `sandbox.up` brings up: the names given, else th1..thN (thN gets address block N)."""
    if names and count:
        raise ConfigError("sandbox.up takes --name (repeated for several guests) or --count N, not both")
    if count < 0 or count > MAX_GUESTS:
        raise ConfigError(f"--count takes 1 to {MAX_GUESTS} guests, got {count}",
                          "each guest is a systemd-nspawn machine on this host with its own simulated GPUs")
    return names or [f"th{number}" for number in range(1, (count or 1) + 1)]
