"""A unit's crash loop as systemd 252 journals it (captured events) and its status."""

from __future__ import annotations

from pathlib import Path

from deploy_lib.commands.status import StatusReport
from deploy_lib.facts.crashes import (
    Crash,
    CrashReport,
    parse_crashes,
)
from deploy_lib.facts.diagnose import Diagnosis
from deploy_lib.facts.host import UnitFacts

EVENTS = (Path(__file__).resolve().parents[1] / "data" / "journal" / "crash-events-252.jsonl").read_text().splitlines()


LOOP_GAVE_UP = "\n".join(EVENTS[:27])       # first loop: 4 crashes, the 4th restart refused


def unit(active: str, sub: str, restarts: int, result: str = "success") -> UnitFacts:
    return UnitFacts(active_state=active, sub_state=sub, main_pid=0, n_restarts=restarts, load_state="loaded",
                     result=result)


GAVE_UP = unit("failed", "failed", 4, "exit-code")  # what systemd 252 shows after the start limit refused


def diagnosed(report: CrashReport) -> CrashReport:
    cause = Diagnosis("cuda_runtime_error", "a CUDA kernel failed", "h", ())
    return CrashReport(report.restarts, tuple(Crash(c.at_us, c.started_us, c.result, c.exit, c.restarted, cause)
                                              for c in report.crashes), report.gave_up, report.down)


def crash_loop_status() -> StatusReport:
    report = diagnosed(parse_crashes(LOOP_GAVE_UP, GAVE_UP))
    return StatusReport(host="th1", service="sglang", current="r2", current_age_s=60.0, metadata={},
                        unit_state="failed/failed", readiness="port closed", gpus=None, gpu_error="n/a",
                        lock_holder=None, venv_versions={}, restarts=4, crashes=report,
                        advice="release r2 is down after 4 crash(es); `invoke rollback` returns to release r1")
