"""The holder a host's lock names in the tests."""

from __future__ import annotations

from deploy_lib.store import (
    LockOwner,
)

HOLDER = LockOwner("other", "elsewhere", 77, "2026-11-30T17:00:00+00:00", "deploy glm5-omp4", "beef")
