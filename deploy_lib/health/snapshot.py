"""The rungs of the ladder, and what one probe saw (Snapshot), as host_scripts/probe.py prints it."""

from __future__ import annotations

import signal
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from deploy_lib.health.startup import LogMark


class Rung(StrEnum):
    """The rungs in the order they are climbed; a ladder runs up to and including a target rung."""

    UNIT = "unit"
    PORT = "port"
    HEALTH = "health"
    GENERATE = "generate"

    @property
    def position(self) -> int:  # not `index`: that is str.index, which a StrEnum member keeps
        return list(Rung).index(self)


class UnitState(BaseModel):
    """The `systemctl show` properties the ladder decides on."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, populate_by_name=True)

    active_state: str = Field("", alias="ActiveState")
    sub_state: str = Field("", alias="SubState")
    n_restarts: int | None = Field(None, alias="NRestarts")
    exec_main_pid: int = Field(0, alias="ExecMainPID")
    exec_main_status: int = Field(0, alias="ExecMainStatus")
    # 1 = exited, 2 = killed, 3 = dumped core (the CLD_* codes of waitid(2)).
    exec_main_code: int = Field(0, alias="ExecMainCode")
    result: str = Field("", alias="Result")
    invocation_id: str = Field("", alias="InvocationID")

    @field_validator("n_restarts", mode="before")
    @classmethod
    def _unknown_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("exec_main_pid", "exec_main_status", "exec_main_code", mode="before")
    @classmethod
    def _zero_when_empty(cls, value: Any) -> Any:
        return 0 if value == "" else value

    def exit_text(self) -> str:
        """How the main process last ended, as a person would say it."""
        if self.exec_main_code in (2, 3):
            try:
                return f"killed by {signal.Signals(self.exec_main_status).name}"
            except ValueError:
                return f"killed by signal {self.exec_main_status}"
        return f"exit status {self.exec_main_status}"

    def summary(self) -> str:
        return (f"unit {self.active_state}/{self.sub_state}, Result={self.result or '-'}, "
                f"last exit: {self.exit_text()}, NRestarts={self.n_restarts}, MainPID={self.exec_main_pid}")


class Generation(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    status: int | None = None
    text: str | None = None
    error: str | None = None
    seconds: float = 0.0
    body: str | None = None


class LogLine(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    text: str
    cursor: str


class Snapshot(BaseModel):
    """What one probe saw, as printed by host_scripts/probe.py."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    unit: UnitState | None = None
    unit_error: str | None = None
    port_open: bool = False
    port_error: str | None = None
    health_status: int | None = None
    health_error: str | None = None
    generation: Generation | None = None
    last_log: LogLine | None = None
    marks: tuple[LogMark, ...] = ()  # the startup lines since the last look (health.startup), when asked for
    journal_error: str | None = None
    state: str | None = None  # what the verdict depends on, as the probe compares it (passed back as `seen`)
    probe_s: float = 0.0
