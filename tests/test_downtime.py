"""The downtime of a switch (issue 41): from the old server's stop to the new one's first answered generation, split
into the server's own start and the tool's part; printed, kept in history, shown by `status` and `releases`. Driven
through a scripted host whose steps and probes take set times on a fake clock (no time passes in the test)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from helpers.deploy_plan import PROJECT, target
from helpers.deploy_trips import serving_the_profile
from helpers.recording_progress import RecordingProgress
from helpers.rollback import DEAD, LAYOUT, READY, ScriptedHost, a_host, changed_profile
from helpers.store_output import release_entries
from rich.console import Console

from deploy_cli import present, reports
from deploy_lib import store
from deploy_lib.commands.deploy import Options, Outcome, deploy, rollback, start
from deploy_lib.commands.releases import downtime_by_release
from deploy_lib.commands.status import read_status
from deploy_lib.deploy.plan import RESTART
from deploy_lib.deploy.project import Target
from deploy_lib.errors import ReadinessFailed
from deploy_lib.facts import host as host_facts
from deploy_lib.health.downtime import Downtime
from deploy_lib.health.startup import LogMark
from deploy_lib.outcomes import Action
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import HEALTHY, HistoryEntry, Tags, history_entry

STEP_S = 1.0  # every step of a round trip takes this long on the host
PROBE_S = 70.0  # a probe round trip: the new server's start, from the restart to its first answer
T0 = 1_764_590_000_000_000  # usec: systemd's "Started" line of the new server


def at(seconds: float, text: str) -> dict[str, object]:
    return LogMark(text=text, usec=T0 + int(seconds * 1e6)).model_dump()


# SGLang 0.5.23's lines: init 10 s, weights 30 s, KV cache 2 s, CUDA graphs 17 s, warm-up 2 s; then 0.5 s to generate
STARTED = {**READY, "generation": {"status": 200, "text": " Paris", "seconds": 0.5}, "marks": [
    at(0, "Started sglang.service - SGLang server."), at(10, "[TP0] Load weight begin. avail mem=93.21 GB"),
    at(40, "[TP0] Load weight end. elapsed=30.00 s"), at(42, "[TP0] KV Cache is allocated. #tokens: 1048576"),
    at(43, "[TP0] Capture target decode CUDA graph begin. backend=full"),
    at(60, "[TP0] Capture target decode CUDA graph end. elapsed=17.00 s"),
    at(62, "The server is fired up and ready to roll!")]}
PHASES = {"init": 10.0, "weights": 30.0, "kv_cache": 2.0, "cuda_graphs": 17.0, "warmup": 2.0, "first_generation": 0.5}
SERVER_S = 62.5  # "Started" to "ready to roll", and the first generation


class TimedHost(ScriptedHost):
    """The scripted host on a fake clock: each step takes STEP_S, each readiness probe PROBE_S."""

    def __init__(self, host: ScriptedHost) -> None:
        self.__dict__.update(host.__dict__)
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results = super().run(batch, on_output)
        timed = [replace(result, duration_s=PROBE_S if result.step.name.startswith("readiness probe") else STEP_S)
                 for result in results]
        self.now += sum(result.duration_s for result in timed)
        return timed

    def stop_to_answer_s(self) -> float:
        """What the downtime must be: the steps of the switch's round trip from the restart on, then one probe."""
        [switch] = [batch for batch in self.batches if any(step.name == RESTART for step in batch)][-1:]
        restart = next(i for i, step in enumerate(switch) if step.name == RESTART)
        return (len(switch) - restart) * STEP_S + PROBE_S

    def history_lines(self) -> list[HistoryEntry]:
        return [HistoryEntry.from_json(step.stdin.decode()) for step in self.ran
                if isinstance(step, Step) and step.name == "history: append" and step.stdin]


class Starting(dict):  # type: ignore[type-arg]
    def __missing__(self, release_id: str) -> list[object]:
        return [STARTED]


def timed(host: ScriptedHost) -> TimedHost:
    host.probes = Starting()
    return TimedHost(host)


def deployed(host: TimedHost) -> Outcome:
    return deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0), clock=host.clock)


def test_a_changed_deploy_reports_the_downtime_from_the_stop_to_the_first_answer_with_its_parts() -> None:
    host = timed(a_host())
    outcome = deployed(host)
    assert outcome.action == Action.deployed
    expected = host.stop_to_answer_s()
    assert outcome.downtime == Downtime(expected, SERVER_S, PHASES), "the stage and switch before it were served"
    assert outcome.downtime.tool_s == expected - SERVER_S
    [line] = host.history_lines()
    assert Downtime.from_timings(line.timings) == outcome.downtime, "history keeps it whole"


def test_a_deploy_with_no_server_running_before_reports_no_downtime() -> None:
    """Input tried: a first deploy (no `current`, no unit running)."""
    host = timed(a_host())
    host.reply(store.FACT_CURRENT, exit_code=1)
    host.reply(host_facts.FACT_UNIT, stdout="ActiveState=inactive\nSubState=dead\nMainPID=0\nNRestarts=0\n"
                                            "LoadState=not-found\n")
    outcome = deployed(host)
    assert (outcome.action, outcome.previous_id, outcome.downtime) == (Action.deployed, None, None)
    assert "downtime" not in host.history_lines()[-1].timings


