"""The sandbox's default names and versions, apart from the code that uses them: `invoke --list` shows them in the
sandbox tasks' help without importing the rig (sandbox/manage.py, hub.py, wheelhouse.py)."""

from __future__ import annotations

from pathlib import PurePosixPath

DEFAULT_NAME = "th1"
GUEST_VENV = PurePosixPath("/opt/ml-env")  # a real host uses /root/ml-env
GUEST_USER = "deploy"
DEFAULT_SGLANG = "0.5.23"
DEFAULT_FLASHINFER = "0.7.2"  # the version sglang 0.5.23 pins
