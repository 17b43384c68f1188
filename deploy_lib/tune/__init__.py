"""`invoke tune` on one host: a grid of profile settings and patch sets, each candidate a gated, rollback-able
release, measured over a concurrency ladder with SGLang's own benchmark, judged by an objective and an SLA, recorded
in the host's history under the sweep's id.

    spec        the sweep's spec: --vary KEY=V1,V2 or tune/NAME.yaml (benchmark, ladder, objective, SLA, keep)
    sweep       the candidates over the base profile, and those a known rule refuses on this host (pure)
    decide      score, noise, winner, the release to serve next, what a resume still runs (pure)
    estimate    how long it takes, from the host's recorded starts and benchmarks (pure)
    record      the sweep's history lines, and its table read back from them

The command is deploy_lib/commands/tune.py (the sweep on one host), with tune_request.py (what it is asked) and
tune_candidate.py (one candidate deployed, benchmarked, judged, recorded); a group's replicas at once:
deploy_lib/ops/tune_group.py.
"""

from deploy_lib.tune.record import TuneReport, tune_ids
from deploy_lib.tune.spec import Keep, Objective, Sla, TuneSpec, load_spec, parse_vary, sweep_spec
from deploy_lib.tune.sweep import Candidate, Skipped, Sweep

__all__ = [
    "Candidate", "Keep", "Objective", "Skipped", "Sla", "Sweep", "TuneReport", "TuneSpec", "load_spec", "parse_vary",
    "sweep_spec", "tune_ids",
]
