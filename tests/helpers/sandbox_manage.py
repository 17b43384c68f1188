"""Hostile names and text the sandbox's tools must carry unchanged."""

from __future__ import annotations

# quotes, command substitution, a glob, an option-looking start, a printf format, backslashes, a newline, non-ASCII
HOSTILE_TEXT = "-n '; touch pwned-text #\n$(touch pwned-sub) `touch pwned-tick` %s %n \\x41\\\\ * é\n\n"


HOSTILE_DIR = "a dir/$(touch pwned-dir)/'q' \"d\" *"
