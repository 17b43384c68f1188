"""The operations: what a command does to its hosts, one host or many, above the one-host commands
(deploy_lib/commands).

    scope              which hosts (--host, --group), how they are reached (connections, progress, consent), the one
                       runner every command goes through
    dispatch           each command for a scope: deploy, rollback, start, stop, restart, uninstall, gpu-check, status,
                       releases, logs
    fleet              rollouts (--serial, --max-fail), the multi-host runner, the per-host result table
    multinode          a multi-node release's ranks and rendezvous (pure); multinode_deploy, multinode_switch: its
                       deploy and rollback as one
    router             SGLang's router in front of replicas (pure, and its drain); router_deploy: its release and
                       the drain around a replica's transition
"""
