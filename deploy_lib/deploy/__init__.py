"""A deploy's planning: which targets a project resolves to, the release a profile and the host facts make, and
the checks before it runs. Pure; the deploy itself is deploy_lib/commands/deploy.py, the switch, restore and prune
it runs are in deploy_lib/host/.

    plan        the Plan of a release and its batches (stage, switch and restart, once verified), drift, the
                hand-run server of an adopted release
    preflight   read-only checks that the host can run a release, new or recorded
    project     where a project's profiles and inventories are, and a (profile, inventory, host) choice resolved
"""
