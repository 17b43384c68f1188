"""Setup for every test process (and each pytest-xdist worker)."""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a shell (CI scripts, `make test &`) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: the Ctrl-C tests, and the children they start, need the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
