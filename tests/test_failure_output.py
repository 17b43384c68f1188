"""What a failure prints: SGLang's ~10 KB `server_args=ServerArgs(...)` line is cut to its first 200 characters,
both while the ladder shows the server's log and in the evidence of an error."""

from __future__ import annotations

import pytest
from rich.console import Console

from deploy_cli import present as ui
from deploy_lib.errors import ReadinessFailed

SERVER_ARGS = ("[2026-11-29 11:50:37] server_args=ServerArgs(model_path='lukealonso/GLM-5-NVFP4', "
               + ", ".join(f"option_{i}=None" for i in range(700)) + ")")


def recording() -> Console:
    return Console(record=True, width=10_000, highlight=False)


def test_the_ladder_shows_the_server_args_line_shortened() -> None:
    out = recording()
    ui.TerminalProgress(out).log_line(SERVER_ARGS)
    shown = out.export_text()
    assert SERVER_ARGS[:200] + "... (full line: `invoke logs`)" in shown and "option_699" not in shown


def test_an_errors_evidence_shows_the_server_args_line_shortened(monkeypatch: pytest.MonkeyPatch) -> None:
    err = recording()
    monkeypatch.setattr(ui, "errors", err)
    ui.print_error(ReadinessFailed("release r1 failed", evidence=(SERVER_ARGS, "ValueError: boom")))
    shown = err.export_text()
    assert "(full line: `invoke logs`)" in shown and "option_699" not in shown and "ValueError: boom" in shown
