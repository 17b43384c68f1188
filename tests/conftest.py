"""Setup for every test process (and each pytest-xdist worker)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

INVENTORY = Path(__file__).resolve().parent.parent / "inventory"


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a shell (CI scripts, `make test &`) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: the Ctrl-C tests, and the children they start, need the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The checkout tracks no user's hosts (inventory/hosts.yaml is the user's own, as `sglang-deploy init` writes
    # it); the tests read the reference rig through the default inventory, as a user's project would hold it.
    if not (INVENTORY / "hosts.yaml").exists():  # copied whole, then renamed: a worker never reads half of it
        partial = INVENTORY / f".hosts.yaml.{os.getpid()}"
        shutil.copyfile(INVENTORY / "hosts.example.yaml", partial)
        os.replace(partial, INVENTORY / "hosts.yaml")
