"""How sandbox tests write a file on a guest (sandbox.manage.put_text): the command it sends, run here by the shells
a guest's root may have, with a hostile path and text; the guest itself: tests/sandbox/test_guest.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.sandbox_manage import HOSTILE_DIR, HOSTILE_TEXT

from sandbox import manage


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_put_text_writes_exactly_the_text_at_a_hostile_path_then_removes_it(tmp_path: Path, shell: str) -> None:
    path = tmp_path / HOSTILE_DIR / "-fault; rm -rf x"

    def put(text: str | None) -> None:
        subprocess.run([shell, "-c", manage.put_text_command(path, text)], input=(text or "").encode(),
                       cwd=tmp_path, check=True, timeout=30)

    put(HOSTILE_TEXT)
    assert path.read_bytes() == HOSTILE_TEXT.encode()
    put("")
    assert path.read_bytes() == b""
    put(None)
    assert not path.exists()
    put(None)  # removing what is not there is fine: a test disarms a fault it may never have armed
    assert sorted(p.name for p in tmp_path.rglob("pwned*")) == []
