"""The program the user ran, as messages name it. The library's messages spell a command as the checkout runs it
(`invoke status`); the installed command sets its own name once at its start (deploy_cli.program.main), and what
reaches the user (the CLI's output, a page or file the tool writes) goes through `spoken`: `sglang-deploy status`."""

from __future__ import annotations

CHECKOUT = "invoke"  # how the library's messages are written: the checkout's program

_running = CHECKOUT


def set_program(name: str) -> None:
    """Called once, by the entry point of the program the user ran."""
    global _running
    _running = name


def spoken(text: str) -> str:
    """`text` with each command it names (`` `invoke TASK ...` ``) as the program the user ran spells it."""
    return text if _running == CHECKOUT else text.replace(f"`{CHECKOUT} ", f"`{_running} ")


__all__ = ["CHECKOUT", "set_program", "spoken"]
