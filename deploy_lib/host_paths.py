"""Paths on the host that follow from others."""

from __future__ import annotations

from pathlib import PurePosixPath


def venv_python(venv: str | PurePosixPath) -> PurePosixPath:
    """The interpreter of a venv on the host: <venv>/bin/python3."""
    return PurePosixPath(venv) / "bin" / "python3"
