"""The restore after a failed or interrupted start: back to the last healthy release through the same preflight and
ladder as any switch, or the unit stopped."""

from __future__ import annotations

from typing import NoReturn

from deploy_lib.deploy.plan import start_prediction, store_stop_bound_s
from deploy_lib.errors import DeployError, PreflightError, ReadinessFailed, RollbackFailed
from deploy_lib.facts.diagnose import Diagnosis
from deploy_lib.host.switch import Transition, failure_line, recorded_tags, same_kind, stop_unit
from deploy_lib.interrupts import interrupted, signal_name
from deploy_lib.store import FAILED, HEALTHY, StoreFacts


def restore(run: Transition, store: StoreFacts, failed_id: str, failure: DeployError, diagnosis: Diagnosis,
             restore_id: str | None, previous_id: str | None) -> NoReturn:
    """Return the host to `restore_id` after `failed_id` failed or was interrupted; raise what the user must know
    (about `failed_id`, which replaced `previous_id`)."""
    try:
        _switch_back(run, store, failed_id, failure, diagnosis, restore_id)
    except DeployError as ended:
        ended.about(failed_id, previous_id, run.timings)
        raise


def _switch_back(run: Transition, store: StoreFacts, failed_id: str, failure: DeployError, diagnosis: Diagnosis,
                 restore_id: str | None) -> NoReturn:
    """The restore: the target passes the same preflight as any switch and the same ladder, grace window included."""
    where, first = run.where, failure_line(failure, diagnosis)
    if restore_id is None:
        stop_unit(run.remote, run.layout, store_stop_bound_s(store))
        raise same_kind(failure, f"{where}: release {failed_id} failed: {first}; there is no earlier healthy "
                                  "release to roll back to, so the unit is stopped", diagnosis)
    metadata = dict(record.metadata) if (record := store.release(restore_id)) else {}
    tags = recorded_tags(run.target, restore_id, metadata)
    run.restoring = (failed_id, first, restore_id)  # what a lost connection's message says from here on
    try:
        switch = run.kind.switch_batches(run, restore_id, metadata)
    except PreflightError as refused:
        stop_unit(run.remote, run.layout, store_stop_bound_s(store))
        run.record("rollback", FAILED, tags, refused.message)
        raise RollbackFailed(f"{where}: release {failed_id} failed ({first}) and the rollback target {restore_id} "
                             f"cannot run: {refused.message}; the unit is stopped", original=failure,
                             hint=refused.hint) from None
    run.progress.note(f"rolling back to release {restore_id}")
    run.timings = {}
    # sent again on a new connection after a drop: however far an attempt got, the next leaves `current` on the
    # release to return to, restarted; this command's lock (which a drop does not release) keeps others out
    try:
        run.activate(restore_id, metadata, start_prediction(store, tags.profile), run.grace_s, switch.repeatable())
    except ReadinessFailed as second:
        second_diagnosis = run.journal_diagnosis(run.cursor, metadata.get("profile_name"))
        stop_unit(run.remote, run.layout, store_stop_bound_s(store))
        run.record("rollback", FAILED, tags, failure_line(second, second_diagnosis))
        raise RollbackFailed(
            f"{where}: release {failed_id} failed ({first}) and the rollback to {restore_id} "
            f"failed too ({failure_line(second, second_diagnosis)}); the unit is stopped",
            original=failure,
            hint=f"first failure: {diagnosis.hint}\n  rollback failure: {second_diagnosis.hint}") from second
    except KeyboardInterrupt as again:
        state = run.host_state()
        cause = f"interrupted again ({signal_name(again)}) during the rollback to {restore_id}, before it was verified"
        try:
            run.record("rollback", FAILED, tags, cause)
        except (DeployError, KeyboardInterrupt):
            pass  # the host's state, said below, matters more than the history line
        raise interrupted(again, f"{where}: {cause}; the host now: {state}",
                          hint="`invoke status` shows whether it serves; `invoke rollback` or a deploy verifies it"
                          ) from None
    run.record("rollback", HEALTHY, tags, f"after {failed_id} failed: {first}")
    ended = same_kind(failure, f"{where}: release {failed_id} failed: {first}; rolled back, release {restore_id} "
                                "is serving", diagnosis)
    ended.serving_id = restore_id
    raise ended
