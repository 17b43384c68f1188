"""Reading a command's `--json` document (deploy_cli/envelope.py: one shape for every command), checked against the
envelope's model as it is read: each host's result by host name, or the one host's result."""

from __future__ import annotations

import json
from typing import Any

from deploy_cli.envelope import Envelope


def envelope(stdout: str, returncode: int | None = None) -> dict[str, Any]:
    """The document on stdout, valid for the envelope (every key known, none missing); its exit_code the process's
    when `returncode` is given."""
    document: dict[str, Any] = json.loads(stdout)
    Envelope.model_validate(document)
    assert returncode is None or document["exit_code"] == returncode, (document["exit_code"], returncode)
    return document


def by_host(document: dict[str, Any]) -> dict[str, Any]:
    """Each host's result by its name; a host with none (not started) as `{"outcome": ...}`."""
    return {host["host"]: host["result"] if host["result"] is not None else {"outcome": host["outcome"]}
            for host in document["hosts"]}


def result(document: dict[str, Any]) -> Any:
    """The one host's result (a command on one host, or one that reads none)."""
    [host] = document["hosts"]
    return host["result"]
