"""What the tool reads of a host, and the pure parsers that make data of it. A new host fact goes here: a
`readings.Fact` (deploy_lib/remote/readings.py: a read-only Step and the parser of its StepResult) in the module
whose decision needs it. The batch is run by deploy_lib/host/facts.py, which also reads and records crashes.

    host          the facts a deploy reads before acting in one batch, HostFacts
    cuda_toolkit  the CUDA toolkit at the release's CUDA_HOME and what FlashInfer's JIT needs of it
    diagnose      startup-failure signatures matched against the unit's journal
    crashes       what systemd's restart policy did to the current release: the journal read planned and parsed
    hand_process  a server run by hand, as `invoke adopt` reads it from /proc
"""
