"""Several sandbox guests of one test module in one inventory group (`sandbox`), driven through `invoke --group`
as a user types it: the fleet, multi-node and router tests share it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from helpers.json_doc import envelope
from helpers.projects import project_for_guest
from sandbox import manage, names

REPO = Path(__file__).resolve().parents[2]
STORE = "/opt/sglang-deploy/sglang"
CONSENTING = ("deploy", "rollback", "router.deploy", "stop", "start", "restart", "uninstall")  # they change hosts
WITHOUT_JSON = ("stop", "start", "restart", "uninstall")  # they print their outcome only as text (report {})


@dataclass
class GuestGroup:
    guests: list[manage.Guest]
    root: Path
    inventory: str
    fault_path: ClassVar[str]  # where the module's faulty releases' simulator reads its fault (SGLANG_SIM_FAULT)

    @property
    def names(self) -> list[str]:
        return [guest.name for guest in self.guests]

    def invoke(self, *argv: str, host: str | None = None) -> tuple[int, dict[str, Any], str]:
        """`invoke ARGV --group sandbox --json` (`--host HOST` instead when given; and `--yes` for a command that
        changes the hosts): exit code, the JSON document (checked against the envelope: read it with
        helpers.json_doc's by_host and result), stderr (progress, errors)."""
        environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")}
        consent = ("--yes",) if argv[0] in CONSENTING else ()
        chosen = ("--host", host) if host else ("--group", names.GROUP)
        as_json = () if argv[0] in WITHOUT_JSON else ("--json",)
        ran = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv, "-i", self.inventory,
                              *chosen, *as_json, *consent],
                             capture_output=True, text=True, env=environ, cwd=self.root, timeout=900)
        document = envelope(ran.stdout, ran.returncode) if as_json else {}  # deploy_cli/envelope.py's shape
        return ran.returncode, document, ran.stderr + (ran.stdout if not as_json else "")

    def deploy(self, profile: str, *argv: str, host: str | None = None) -> tuple[int, dict[str, Any], str]:
        return self.invoke("deploy", "--profile", str(self.root / "inventory" / "profiles" / f"{profile}.yaml"),
                           *argv, host=host)

    def current(self, guest: manage.Guest) -> str:
        return manage.run_on(guest, f"readlink {STORE}/current").strip().rsplit("/", 1)[-1]

    def fault(self, guest: manage.Guest, text: str | None) -> None:
        """The simulator's fault on `guest` (one line such as `oom`), or none."""
        manage.put_text(guest, self.fault_path, text)


Group = TypeVar("Group", bound=GuestGroup)


@contextmanager
def booted_group(kind: type[Group], tag: str, count: int, profiles: dict[str, str], venv_layer: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """`count` guests of the calling module's own, booted over the session's venv layer, in one inventory group in
    that order (node rank order for a multi-node release); all powered off when the module is done."""
    guest_names = [f"pt{os.getpid()}{tag}{n}"[:12] for n in range(1, count + 1)]
    guests: list[manage.Guest] = []
    try:
        for name in guest_names:
            guests.append(manage.up(name, record=False, layers=(venv_layer,)))
        root = tmp_path_factory.mktemp(tag)
        _, inventory = project_for_guest(root, guests[0], profiles)
        Path(inventory).write_text(manage.inventory_text(guests))
        yield kind(guests, root, inventory)
    finally:
        for name in guest_names:
            manage.down(name, record=False)
