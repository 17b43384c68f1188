"""The one JSON document every task's `--json` prints: a schema version, the command, its outcome and exit code, one
result per host (one host and a group alike) and the error when there is one. Each host's `result` is what the
command reports for that host, as it was before the envelope (a deploy's outcome, a status report, a list of
releases); the reference's "JSON output" section is generated from these models (deploy_cli/reference.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1  # raised, with the Literal below, by a change that breaks scripts


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorDoc(_Model):
    """Why the command, or one host, failed."""

    type: str = Field(description="the error's class, e.g. ConfigError, PreflightError, ReadinessFailed; UsageError "
                                  "for a refused command line, Stopped for a question answered no")
    message: str = Field(description="what went wrong, as printed on stderr after `error: `")
    hint: str | None = Field(default=None, description="what to do about it, as printed after `hint: `")
    exit_code: int = Field(description="the exit code this error gives (the exit codes table)")


class HostDoc(_Model):
    """One host's result."""

    host: str | None = Field(description="the inventory host; null for a command that reads no host (`patches.list`, "
                                         "`init`, `version`) or reports on a group as a whole (`tune --group`)")
    outcome: str = Field(description="a deploy's, rollback's or lifecycle command's action on the host (deployed, "
                                     "unchanged, planned, rolled back, started, stopped, ...); `ok` for a command "
                                     "that reports; `failed`; `not started` for a group's host the rollout never "
                                     "reached")
    exit_code: int = Field(description="this host's exit code (0 when it did what was asked)")
    result: Any = Field(default=None, description="what the command reports for this host, as its own document: "
                                                  "the same keys as before schema version 1; for a failed deploy "
                                                  "its release, previous, cause, hint and evidence; null when "
                                                  "nothing was reported")
    error: ErrorDoc | None = Field(default=None, description="why this host failed; null when it did not")


class RolloutDoc(_Model):
    """How a group's deploy or rollback went, host by host."""

    batches: list[list[str]] = Field(description="the hosts of each batch, in the order they ran (--serial)")
    not_started: list[str] = Field(description="hosts the rollout stopped before")
    stopped: str | None = Field(default=None, description="why the rollout stopped; null when it did not")
    serving: dict[str, list[str]] = Field(description="what each host serves now: a release id (or `as before`, "
                                                      "`untouched`) to its hosts")


class Envelope(_Model):
    """The document on stdout of every task's `--json`."""

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, description="the version of this shape; a change "
                                                                           "that breaks scripts raises it")
    command: str = Field(description="the task, as typed: deploy, status, patches.check, ...")
    outcome: Literal["ok", "failed"] = Field(description="ok when the command did what was asked on every host, "
                                                         "else failed")
    exit_code: int = Field(description="the command's exit code, the same as the process's (`plan "
                                       "--detailed-exitcode`: 0, 2 or 1)")
    hosts: list[HostDoc] = Field(description="one result per host, in inventory order (one element for one host); "
                                             "empty when the command failed before choosing its hosts")
    error: ErrorDoc | None = Field(default=None, description="why the command failed: one host's error, or the "
                                                             "error that stopped it before any host; null otherwise "
                                                             "(a group's hosts carry their own)")
    rollout: RolloutDoc | None = Field(default=None, description="a group's deploy or rollback: its batches and "
                                                                 "where it stopped; null otherwise")


def envelope_json_schema() -> dict[str, Any]:
    return Envelope.model_json_schema()


__all__ = ["SCHEMA_VERSION", "Envelope", "ErrorDoc", "HostDoc", "RolloutDoc", "envelope_json_schema"]
