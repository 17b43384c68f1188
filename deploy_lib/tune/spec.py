"""A sweep's spec: what varies (`--vary KEY=V1,V2` or a `tune/NAME.yaml`), the benchmark, the concurrency ladder,
the objective, the SLA and what to keep; bad input is a ConfigError naming the --vary or the file and the key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deploy_lib.errors import ConfigError
from deploy_lib.profile import format_validation_error
from deploy_lib.profile.overrides import scalar
from deploy_lib.profile.settings import BenchSettings
from deploy_lib.throughput import LevelResult
from deploy_lib.yaml_io import load_yaml_mapping

PATCHES_KEY = "patches"      # `patches=none,fusion-sm120`: the patch set a candidate's venv carries
NO_PATCHES = "none"
DEFAULT_LADDER = (1, 64, 256, 1024)

Value = str | int | float | bool | None
Level = Annotated[int, Field(ge=1, le=1_000_000)]
Millis = Annotated[float, Field(gt=0, le=3_600_000)]


class Objective(StrEnum):
    throughput = "throughput"   # output tok/s at one level of the ladder (default its highest)
    goodput = "goodput"         # the highest request rate over the levels whose p99 figures meet the SLA


class Keep(StrEnum):
    winner = "winner"  # the winner stays serving when it beats the pre-sweep release by more than the noise
    none = "none"      # report only: the pre-sweep release serves again at the end


class Sla(BaseModel):
    """p99 limits a level must meet, in milliseconds; none given: every level meets it."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    ttft_p99: Millis | None = Field(None, description="p99 time to first token, ms")
    tpot_p99: Millis | None = Field(None, description="p99 time per output token, ms")
    itl_p99: Millis | None = Field(None, description="p99 inter-token latency, ms")

    def misses(self, level: LevelResult) -> tuple[str, ...]:
        """The limits `level` misses, as `p99 TTFT 1,300 ms > 1,000 ms`; a figure the benchmark lacks misses."""
        limits = (("TTFT", self.ttft_p99, level.ttft.p99_ms), ("TPOT", self.tpot_p99, level.tpot.p99_ms),
                  ("ITL", self.itl_p99, level.itl.p99_ms))
        return tuple(f"p99 {name} {'n/a' if found is None else f'{found:,.0f}'} ms > {limit:,.0f} ms"
                     for name, limit, found in limits
                     if limit is not None and (found is None or found > limit))

    def describe(self) -> str:
        given = [f"p99 {name} <= {limit:,.0f} ms" for name, limit in
                 (("TTFT", self.ttft_p99), ("TPOT", self.tpot_p99), ("ITL", self.itl_p99)) if limit is not None]
        return ", ".join(given) or "none"


class Search(StrEnum):
    grid = "grid"        # every candidate, the full benchmark
    halving = "halving"  # successive halving: every candidate the short benchmark, the best 1 in eta the full one


