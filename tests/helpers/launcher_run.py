"""Run a rendered launcher with the real /bin/sh against a stand-in for the venv's python that prints its argv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PRINTER = "import os, sys\nsys.stdout.buffer.write(b''.join(os.fsencode(arg) + b'\\0' for arg in sys.argv))\n"


def argv_printer(path: Path) -> str:
    """Write the stand-in at `path` (e.g. <venv>/bin/python3); its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{PRINTER}")
    path.chmod(0o755)
    return str(path)


def launched_argv(launcher_text: str, directory: Path) -> tuple[str, ...]:
    """The argv the launcher's exec gives the program it names (an argv_printer)."""
    launcher = directory / "launch"
    launcher.write_text(launcher_text)
    launcher.chmod(0o755)
    done = subprocess.run([str(launcher)], capture_output=True, timeout=30, check=True)
    return tuple(arg.decode() for arg in done.stdout.split(b"\0")[:-1])