def test_a_rollback_and_a_restart_report_their_downtime() -> None:
    host = timed(a_host())
    back = rollback(target(), "sglang", host, RecordingProgress(), "A", {}, clock=host.clock, grace_s=0)
    assert back.action == Action.rolled_back
    assert back.downtime == Downtime(host.stop_to_answer_s(), SERVER_S, PHASES)
    assert Downtime.from_timings(host.history_lines()[-1].timings) == back.downtime
    again = start(target(), "sglang", host, RecordingProgress(), {}, restart=True, clock=host.clock)
    assert again.downtime == Downtime(host.stop_to_answer_s(), SERVER_S, PHASES)


class NewReleaseDies(dict):  # type: ignore[type-arg]
    def __missing__(self, release_id: str) -> list[object]:
        return [STARTED] if release_id == "B" else [DEAD]


def test_a_failed_deploy_reports_the_downtime_until_the_release_it_rolled_back_to_answers() -> None:
    """Two ladders pass while nothing answers: the new release's (dead) and the restored one's."""
    host = TimedHost(a_host())
    host.probes = NewReleaseDies()
    with pytest.raises(ReadinessFailed) as failed:
        deployed(host)
    downtime = present.failure_json(failed.value)["downtime"]
    assert downtime is not None and downtime["total_s"] >= 2 * PROBE_S
    restored = host.history_lines()[-1]
    assert (restored.event, restored.outcome, restored.tags.release) == ("rollback", HEALTHY, "B")
    assert Downtime.from_timings(restored.timings) == Downtime(downtime["total_s"], SERVER_S, PHASES)


def test_a_no_op_deploy_reports_no_downtime() -> None:
    host, _ = serving_the_profile()
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (outcome.action, outcome.downtime) == (Action.unchanged, None)


def test_the_deploy_prints_its_downtime_and_json_carries_it(monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = deployed(timed(a_host()))
    out = io.StringIO()
    monkeypatch.setattr(present, "console", Console(file=out, width=300))
    present.print_outcome(outcome)
    assert "downtime 1m12s: tool 9.5 s, server 1m02s (init 10.0 s, weights 30.0 s, KV cache 2.0 s, cuda graphs " \
           "17.0 s, warmup 2.0 s, first generation 0.5 s)" in out.getvalue()
    document = json.loads(json.dumps(present.jsonable(present.outcome_json(outcome))))
    assert document["downtime"] == {"total_s": 72.0, "server_s": SERVER_S, "tool_s": 9.5, "phases": PHASES}


def status_after(host: TimedHost, where: Target, monkeypatch: pytest.MonkeyPatch) -> str:
    """`status` of the host as the deploy left it: its history lines appended, the new release current."""
    appended = "".join(step.stdin.decode() for step in host.ran
                       if isinstance(step, Step) and step.name == "history: append" and step.stdin)
    had, files = (result.stdout for result in ScriptedHost.run(host, [Step(store.FACT_HISTORY, ("true",)),
                                                                        Step(store.FACT_RELEASE_FILES, ("true",))]))
    [(new, release_json)] = [(put.dest.parent.name.removesuffix(".tmp"), put.data.decode())
                             for put in host.files.values() if put.dest.name == "release.json"]
    host.reply(store.FACT_HISTORY, stdout=had + appended)
    host.reply(store.FACT_RELEASE_DIRS, stdout=release_entries("A", "B", new))
    host.reply(store.FACT_RELEASE_FILES, stdout=files + f"{LAYOUT.releases}/{new}/release.json\0{release_json}\n")
    host.reply(store.FACT_CURRENT, stdout=f"releases/{new}\n")
    host.current = new
    out = io.StringIO()
    monkeypatch.setattr(present, "console", Console(file=out, width=300))
    reports.print_status(read_status(where, "sglang", host))
    return out.getvalue()


def test_status_shows_the_current_releases_last_downtime(monkeypatch: pytest.MonkeyPatch) -> None:
    host = timed(a_host())
    deployed(host)
    assert "last switch: downtime 1m12s: tool 9.5 s, server 1m02s (init 10.0 s" in \
        status_after(host, target(), monkeypatch)


def test_releases_show_each_releases_newest_downtime_and_old_history_lines_stay_readable() -> None:
    """Input tried: a history line written before downtimes were (no `downtime` timing), then r1's restart with one,
    then r2's deploy onto a stopped server (none)."""
    def line(event: str, release: str, **timings: float) -> HistoryEntry:
        entry = history_entry(event, HEALTHY, Tags("u@m", "th1", release, "p", "h"), datetime(2026, 12, 1, tzinfo=UTC),
                              timings=timings)
        return HistoryEntry.from_json(entry.to_json().decode())

    old = HistoryEntry.from_json('{"event": "deploy", "outcome": "healthy", "when": "2026-11-01T00:00:00+00:00", '
                                 '"who": "u@m", "host": "th1", "release": "r0", "profile": "p", "profile_hash": "h", '
                                 '"cause": "", "timings": {"ready": 9.0}, "figures": {}}')
    history = (old, line("restart", "r1", **{"downtime": 75.0, "downtime.server": 62.5, "start.weights": 30.0}),
               line("deploy", "r2", ready=3.0))
    assert downtime_by_release(history) == {"r1": Downtime(75.0, 62.5, {"weights": 30.0})}