class Halving(BaseModel):
    """The short round of `search: halving`: every candidate is a release benchmarked with fewer output tokens; the
    best `1/eta` of them (at least one) run the full benchmark and compete."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    eta: int = Field(2, ge=2, le=16, description="one candidate in eta survives the short round")
    short_output_len: int | None = Field(
        None, ge=1, le=10_000_000,
        description="output tokens per request of the short benchmark (default: a quarter of the full one's)")

    def short_bench(self, bench: BenchSettings) -> BenchSettings:
        output_len = self.short_output_len or max(1, bench.output_len // 4)
        return bench.model_copy(update={"output_len": min(output_len, bench.output_len)})

    def survivors(self, candidates: int) -> int:
        return max(1, -(-candidates // self.eta))


class TuneSpec(BaseModel):
    """tune/NAME.yaml (or the --vary options): the grid, how each candidate is measured and judged."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    vary: dict[str, list[Value]] = Field(min_length=1, description="profile path (or `patches`) -> values to try")
    bench: BenchSettings | None = Field(
        None, description="the benchmark of every run (default: the profile's `bench:`); its levels are `ladder`")
    ladder: list[Level] = Field(default_factory=lambda: list(DEFAULT_LADDER), min_length=1,
                                description="concurrency levels, each benchmarked; clipped to what the profile allows")
    objective: Objective = Objective.throughput
    level: Level | None = Field(None, description="the level the throughput objective reads (default: the highest)")
    sla: Sla = Field(default_factory=Sla)
    keep: Keep = Keep.winner
    search: Search = Search.grid
    halving: Halving = Field(default_factory=Halving, description="the short round of `search: halving`")

    @field_validator("bench", mode="before")
    @classmethod
    def _levels_are_the_ladders(cls, bench: Any) -> Any:
        # BenchSettings checks its prompts against its own levels; a sweep's levels are the ladder, clipped later
        if isinstance(bench, dict) and "concurrency" not in bench:
            return {**bench, "concurrency": [1]}
        return bench

    @field_validator("vary")
    @classmethod
    def _values_listed_once(cls, vary: dict[str, list[Value]]) -> dict[str, list[Value]]:
        for key, values in vary.items():
            if not values:
                raise ValueError(f"{key}: no values to try")
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"{key}: {', '.join(repeated)} listed twice")
        return vary

    @field_validator("ladder")
    @classmethod
    def _levels_distinct(cls, ladder: list[int]) -> list[int]:
        if len(set(ladder)) != len(ladder):
            raise ValueError(f"concurrency levels repeat: {ladder}")
        return sorted(ladder)

    @model_validator(mode="after")
    def _level_on_the_ladder(self) -> TuneSpec:
        if self.level is not None and self.level not in self.ladder:
            raise ValueError(f"level {self.level} is not on the ladder {self.ladder}")
        return self

    def identity(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def parse_vary(texts: Sequence[str]) -> dict[str, list[Value]]:
    """`KEY=V1,V2,...` options -> {KEY: [values]}, values read as YAML scalars; ConfigError names the option."""
    vary: dict[str, list[Value]] = {}
    for text in texts:
        key, equals, listed = text.partition("=")
        key = key.strip()
        where = f"--vary {text!r}"
        if not equals or not key:
            raise ConfigError(f"{where}: write KEY=V1,V2,... (e.g. memory.max_running_requests=64,256,1024)")
        if key in vary:
            raise ConfigError(f"{where}: {key} is varied twice", "give each key once, with all its values")
        items = [item.strip() for item in listed.split(",")]
        if not listed.strip() or any(not item for item in items):
            raise ConfigError(f"{where}: {key} has an empty value", "list the values, separated by commas")
        values = [scalar(item) for item in items]
        repeated = sorted({item for item, value in zip(items, values, strict=True) if values.count(value) > 1})
        if repeated:
            raise ConfigError(f"{where}: {key}: {', '.join(repeated)} listed twice")
        vary[key] = values
    return vary


def load_spec(path: Path) -> TuneSpec:
    """tune/NAME.yaml; ConfigError names the file and the key."""
    raw = load_yaml_mapping(path)
    try:
        return TuneSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(str(path), err, TuneSpec)) from None


def sweep_spec(path: Path | None, vary: Sequence[str], overrides: Mapping[str, Any] | None = None,
               workloads_dir: Path | None = None) -> tuple[TuneSpec, dict[str, str]]:
    """The spec of a `tune` command: the file's (if any) with the --vary keys added, and where each key was given
    (for errors); a key in both is refused. `overrides` are the command's own options (keep, objective...). A
    `bench:` naming a workload gets its lengths from the workload's file under `workloads_dir`."""
    from_file = load_spec(path) if path is not None else None
    given = parse_vary(vary)
    typed = {text.partition("=")[0].strip(): text for text in vary}  # an error names the option as typed
    sources = {key: f"{path}: vary.{key}" for key in (from_file.vary if from_file else {})}
    for key in given:
        if key in sources:
            raise ConfigError(f"--vary {key}=...: {key} is also varied in {path}", "give each key in one place")
        sources[key] = f"--vary {typed[key]}"
    if from_file is None and not given:
        raise ConfigError("tune needs something to vary: --vary KEY=V1,V2,... or --spec tune/NAME.yaml")
    base = from_file.model_dump() if from_file else {}
    try:
        spec = TuneSpec.model_validate({**base, **(overrides or {}), "vary": {**base.get("vary", {}), **given}})
    except ValidationError as err:
        flags = {key: f"--{key}" for key in overrides or {}}
        raise ConfigError(format_validation_error(str(path or "--vary"), err, TuneSpec, flags=flags)) from None
    if spec.bench is not None and spec.bench.workload is not None and workloads_dir is not None:
        from deploy_lib.metrics.workload import bench_with_workload
        spec = spec.model_copy(update={"bench": bench_with_workload(spec.bench, workloads_dir,
                                                                    str(path) if path else None)})
    return spec, sources


def _text(value: Value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def setting_text(key: str, value: Value) -> str:
    return f"{key}={_text(value)}"
