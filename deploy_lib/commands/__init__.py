"""One user-visible operation on one host, under the host lock: read the facts, plan (pure), run the batches,
report through a Progress. The deploy engine (deploy, rollback, start, stop, prune) is the package deploy/; the
other commands are here, one module each, and a new one goes here too.

    adopt       take over a server that runs by hand as release 0, and the profile that reproduces it
    status      read-only views: status, releases, the server's log
    uninstall   remove what the tool put on a host
    gpu_check   `invoke gpu-check`: topology and all-reduce with the GPUs free, the server restarted after
    patches     `invoke patch`: a patch set enabled, disabled, checked or audited in a venv
"""
