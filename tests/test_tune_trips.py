"""A sweep's round trips per candidate against the scripted host of tests/test_tune_loop.py (no SSH): beyond its
deploy and its benchmark a candidate costs the round trip of its history line, and the loop reads the store again
only when a failed start leaves it not knowing what serves; the host facts come from the venv the host runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from helpers.deploy_plan import target
from helpers.recording_progress import RecordingProgress
from helpers.tune_loop import BASE, BENCH, MRR, SweepHost, a_sweep_host, request, sglang_knowing_every_flag, sweep

from deploy_lib.commands.tune import _host_view
from deploy_lib.commands.tune_request import Request
from deploy_lib.deploy.plan import BatchKind
from deploy_lib.facts import host as host_facts
from deploy_lib.host.benchmark import STEP_BENCH_MODULE
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import OutputLine, Put, Step, StepResult, round_trips
from deploy_lib.tune import TuneReport, sweep_spec

TRIP = "trip"


class CountingHost(SweepHost):
    """Each batch's round trips, with its steps' names, among the progress events: who sent what, when."""

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        if batch:
            self.progress.events.append((TRIP, (len(round_trips(batch)), tuple(step.name for step in batch))))
        return super().run(batch, on_output)


def counting_host(*vary: str) -> CountingHost:
    host = CountingHost.__new__(CountingHost)
    host.__dict__.update(a_sweep_host(*vary).__dict__)
    return host


def candidate_events(host: SweepHost, tune_id: str) -> list[list[tuple[str, object]]]:
    """The events of each candidate: from its phase to the next phase of the sweep (a switch, the next one, the
    end)."""
    events = host.progress.events
    starts = [i for i, (kind, value) in enumerate(events) if kind == "phase" and str(value).startswith("tune")]
    return [events[start:end] for start, end in zip(starts, [*starts[1:], len(events)], strict=True)
            if str(events[start][1]).startswith(f"tune {tune_id}: candidate ")]


def after_benchmark(events: Sequence[tuple[str, object]]) -> list[tuple[int, tuple[str, ...]]]:
    """The round trips after the candidate's benchmark ended."""
    done = max(i for i, (kind, value) in enumerate(events) if kind == "done" and value[0] == "benchmark")  # type: ignore[index]
    return [value for kind, value in events[done:] if kind == TRIP]  # type: ignore[misc]


def store_reads(events: Sequence[tuple[str, object]]) -> int:
    """Round trips that read the store and nothing else (the deploy's facts read has host facts beside it)."""
    return sum(1 for kind, value in events if kind == TRIP
               and all(name.startswith("store facts:") for name in value[1]))  # type: ignore[index]


def test_a_healthy_candidate_costs_its_deploy_its_benchmark_and_its_history_line() -> None:
    host = counting_host(*MRR)
    report = sweep(host, request(*MRR))
    assert isinstance(report, TuneReport) and report.finished
    *first, last = candidate_events(host, report.tune_id)
    assert len(first) == 2
    for events in first:
        assert after_benchmark(events) == [(1, ("history: append",))], "one round trip: the candidate's line"
        assert store_reads(events) == 0, "what serves is the release it deployed: no read of the store"
    assert after_benchmark(last) == [(1, ("history: append",))] * 2, "its line, then the sweep's end line"
    assert store_reads(last) == 0
    assert [line["tune"]["role"] for line in host.tune_lines()] == ["start", "base", "base", "candidate",
                                                                    "candidate", "candidate", "end"]
    assert host.ran_names().count(STEP_BENCH_MODULE) == 1, "one venv: inspected once for the sweep's 5 benchmarks"


def test_a_candidate_that_fails_to_start_reads_the_store_once_for_its_tags_and_what_serves() -> None:
    vary = ("memory.mem_fraction_static=0.99,0.92",)
    host = counting_host(*vary)
    report = sweep(host, request(*vary))
    assert isinstance(report, TuneReport)
    failed, good = candidate_events(host, report.tune_id)
    assert store_reads(failed) == 1, "the engine's rollback decided what serves: read once, with the failed tags"
    assert [value for kind, value in failed if kind == TRIP][-1] == (1, ("history: append",))
    assert store_reads(good) == 0
    assert report.rows[0].outcome == "failed" and report.serving == host.current


