"""A group of replicas and the caps their sweep tries."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from helpers.deploy_plan import PROJECT, target

BASE = PROJECT.profile("glm5-nvfp4")


FOUR_CAPS = ("memory.max_running_requests=64,256,1024,512",)


def replica(name: str) -> Any:
    found = target()
    return replace(found, host=found.host.model_copy(update={"name": name}))
