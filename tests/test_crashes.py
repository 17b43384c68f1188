"""Crashes after the deploy, from systemd 252's own journal messages (tests/data/journal: captured in the sandbox
guest from a unit with Restart=on-failure, RestartSec=1, StartLimitBurst=3: two crash loops that hit the start
limit, each after a start by hand, then one SIGKILL that systemd restarted)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest
from helpers.crashes import EVENTS, GAVE_UP, LOOP_GAVE_UP, crash_loop_status, diagnosed, unit
from helpers.fake_remote import FakeRemote
from rich.console import Console

from deploy_cli import present as ui
from deploy_cli import reports
from deploy_lib.facts.crashes import crash_loop_advice, diagnosis_step, parse_crashes, unit_crashed
from deploy_lib.host.facts import read_crashes, record_crashes
from deploy_lib.store import (
    FAILED,
    HEALTHY,
    RESTARTED,
    HistoryEntry,
    ReleaseRecord,
    StoreFacts,
    StoreLayout,
    Tags,
    history_entry,
    parse_history,
)

FIRST_CRASH_PENDING = "\n".join(EVENTS[:7])  # first crash, systemd waiting RestartSec before the restart
ALL = "\n".join(EVENTS)                      # ... then the SIGKILL, restarted and running again
LAYOUT = StoreLayout("sglang")
ILLEGAL_ACCESS = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"


def test_a_crash_loop_that_hit_the_start_limit_is_four_crashes_and_three_restarts() -> None:
    report = parse_crashes(LOOP_GAVE_UP, GAVE_UP)
    assert report.gave_up and report.down and len(report.crashes) == 4
    assert report.restarts_done() == 3
    assert [c.exit for c in report.crashes] == ["exit status 1"] * 4
    assert report.crashes[0].at_us == 1796059871864300 and report.crashes[0].started_us == 1796059870261729
    assert report.verdict is not None and report.verdict.startswith("gave up after 3 restarts: exit status 1")


def test_only_the_crashes_since_the_last_start_by_hand_count() -> None:
    report = parse_crashes(ALL, unit("active", "running", 1))
    assert not report.down and not report.gave_up
    assert [(c.exit, c.result, c.restarted) for c in report.crashes] == [("killed by SIGKILL", "signal", True)]
    assert report.verdict == "systemd restarted it after 1 crash(es)"
    assert report.crashes[0].cause == "killed by SIGKILL (no known failure signature in the log)"


def test_a_crash_waiting_for_its_restart_is_counted_before_nrestarts_is() -> None:
    report = parse_crashes(FIRST_CRASH_PENDING, unit("activating", "auto-restart", 0, "exit-code"))
    assert len(report.crashes) == 1 and report.crashes[0].restarted and not report.down
    assert report.verdict == "crash 1 since the deploy; systemd restarts it after service.restart_sec"


def test_restart_no_leaves_one_crash_down_without_giving_up() -> None:
    report = parse_crashes(FIRST_CRASH_PENDING, unit("failed", "failed", 0, "exit-code"))
    assert report.down and not report.gave_up and len(report.crashes) == 1
    assert report.verdict is not None and "not restarted" in report.verdict


def test_a_unit_that_never_crashed_reads_no_journal() -> None:
    remote = FakeRemote()
    assert read_crashes(remote, LAYOUT, unit("active", "running", 0)) is None
    assert remote.batches == []
    assert unit_crashed(unit("inactive", "dead", 0)) is False


def test_each_crash_is_diagnosed_from_the_lines_of_its_own_start() -> None:
    remote = FakeRemote()
    remote.reply(lambda step: "crash events" in step.name, stdout=LOOP_GAVE_UP)
    # journalctl -r prints newest first
    remote.reply(lambda step: "up to the crash" in step.name,
                 stdout=f"sglang.service: Failed with result 'exit-code'.\n{ILLEGAL_ACCESS}\nready\nstarting\n")
    report = read_crashes(remote, LAYOUT, GAVE_UP)
    assert report is not None and len(remote.batches) == 2 and len(remote.batches[1]) == 4
    assert {c.diagnosis.signature for c in report.crashes if c.diagnosis} == {"cuda_runtime_error"}
    assert report.verdict == ("gave up after 3 restarts: exit status 1: a CUDA kernel failed while running: an "
                                "illegal memory access was encountered [cuda_runtime_error]")
    step = diagnosis_step(LAYOUT, report.crashes[1])
    assert {"--since=@1796059872.922184", "--until=@1796059874.078321"} <= set(step.argv)
    assert "-r" in step.argv and step.sudo


TAGS = Tags(who="ops@laptop", host="th1", release="r2", profile="glm5-nvfp4", profile_hash="h",
            versions={"sglang": "0.5.23"})
WHEN = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def store_of(releases: list[str], current: str, history: list[HistoryEntry]) -> StoreFacts:
    records = tuple(ReleaseRecord(r, "2026-11-30T00:00:00+00:00", {"tags": {**TAGS.as_dict(), "release": r}})
                    for r in releases)
    return StoreFacts(current=current, releases=records, incomplete=(), history=tuple(history), lock=None)


def test_history_gets_one_crash_line_per_crash_and_never_twice() -> None:
    report = diagnosed(parse_crashes(LOOP_GAVE_UP, GAVE_UP))
    history = [history_entry("deploy", HEALTHY, TAGS, WHEN)]
    remote = FakeRemote()
    store = store_of(["r1", "r2"], "r2", history)
    assert record_crashes(remote, LAYOUT, store, report) == 4
    lines = [json.loads(step.stdin) for batch in remote.batches for step in batch]
    assert [(line["event"], line["outcome"]) for line in lines] == [("crash", RESTARTED)] * 3 + [("crash", FAILED)]
    assert lines[-1]["cause"].startswith("gave up after 3 restarts: exit status 1: a CUDA kernel failed")
    assert lines[0]["when"] == "2026-11-30T17:31:11.864300+00:00" and lines[0]["release"] == "r2"
    recorded, _ = parse_history("".join(step.stdin.decode() for batch in remote.batches for step in batch))
    again = FakeRemote()
    assert record_crashes(again, LAYOUT, store_of(["r1", "r2"], "r2", history + list(recorded)), report) == 0
    assert again.batches == []


def test_a_release_left_down_by_crashes_is_no_longer_the_last_healthy_one() -> None:
    r1 = Tags(**{**TAGS.as_dict(), "release": "r1"})
    gave_up = history_entry("crash", FAILED, TAGS, WHEN, "gave up after 3 restarts: x")
    store = store_of(["r1", "r2"], "r2", [history_entry("deploy", HEALTHY, r1, WHEN),
                                          history_entry("deploy", HEALTHY, TAGS, WHEN), gave_up])
    assert store.last_healthy() == "r1"
    assert store.outcomes() == {"r1": HEALTHY, "r2": "crashed"}, "`invoke releases` shows it"
    assert store_of(["r1", "r2"], "r2", [history_entry("deploy", HEALTHY, r1, WHEN), gave_up,
                                         history_entry("deploy", HEALTHY, TAGS, WHEN)]).last_healthy() == "r2"


def test_a_crash_loop_names_the_rollback_and_its_target() -> None:
    report = parse_crashes(LOOP_GAVE_UP, GAVE_UP)
    r1 = Tags(**{**TAGS.as_dict(), "release": "r1"})
    store = store_of(["r1", "r2"], "r2", [history_entry("deploy", HEALTHY, r1, WHEN),
                                          history_entry("deploy", HEALTHY, TAGS, WHEN)])
    assert crash_loop_advice(report, store) == ("release r2 is down after 4 crash(es); `invoke rollback` returns "
                                                "to release r1, the last healthy one")
    alone = store_of(["r2"], "r2", [history_entry("deploy", HEALTHY, TAGS, WHEN)])
    assert "no earlier healthy release" in str(crash_loop_advice(report, alone))
    running = parse_crashes(ALL, unit("active", "running", 1))
    assert crash_loop_advice(running, store) is None


def test_status_of_a_crash_loop_prints_the_count_the_last_crash_the_verdict_and_the_way_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=out, width=200))
    reports.print_status(crash_loop_status())
    lines = out.getvalue().splitlines()
    assert "unit failed/failed (NRestarts=4 since the deploy); port closed" in lines
    assert "last crash 2026-11-30 17:31:18 UTC: exit status 1: a CUDA kernel failed [cuda_runtime_error]" in lines
    assert "gave up after 3 restarts: exit status 1: a CUDA kernel failed [cuda_runtime_error]" in lines
    assert "release r2 is down after 4 crash(es); `invoke rollback` returns to release r1" in lines


def test_status_of_a_crash_loop_as_json_carries_times_causes_and_the_verdict() -> None:
    data = json.loads(json.dumps(ui.jsonable(crash_loop_status())))
    assert data["crashes"]["verdict"].startswith("gave up after 3 restarts: ")
    assert data["crashes"]["last"]["when"] == "2026-11-30T17:31:18.410325+00:00"
    assert [c["restarted"] for c in data["crashes"]["crashes"]] == [True] * 4
