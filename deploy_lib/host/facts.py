"""What the tool reads of a host through a Remote: its facts in one round trip (fact_batch, parsed into
HostFacts), and the crashes since the deploy (planned and parsed by facts/crashes.py), recorded in history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from deploy_lib.facts.crashes import (
    Crash,
    CrashReport,
    crash_entry,
    crash_events_step,
    diagnosis_step,
    parse_crashes,
    unit_crashed,
    unrecorded,
)
from deploy_lib.facts.diagnose import diagnose
from deploy_lib.facts.host import FactRequest, HostFacts, UnitFacts, fact_batch, parse_host_facts
from deploy_lib.remote import Put, Remote, Step, StepResult
from deploy_lib.remote.readings import read
from deploy_lib.store import (
    CRASHED,
    HEALTHY,
    StoreFacts,
    StoreLayout,
    Tags,
    append_history,
)


def read_host_facts(remote: Remote, request: FactRequest) -> HostFacts:
    return parse_host_facts(read(remote, fact_batch(request)), request)


def diagnose_crashes(remote: Remote, layout: StoreLayout, crashes: Sequence[Crash]) -> tuple[Crash, ...]:
    """Each crash with its diagnosis, from one round trip."""
    if not crashes:
        return ()
    results: list[StepResult] = remote.run([diagnosis_step(layout, crash) for crash in crashes])
    return tuple(replace(crash, diagnosis=diagnose(reversed(result.stdout.splitlines())))
                 for crash, result in zip(crashes, results, strict=True))


def read_crashes(remote: Remote, layout: StoreLayout, unit: UnitFacts) -> CrashReport | None:
    """The current release's crashes with their diagnoses; None (and no journal read) when there were none."""
    if not unit_crashed(unit):
        return None
    [events] = remote.run([crash_events_step(layout)])
    report = parse_crashes(events.stdout, unit)
    return replace(report, crashes=diagnose_crashes(remote, layout, report.crashes))


def record_crashes(remote: Remote, layout: StoreLayout, store: StoreFacts, report: CrashReport | None) -> int:
    """Append a `crash` history line for each crash of the current release not yet recorded; how many."""
    record = store.release(store.current) if store.current else None
    if report is None or record is None or "tags" not in record.metadata or \
            store.outcomes().get(record.id) not in (HEALTHY, CRASHED):
        return 0  # a release that never came up healthy: its failed start is recorded already
    tags = Tags.from_dict(record.metadata["tags"])
    batch: list[Step | Put] = []
    for index, crash in unrecorded(report, store, record.id):
        batch += append_history(layout, crash_entry(crash, tags, report, index))
    if batch:
        remote.run(batch)
    return len(batch)


def record_new_crashes(remote: Remote, layout: StoreLayout, store: StoreFacts, unit: UnitFacts
                       ) -> CrashReport | None:
    """Read the current release's crashes and add the ones history lacks (before a deploy or rollback replaces
    the release, whose restart count is then gone)."""
    report = read_crashes(remote, layout, unit)
    record_crashes(remote, layout, store, report)
    return report
