"""A bare venv of this interpreter, for the host-facts reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def bare_venv(root: Path) -> Path:
    """A venv of this interpreter without pip or anything else installed: its site-packages directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    [site] = root.glob("lib/python3*/site-packages")
    return site
