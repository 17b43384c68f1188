"""A start's phases from the server's own log lines (SGLang 0.5.9's and 0.5.23's texts): read by the probe on the host
with the journal's times, recorded in history with the release, shown by `status` and `releases`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from helpers.deploy_plan import target
from helpers.health import SYSTEMCTL, closed_port, fake_tools, run_probe
from helpers.recording_progress import RecordingProgress
from helpers.rollback import READY, a_host, changed_profile

from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.commands.releases import startup_by_release
from deploy_lib.facts.diagnose import unit_matches
from deploy_lib.health import ProbeTarget, Rung, Snapshot, probe_step
from deploy_lib.health.startup import MARKER_PATTERNS, LogMark, startup_line, startup_phases
from deploy_lib.store import FAILED, HEALTHY, HistoryEntry, Tags, history_entry

T0 = 1_764_590_000_000_000  # usec: the restart

def at(seconds: float, text: str) -> LogMark:
    return LogMark(text=text, usec=T0 + int(seconds * 1e6))

# as SGLang 0.5.23 writes them (model_runner.py, memory_pool.py, cuda_graph_setup.py, http_server.py), two TP ranks
SGLANG_0_5_23 = (
    at(0.0, "Started sglang.service - SGLang server (glm5)."),
    at(14.0, "[2026-12-01 10:00:14 TP0] Load weight begin. avail mem=93.21 GB"),
    at(14.2, "[2026-12-01 10:00:14 TP1] Load weight begin. avail mem=93.21 GB"),
    at(143.5, "[2026-12-01 10:02:23 TP0] Load weight end. elapsed=129.50 s, type=GlmMoeDsaForCausalLM, "
              "avail mem=40.10 GB, mem usage=53.11 GB."),
    at(144.0, "[2026-12-01 10:02:24 TP1] Load weight end. elapsed=129.80 s, type=GlmMoeDsaForCausalLM, "
              "avail mem=40.10 GB, mem usage=53.11 GB."),
    at(147.0, "[2026-12-01 10:02:27 TP0] KV Cache is allocated. #tokens: 1048576, KV size: 27.00 GB"),
    at(148.0, "[2026-12-01 10:02:28 TP0] Capture target decode CUDA graph begin. backend=full, "
              "num_tokens_per_req=1, avail mem=12.10 GB"),
    at(213.0, "[2026-12-01 10:03:33 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=65.00 s, "
              "mem usage=1.17 GB, avail mem=10.93 GB."),
    at(220.0, "[2026-12-01 10:03:40] The server is fired up and ready to roll!"),
)
# 0.5.9's capture lines (model_runner.py init_device_graphs)
SGLANG_0_5_9_GRAPHS = (
    at(148.0, "[2026-12-01 10:02:28 TP0] Capture cuda graph begin. This can take up to several minutes. "
              "avail mem=12.10 GB"),
    at(213.0, "[2026-12-01 10:03:33 TP0] Capture cuda graph end. Time elapsed: 65.00 s. mem usage=1.17 GB. "
              "avail mem=10.93 GB."),
)

def test_the_phases_of_a_start_come_from_the_first_begin_and_the_last_end_line_of_any_rank() -> None:
    phases = startup_phases(SGLANG_0_5_23, first_generation_s=0.21)
    assert phases == {"init": 14.0, "weights": 130.0, "kv_cache": 3.0, "cuda_graphs": 65.0, "warmup": 7.0,
                      "first_generation": 0.21}

def test_sglang_0_5_9_capture_lines_mark_the_cuda_graph_phase_as_well() -> None:
    older = (*SGLANG_0_5_23[:6], *SGLANG_0_5_9_GRAPHS, SGLANG_0_5_23[-1])
    assert startup_phases(older, None)["cuda_graphs"] == 65.0

def test_a_phase_whose_line_is_missing_is_unknown_never_guessed() -> None:
    """Input tried: the log without its "Load weight end." lines (and no generation timed)."""
    without_end = tuple(mark for mark in SGLANG_0_5_23 if "Load weight end" not in mark.text)
    phases = startup_phases(without_end, None)
    assert "weights" not in phases and "kv_cache" not in phases and "first_generation" not in phases
    assert phases["cuda_graphs"] == 65.0
    timings = {f"start.{name}": seconds for name, seconds in phases.items()}
    assert startup_line(timings) == "weights unknown, cuda graphs 1m05s, first generation unknown"
    assert startup_line({}) == "", "a start recorded before phases were: nothing to say"

def test_the_status_line_of_a_start_reads_as_a_person_would_say_it() -> None:
    timings = {"start.weights": 130.0, "start.cuda_graphs": 65.0, "start.first_generation": 0.21}
    assert startup_line(timings) == "weights 2m10s, cuda graphs 1m05s, first generation 0.2 s"

JOURNAL = "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"{directory}/journalctl.args\"\n" + "".join(
    f"echo '{json.dumps(entry)}'\n" for entry in (
        {"__CURSOR": "s=a;i=30", "__REALTIME_TIMESTAMP": str(T0), "MESSAGE": "Started sglang.service - SGLang."},
        {"__CURSOR": "s=a;i=31", "__REALTIME_TIMESTAMP": str(T0 + 5), "MESSAGE": "[x TP0] Init torch distributed"},
        {"__CURSOR": "s=a;i=32", "__REALTIME_TIMESTAMP": str(T0 + 14_000_000),
         "MESSAGE": list(b"[x TP0] Load weight begin. avail mem=93.21 GB")},
        {"__CURSOR": "s=a;i=33", "__REALTIME_TIMESTAMP": str(T0 + 15_000_000),
         "MESSAGE": "[x TP0] Loading safetensors checkpoint shards:  25% Completed"}))

def test_the_probe_sends_back_every_marked_line_since_its_cursor_with_the_journals_time(tmp_path: Path) -> None:
    """Input tried: four entries after the cursor, one of them non-UTF-8-safe bytes (journald's list form)."""
    path = fake_tools(tmp_path, systemctl=SYSTEMCTL, journalctl=JOURNAL)
    target = ProbeTarget(unit="sglang.service", port=closed_port())
    step = probe_step(target, Rung.GENERATE, after_cursor="s=a;i=2f", marks=MARKER_PATTERNS)
    snap = Snapshot.model_validate(run_probe(step, path))
    assert [(mark.text[:20], mark.usec) for mark in snap.marks] == [
        ("Started sglang.servi", T0), ("[x TP0] Load weight ", T0 + 14_000_000)]
    assert snap.last_log is not None and snap.last_log.cursor == "s=a;i=33", "the newest line, from the same read"
    assert (tmp_path / "journalctl.args").read_text().splitlines() == [
        "-o", "json", "--no-pager", "-q", "--after-cursor=s=a;i=2f", *unit_matches("sglang.service")]

def test_a_cursor_journald_no_longer_knows_still_gives_the_newest_line(tmp_path: Path) -> None:
    """Input tried: journalctl failing on --after-cursor (exit 1), as for a cursor of a vacuumed journal file."""
    fails_on_cursor = 'case "$*" in *--after-cursor*) exit 1;; esac; '
    failing = JOURNAL.replace("printf '%s\\n' \"$@\"", fails_on_cursor + "printf '%s\\n' \"$@\"")
    path = fake_tools(tmp_path, systemctl=SYSTEMCTL, journalctl=failing)
    target = ProbeTarget(unit="sglang.service", port=closed_port())
    step = probe_step(target, Rung.GENERATE, after_cursor="s=gone;i=1", marks=MARKER_PATTERNS)
    snap = Snapshot.model_validate(run_probe(step, path))
    assert snap.marks == () and snap.last_log is not None and snap.last_log.cursor == "s=a;i=33"
    assert snap.journal_error == "journalctl --after-cursor exited 1: no startup lines"


def test_a_deploy_records_its_start_phases_and_ladder_times_in_the_history_line() -> None:
    """The probe's snapshots carry the start's log lines (as the probe sends them back) and a timed generation."""
    host = a_host()

    class Serving(dict):  # type: ignore[type-arg]
        def __missing__(self, release_id: str) -> list[object]:
            return [{**READY, "marks": [mark.model_dump() for mark in SGLANG_0_5_23],
                     "generation": {"status": 200, "text": " Paris", "seconds": 0.21}}]

    host.probes = Serving()
    deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    [line] = [json.loads(step.stdin) for step in host.ran if getattr(step, "name", "") == "history: append"]
    assert (line["event"], line["outcome"]) == ("deploy", HEALTHY)
    timings = line["timings"]
    assert (timings["start.weights"], timings["start.cuda_graphs"], timings["start.first_generation"]) == \
        (130.0, 65.0, 0.21)
    assert {"ready.unit", "ready.port", "ready.health", "ready.generate"} <= set(timings)

def test_releases_and_status_show_a_releases_newest_start_that_recorded_phases() -> None:
    """Input tried: r1's deploy with phases, then a restart of r1 recorded before phases were (no start.* timings),
    and a failed start of r2 that logged nothing."""
    def line(event: str, outcome: str, release: str, **timings: float) -> HistoryEntry:
        return history_entry(event, outcome, Tags("u@m", "th1", release, "p", "h"), datetime(2026, 12, 1, tzinfo=UTC),
                             timings=timings)

    history = (line("deploy", HEALTHY, "r1", **{"start.weights": 130.0, "start.cuda_graphs": 65.0}),
               line("restart", HEALTHY, "r1", ready=9.0), line("deploy", FAILED, "r2", ready=3.0))
    assert startup_by_release(history) == {"r1": "weights 2m10s, cuda graphs 1m05s, first generation unknown"}
