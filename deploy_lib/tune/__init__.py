"""`invoke tune` on one host: a grid of profile settings and patch sets, each candidate a gated, rollback-able
release, measured over a concurrency ladder with SGLang's own benchmark, judged by an objective and an SLA, recorded
in the host's history under the sweep's id.

    spec        the sweep's spec: --vary KEY=V1,V2 or tune/NAME.yaml (benchmark, ladder, objective, SLA, keep)
    sweep       the candidates over the base profile, and those a known rule refuses on this host (pure)
    decide      score, noise, winner, the release to serve next, what a resume still runs (pure)
    estimate    how long it takes, from the host's recorded starts and benchmarks (pure)
    record      the sweep's history lines, and its table read back from them
    request     what a tune command asks (spec, dry run, resume, a group's share) and what a dry run answers
    candidate   one candidate deployed through the deploy engine, benchmarked, judged and recorded; the sweep run's
                state (what serves, what it wrote) and how it switches (this host, or a multi-node Unit)
    loop        the sweep on one host: the base, the candidates in order (grid or successive halving), the end;
                dry run, resume, show. A group's replicas at once: deploy_lib/ops/tune_group.py
"""

from deploy_lib.tune.record import TuneReport, tune_ids
from deploy_lib.tune.spec import Keep, Objective, Sla, TuneSpec, load_spec, parse_vary, sweep_spec
from deploy_lib.tune.sweep import Candidate, Skipped, Sweep

__all__ = [
    "Candidate", "Keep", "Objective", "Skipped", "Sla", "Sweep", "TuneReport", "TuneSpec", "load_spec", "parse_vary",
    "sweep_spec", "tune_ids",
]
