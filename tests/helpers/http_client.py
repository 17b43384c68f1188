"""The one HTTP helper of the sandbox tests: a status for every answer, "refused" while the port is closed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def http(url: str, body: dict | None = None, headers: dict[str, str] | None = None,
         timeout_s: float = 30) -> tuple[int | str, bytes]:
    """(status, body); "refused" while the port is closed."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except urllib.error.URLError as error:
        if isinstance(error.reason, ConnectionRefusedError):
            return "refused", b""
        raise
