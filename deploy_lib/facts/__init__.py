"""What the tool reads of a host, and the pure parsers that make data of it. A new host fact goes here: a
`readings.Fact` (a read-only Step and the parser of its StepResult) in the module whose decision needs it.

    readings      Fact and Readings: a batch of host reads and its results (transport)
    host          the facts a deploy reads before acting in one batch, HostFacts (planning)
    read          read_host_facts: that batch run through a Remote (a host action)
    cuda_toolkit  the CUDA toolkit at the release's CUDA_HOME and what FlashInfer's JIT needs of it
    diagnose      startup-failure signatures matched against the unit's journal
    crashes       what systemd's restart policy did to the current release, read from the journal and recorded
    hand_process  a server run by hand, as `invoke adopt` reads it from /proc
"""
