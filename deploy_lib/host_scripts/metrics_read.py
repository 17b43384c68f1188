"""Reads a server's /metrics on its own host (sent whole to the host's `python3 -I -S -`; standard library only,
Python 3.8 and up). Prints the answer's body and exits 0 when the server answered 200; exits 3 with `HTTP <code>`
on stderr when it answered otherwise (404: started without --enable-metrics); exits 4 when nothing answered."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def read_metrics(url: str, timeout_s: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            sys.stdout.write(answer.read().decode("utf-8", "replace"))
            return 0
    except urllib.error.HTTPError as error:
        sys.stderr.write(f"HTTP {error.code}\n")
        return 3
    except (OSError, ValueError) as error:  # URLError is an OSError: refused, timed out, no route
        sys.stderr.write(f"{error}\n")
        return 4
