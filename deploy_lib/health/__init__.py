"""The readiness ladder: unit active and not restarted -> port open -> health endpoint 200 -> a real generation.

Every attempt is ONE remote step: deploy_lib/host_scripts/probe.py runs on the host under `python3 -`, looks at all
rungs every 50 ms and returns a JSON snapshot as soon as anything the verdict depends on changes (or after
`WATCH_S`), so a crash or "ready" is noticed within a poll of the host, not a round trip plus a backoff. Deciding
is pure (`assess`); waiting is a tenacity policy value (`ladder_policy`); `wait_ready` (deploy_lib/host/readiness.py)
joins them and reports through a Progress.

    snapshot    the rungs and what one probe saw (Snapshot)
    verdict     deciding one snapshot: Ready, NotReady (retry), UnitFailed or ProbeRejected (stop now); the
                start-time prediction
    probe       where and how a server is probed, the probe's step and its output parsed
    startup     a start's phases from SGLang's log lines
"""

from deploy_lib.health.probe import (
    POLL_S,
    WATCH_S,
    GenerationProbe,
    ProbeTarget,
    http_url,
    parse_snapshot,
    probe_step,
    reachable_host,
)
from deploy_lib.health.snapshot import Rung, Snapshot
from deploy_lib.health.verdict import (
    NotReady,
    ProbeRejected,
    Ready,
    StartPrediction,
    UnitFailed,
    Verdict,
    assess,
    predict_start,
)

__all__ = [
    "POLL_S", "WATCH_S", "GenerationProbe", "NotReady", "ProbeRejected", "ProbeTarget", "Ready", "Rung", "Snapshot",
    "StartPrediction", "UnitFailed", "Verdict", "assess", "http_url", "parse_snapshot", "predict_start", "probe_step",
    "reachable_host",
]