def test_the_sweep_reads_sglang_from_the_venv_the_hosts_inventory_names() -> None:
    """Input tried: the serving release's release.json with no venv recorded, the host's inventory vars `venv:`."""
    host = counting_host(*MRR)
    host.releases = {rid: {**meta, "venv": ""} for rid, meta in host.releases.items()}
    inventory_venv = "/opt/venvs/from inventory"
    default = target()
    on_host = replace(default, host=default.host.model_copy(update={"vars": default.host.vars.model_copy(
        update={"venv": inventory_venv})}))
    assert BASE.profile.service.venv != inventory_venv
    host.progress = RecordingProgress()
    _, view, current = _host_view(host, on_host, BASE, write_caches=True)
    sglang_reads = [step for step in host.ran if getattr(step, "name", "") == host_facts.FACT_SGLANG]
    assert len(sglang_reads) == 1 and str(venv_python(inventory_venv)) in sglang_reads[0].argv, \
        "the host's venv, not the profile's service.venv"
    assert (current, view.sglang_version) == ("B", "0.5.23")


def test_the_base_runs_start_without_reading_the_store_again() -> None:
    host = counting_host(*MRR)
    report = sweep(host, request(*MRR))
    assert isinstance(report, TuneReport)
    base_phase = f"tune {report.tune_id}: the pre-sweep release"
    first_base = next(i for i, (kind, value) in enumerate(host.progress.events)
                      if kind == "phase" and str(value).startswith(base_phase))
    assert store_reads(host.progress.events[:first_base]) == 1, "the store is read once, when the sweep starts"


def before_the_switch(events: Sequence[tuple[str, object]]) -> list[tuple[int, tuple[str, ...]]]:
    """The round trips of a candidate before the one that stages, switches and restarts."""
    switch = next(i for i, (kind, value) in enumerate(events) if kind == "phase" and BatchKind.activate in str(value))
    return [value for kind, value in events[:switch] if kind == TRIP]  # type: ignore[misc]


def test_a_candidates_deploy_reads_the_host_once_before_its_switch_preflight_included() -> None:
    host = counting_host(*MRR)
    report = sweep(host, request(*MRR))
    assert isinstance(report, TuneReport) and report.finished
    for events in candidate_events(host, report.tune_id):
        [(trips, names)] = before_the_switch(events)
        assert trips == 1, "the decision's facts and preflight's in one round trip"
        assert {host_facts.FACT_GPUS, host_facts.FACT_DISK, host_facts.FACT_PORT} <= set(names)


def test_the_sweeps_read_of_sglang_is_the_one_its_candidates_deploys_send_and_a_dry_run_writes_no_cache() -> None:
    """The first read leaves the venv's SGLang facts cached (the write form of the step), so that no candidate's
    deploy starts a Python to read them again; a dry run sends the read-only form."""
    host = counting_host(*MRR)
    assert isinstance(sweep(host, request(*MRR)), TuneReport)
    reads = [step for step in host.ran if getattr(step, "name", "") == host_facts.FACT_SGLANG]
    assert len(reads) == 4 and len({step.argv for step in reads}) == 1, "the sweep's read and 3 deploys' alike"
    assert "write" in reads[0].argv
    planned = counting_host(*MRR)
    sweep(planned, Request(*sweep_spec(None, MRR, {"bench": BENCH}), dry_run=True))
    [dry] = [step for step in planned.ran if getattr(step, "name", "") == host_facts.FACT_SGLANG]
    assert "write" not in dry.argv and "read" in dry.argv


def test_the_sweeps_start_and_its_skipped_candidates_are_recorded_in_one_round_trip() -> None:
    """Input tried: chunked_prefill_size=4096, a flag the host's SGLang does not have (skipped), beside null."""
    vary = ("memory.chunked_prefill_size=null,4096",)
    host = counting_host(*vary)
    sglang_knowing_every_flag(host, BASE)
    report = sweep(host, request(*vary))
    assert isinstance(report, TuneReport)
    first_write = next(value for kind, value in host.progress.events
                       if kind == TRIP and "history: append" in value[1])  # type: ignore[index]
    assert first_write == (1, ("history: append", "history: append"))
    assert [line["tune"]["role"] for line in host.tune_lines()][:2] == ["start", "skipped"]
    assert [row.outcome for row in report.rows] == ["measured", "skipped"]
