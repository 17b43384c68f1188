"""How a command ended on a host, as one enum: a deploy's, rollback's, start's or stop's Outcome, a sweep's and the
router's end, a group's table row. The terminal and `--json` show its value; hooks (SGLANG_DEPLOY_OUTCOME) and the
webhook (`event`) get its `word`."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    """What a command did on a host."""

    deployed = "deployed"
    unchanged = "unchanged"
    planned = "planned"                  # a dry run: nothing changed
    rolled_back = "rolled back"
    started = "started"
    restarted = "restarted"
    already_running = "already running"  # a start that found the server running
    stopped = "stopped"
    failed = "failed"                    # the host's command raised (its DeployError)
    not_started = "not started"          # a group's host the rollout stopped before

    @property
    def word(self) -> str:
        """The one-word spelling scripts get: hooks' SGLANG_DEPLOY_OUTCOME, the webhook's `event` (`rolled-back`)."""
        return self.value.replace(" ", "-")



__all__ = ["Action"]
