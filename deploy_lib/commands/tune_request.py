"""What a `tune` command asks for (the spec, where each key was given, a dry run, a resume, a group's share) and
what a dry run answers: plain data, so the one-host loop and a group's share of it take the same request."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deploy_lib.host.switch import GRACE_S
from deploy_lib.patches import PatchSet
from deploy_lib.release.model import Change
from deploy_lib.tune.estimate import Estimate
from deploy_lib.tune.spec import Objective, TuneSpec
from deploy_lib.tune.sweep import Sweep


@dataclass(frozen=True)
class Request:
    spec: TuneSpec | None                    # None: a resumed sweep's own, from history
    sources: Mapping[str, str]               # where each varied key was given, for errors
    patch_sets: tuple[PatchSet, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict)
    dry_run: bool = False
    resume: str | None = None                # a sweep's id: run what it has not finished
    grace_s: float = GRACE_S
    tune_id: str | None = None               # a group's sweep: the one id every host records
    share: tuple[str, ...] | None = None     # a group's sweep: the candidates (labels) this host runs; None: all
    stop: Callable[[], bool] | None = None   # a group's sweep: a signal was noted, start no further candidate
    sharing: int = 1                         # a group's sweep: how many hosts run a share at once (the base's
                                             # runs are split over them: their spread is the noise across hosts)


@dataclass(frozen=True)
class Planned:
    """A dry run: the candidates and what differs from the serving release, the skipped ones, the time it takes."""

    sweep: Sweep
    original: str
    changes: Mapping[str, tuple[Change, ...]]
    estimate: Estimate


def unit_of(spec: TuneSpec) -> str:
    return "req/s" if spec.objective is Objective.goodput else "tok/s"
