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
