"""One user-visible operation on one host, under the host lock: read the facts, plan (pure), run the batches,
report through a Progress. A new one goes here too; its many-host form is deploy_lib/ops/dispatch.py.

    deploy      the deploy engine: deploy, rollback, start, stop
    adopt       take over a server that runs by hand as release 0, and the profile that reproduces it
    status      a host's status in one read
    releases    the releases on a host, and the profile the current one was deployed from
    logs        the server's log, or followed
    host_contents  the host's managed venvs and model revisions
    bench       `invoke bench` against the current release, and recorded benchmarks compared
    tune        `invoke tune`: the sweep on one host (tune_request: what it is asked; tune_candidate: one candidate)
    uninstall   remove what the tool put on a host
    gpu_check   `invoke gpu-check`: topology and all-reduce with the GPUs free, the server restarted after
    patches     `invoke patch`: a patch set enabled, disabled, checked or audited in a venv
"""
