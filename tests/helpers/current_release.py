"""A fake host whose store has release r1 current (unit `sglang`), for the status and operator tests."""

from __future__ import annotations

import json
from typing import Any

from deploy_lib.facts.host import FACT_UNIT
from deploy_lib.store import FACT_CURRENT, FACT_LOCK, FACT_RELEASE_DIRS, FACT_RELEASE_FILES, StoreLayout, Tags
from helpers.fake_remote import FakeRemote

LAYOUT = StoreLayout("sglang")
TAGS = Tags("ops@laptop", "gpu1", "r1", "glm5-nvfp4", "ph", {"sglang": "0.5.23"})


def host_with_current(active: str, profile: dict[str, Any] | None = None) -> FakeRemote:
    """A host whose store has release r1 current, its unit in `active` state; its recorded profile serves on
    0.0.0.0:8000, with `profile`'s sections beside."""
    metadata = {"id": "r1", "staged_at": "2026-11-30T10:00:00+00:00", "tags": TAGS.as_dict(),
                "profile": {"server": {"host": "0.0.0.0", "port": 8000}, **(profile or {})}, "sglang_version": "0.5.23"}
    release_json = f"{LAYOUT.releases}/r1/release.json\0{json.dumps(metadata)}\n"
    return (FakeRemote()
            .reply(FACT_LOCK, exit_code=1)
            .reply(FACT_CURRENT, stdout="releases/r1\n")
            .reply(FACT_RELEASE_DIRS, stdout="r1\0r1/release.json\0r1/sglang.service\0r1/sglang.env\0")
            .reply(FACT_RELEASE_FILES, stdout=release_json)
            .reply(FACT_UNIT, stdout=f"ActiveState={active}\nSubState=running\nLoadState=loaded\n"))
