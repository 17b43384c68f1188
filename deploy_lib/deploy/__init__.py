"""The deploy engine of one host: plan -> preflight -> stage -> switch -> restart -> verify -> commit, or roll back.

Planning and preflight are pure functions of the profile and the host facts; `Transition.activate` is the one path
that switches a host to a release and verifies it, used by deploy, by the automatic rollback, by `invoke rollback`
and `invoke start`.

    plan        the Plan of a release and its batches (stage, switch and restart, once verified), drift, the
                hand-run server of an adopted release
    preflight   read-only checks that the host can run a release, new or recorded
    switch      one command's transition of one host (activate, record)
    restore     the restore after a failed start: back to the last healthy release, or the unit stopped
    prune       the prune after a deploy, decided from one read
    engine      the commands: deploy, rollback, start, stop
"""

from deploy_lib.deploy.engine import (
    Options,
    Outcome,
    PatchedVenv,
    SweepCandidate,
    choose_venv,
    deploy,
    releases_to_keep,
    rollback,
    stage_weights,
    start,
    stop,
)
from deploy_lib.deploy.plan import (
    Batch,
    BatchKind,
    Plan,
    PlanBatches,
    SwitchBatches,
    VenvChoice,
    activation_steps,
    detect_drift,
    hand_run_check,
    hand_run_pid,
    keep_replaced_unit,
    plan_against,
    plan_deploy,
    recorded_switch,
    release_tags,
    reset_failed_step,
    restart_steps,
    start_prediction,
    stop_step,
    switch_batches,
)
from deploy_lib.deploy.preflight import check_release, check_release_files, preflight
from deploy_lib.deploy.prune import prune
from deploy_lib.deploy.restore import restore
from deploy_lib.deploy.switch import (
    GRACE_S,
    Readiness,
    Transition,
    failure_line,
    interruption,
    probe_target,
    recorded_tags,
    same_kind,
)

__all__ = ["GRACE_S", "Batch", "BatchKind", "Options", "Outcome", "PatchedVenv", "Plan", "PlanBatches", "Readiness",
           "SweepCandidate", "SwitchBatches", "Transition", "VenvChoice", "activation_steps", "check_release",
           "check_release_files", "choose_venv", "deploy", "detect_drift", "failure_line", "hand_run_check",
           "hand_run_pid", "interruption", "keep_replaced_unit", "plan_against", "plan_deploy", "preflight",
           "probe_target", "prune", "recorded_switch", "recorded_tags", "release_tags", "releases_to_keep",
           "reset_failed_step", "restart_steps", "restore", "rollback", "same_kind", "stage_weights", "start",
           "start_prediction", "stop", "stop_step", "switch_batches"]
