"""Host actions: what reads or changes one host through a Remote, one module per concern. The steps and the
decisions are planning's (the concern packages: facts/, store/, venvs/, ...); here they are sent, and their results
parsed by the planning side.

    facts           the host's facts in one round trip; the crashes since the deploy, recorded in history
    store           the store's read; the host lock, taken at once or with a command's first change
    switch          one command's transition of one host: activate a release, verify it, record it
    restore         back to the last healthy release after a failed start, or the unit stopped
    prune           releases, venvs and weights no kept release uses, after a deploy
    readiness       the readiness ladder after a start (`wait_ready`), the live probe of a running server
    models          weights staged or pushed, listed and pruned
    benchmark       SGLang's serving benchmark on the host; the gate after a deploy
    venv_store      what the store holds of venvs, read in one batch
    venv_publish    what build, adopt and derive share: relocation, the marker, the publishing rename
    venv_build      a venv from a lock; venv_adopt: a hand-made one recorded; venv_derive: a patched copy
    venv_lifecycle  venvs listed and pruned
    p2p_reading     gpu-check's peer-to-peer reads in the VM and on its Proxmox node
    report          the report's read of the host's history
    hooks           the project's hook executables, run on this machine around a deploy or rollback
"""
