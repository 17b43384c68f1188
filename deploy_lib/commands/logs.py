"""The server's log: its last lines from the journal, or followed as they come."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from deploy_lib.deploy.project import Target
from deploy_lib.facts.diagnose import journal_argv, journal_step
from deploy_lib.remote import Remote, Step


def read_log(target: Target, service: str, remote: Remote, lines: int) -> list[str]:
    layout = target.layout(service)
    [result] = remote.run([journal_step(layout.unit_name, max_lines=lines)])
    return result.stdout.splitlines()


def follow_log(target: Target, service: str, remote: Remote, lines: int, poll_s: float = 1.0,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The last `lines` lines, then new ones as they come (polled over the open connection) until interrupted."""
    layout = target.layout(service)
    cursor: str | None = None
    count = lines
    while True:
        after = (f"--after-cursor={cursor}",) if cursor else ()
        argv = journal_argv(layout.unit_name, count, "--show-cursor", *after)
        [result] = remote.run([Step("follow journal", argv, sudo=True, timeout_s=30)])
        for line in result.stdout.splitlines():
            if line.startswith("-- cursor: "):
                cursor = line.removeprefix("-- cursor: ")
            else:
                yield line
        count = 10_000
        sleep(poll_s)
