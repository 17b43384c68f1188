"""The profile's sections that operations act on (`bench:`, `gate:`, `watch:`, `preflight:`, `venv:`), in the schema
layer.

The operations (deploy_lib/throughput/ runs the benchmark and the gate, deploy_lib/venvs/ builds the venv)
import these models; the schema never imports an operation (tests/test_architecture.py checks the import graph).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# ---------------------------------------------------------------------------------------------------------
# Settings (profile keys `bench:`, `gate:` and `preflight:`)

# A level sends a few rounds of its concurrency, as SGLang's own benchmark scripts size --num-prompts from
# --max-concurrency: the ramp up and down stay a small part of the run, and a low level does not run for hours.
PROMPTS_PER_SLOT = 5
PROMPTS_FLOOR = 32  # a low level's latency percentiles need this many requests at least
WORKLOAD_KEY = "settings.workload"  # in a benchmark's figures: which recorded workload it replayed (its name's CRC)
RANGE_RATIO_KEY = "settings.range_ratio"  # only where not 1: figures from before it existed stay comparable
SHARED_PREFIX_KEY = "settings.shared_prefix_len"  # only where set
OPTIONAL_KEYS = (WORKLOAD_KEY, RANGE_RATIO_KEY, SHARED_PREFIX_KEY)  # a baseline with one the settings lack differs
PROMPTS_PER_GROUP = 16  # generated-shared-prefix: requests sharing one prefix (bench_serving's default)


def workload_key(name: str) -> float:
    """A workload's name as a benchmark's figures keep it (WORKLOAD_KEY): figures are numbers."""
    return float(zlib.crc32(name.encode()))


def measured_on(figures: Mapping[str, float], workload_names: Iterable[str] = ()) -> str:
    """What a benchmark's figures were measured on: `default` (the profile's fixed lengths), `workload NAME` where
    one of `workload_names` is the one it replayed, else `a workload not recorded here`."""
    key = figures.get(WORKLOAD_KEY)
    if key is None:
        return "default"
    return next((f"workload {name}" for name in workload_names if workload_key(name) == key),
                "a workload not recorded here")


class BenchSettings(BaseModel):
    """How the release is benchmarked: SGLang's serving benchmark, random-ids dataset, one run per level."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    prompts: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        1024, description=f"requests per concurrency level at most (--num-prompts): each level sends "
                          f"{PROMPTS_PER_SLOT} times its concurrency, at least {PROMPTS_FLOOR}; at least the highest "
                          "level")
    input_len: Annotated[int, Field(ge=1, le=10_000_000)] = Field(1024, description="prompt tokens per request")
    output_len: Annotated[int, Field(ge=1, le=10_000_000)] = Field(1024, description="output tokens per request")
    concurrency: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=lambda: [64, 1024], min_length=1, description="--max-concurrency levels, one run each")
    backend: Literal["sglang", "sglang-oai"] = Field(
        "sglang", description="sglang: native /generate; sglang-oai: /v1/completions")
    tokenizer: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[A-Za-z0-9._\-/+@:=,~]+$")] | None = (
        Field(None, description="tokenizer directory on the host (default: model.tokenizer, else model.path, "
                                "read offline from the host's Hugging Face cache)"))
    timeout_s: Annotated[int, Field(ge=10, le=24 * 3600)] = Field(3600, description="limit per concurrency level")
    workload: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[A-Za-z0-9._\-/+@:=,~]+$")] | None = (
        Field(None, description="a recorded workload (`workload --name NAME`): its name under inventory/workloads/ or "
                                "a path to its .yaml. The benchmark replays its prompt and output lengths (input_len, "
                                "output_len and range_ratio are then taken from it) at each concurrency level "
                                "([workload](workload.md))"))
    range_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        1.0, description="--random-range-ratio: lengths drawn uniformly between this times input_len / output_len "
                         "and input_len / output_len (1: every request the same); set from the workload when one "
                         "is named")

    shared_prefix_len: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        None, description="tokens of input_len that a group of requests shares as a prefix (SGLang's "
                          "generated-shared-prefix dataset, groups of 16): the recorded cached share of a workload; "
                          "set from the workload when one is named")

    @model_validator(mode="after")
    def _levels_reachable(self) -> BenchSettings:
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError(f"concurrency levels repeat: {self.concurrency}")
        if self.shared_prefix_len is not None and self.shared_prefix_len >= self.input_len:
            raise ValueError(f"shared_prefix_len ({self.shared_prefix_len}) leaves no question in input_len "
                             f"({self.input_len})")
        if self.prompts < max(self.concurrency):
            raise ValueError(f"prompts ({self.prompts}) is below the highest concurrency ({max(self.concurrency)}): "
                             "that level would never run at its concurrency")
        return self

    def prompts_at(self, concurrency: int) -> int:
        """The requests a level sends: PROMPTS_PER_SLOT times its concurrency, at least PROMPTS_FLOOR, at most
        `prompts`; with a shared prefix rounded up to whole groups of PROMPTS_PER_GROUP."""
        prompts = min(self.prompts, max(PROMPTS_FLOOR, PROMPTS_PER_SLOT * concurrency))
        if self.shared_prefix_len is None:
            return prompts
        return -(-prompts // PROMPTS_PER_GROUP) * PROMPTS_PER_GROUP

    def identity(self) -> dict[str, float]:
        """The settings that change the figures; a baseline must match all of them (stored with the figures).
        `settings.sized_levels`: each level sent prompts_at(level), so a run that sent `prompts` at every level (before
        levels were sized) is no baseline for one that did not."""
        identity = {"settings.prompts": float(self.prompts), "settings.input_len": float(self.input_len),
                    "settings.output_len": float(self.output_len),
                    "settings.openai_api": 1.0 if self.backend == "sglang-oai" else 0.0, "settings.sized_levels": 1.0}
        if self.range_ratio != 1.0:
            identity[RANGE_RATIO_KEY] = self.range_ratio
        if self.shared_prefix_len is not None:
            identity[SHARED_PREFIX_KEY] = float(self.shared_prefix_len)
        if self.workload is not None:  # figures of a workload compare only with figures of the same workload
            identity[WORKLOAD_KEY] = workload_key(Path(self.workload).stem)
        return identity

    @property
    def workload_name(self) -> str | None:
        """The recorded workload the benchmark replays (its file's stem), or None for the fixed lengths."""
        return Path(self.workload).stem if self.workload else None

    def describe(self) -> str:
        shape = f"workload {self.workload_name}: " if self.workload_name else ""
        drawn = f", each drawn from {self.range_ratio:.0%}-100% of that" if self.range_ratio != 1.0 else ""
        if self.shared_prefix_len is not None:
            drawn += f", {self.shared_prefix_len} of the prompt shared by groups of {PROMPTS_PER_GROUP}"
        return (f"{shape}{self.prompts} prompts at most of {self.input_len} -> {self.output_len} tokens{drawn} "
                f"({self.backend}), concurrency "
                f"{', '.join(f'{c} ({self.prompts_at(c)} prompts)' for c in self.concurrency)}")


class GateSettings(BaseModel):
    """When a benchmarked release is rolled back: ratios against the last good release at the same settings."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    min_throughput_ratio: Annotated[float, Field(gt=0, le=10)] = Field(
        0.9, description="output throughput must be at least this times the baseline's, at every level")
    max_ttft_p99_ratio: Annotated[float, Field(gt=0, le=100)] = Field(
        1.25, description="p99 time to first token must be at most this times the baseline's, at every level")


class PreflightSettings(BaseModel):
    """What a deploy checks on the host before it starts a release, besides what it always checks."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    gpu_check: bool = Field(
        False, description="when the NCCL environment, the TP size or the venv's torch/NCCL differ from the current "
                           "release's, stop the old server and run gpu-check's verified all-reduce before starting "
                           "the new one; a failure rolls back before SGLang starts (exit 6) "
                           "([gpu-check](gpu-check.md#in-a-deploy-preflightgpu_check))")


class WatchSettings(BaseModel):
    """The watch around a deploy (issue 42): the old release's live traffic read from /metrics over a window before
    the switch, the new release's over a window after it is ready; a regression beyond these bounds, at comparable
    load, rolls the new release back. Needs features.metrics (SGLang's --enable-metrics)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)
    window_s: Annotated[int, Field(ge=10, le=3600)] = Field(
        300, description="seconds of live traffic read before the switch, and again once the new release is ready")
    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        50, description="requests each window must finish to be judged; with fewer, the release is kept and the "
                        "watch says it had too little traffic")
    max_ttft_p99_ratio: Annotated[float, Field(gt=1, le=100)] = Field(
        1.5, description="p99 time to first token after the switch may be at most this times the one before")
    max_inter_token_p99_ratio: Annotated[float, Field(gt=1, le=100)] = Field(
        1.5, description="p99 inter-token latency after the switch may be at most this times the one before")
    max_load_ratio: Annotated[float, Field(gt=1, le=100)] = Field(
        1.5, description="the two windows are compared only when their request rates, and their mean prompt and "
                         "output lengths, are within this factor of each other; otherwise the release is kept and "
                         "the watch says the load was not comparable")


# ---------------------------------------------------------------------------------------------------------
# The profile part


class VenvSpec(BaseModel):
    """How the server's venv is built: a lock (pinned, hashed) and where its wheels come from."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    lock: Path = Field(description="pinned requirements with --hash lines (pip-compile --generate-hashes, "
                                   "uv pip compile --generate-hashes); it must be complete: uv installs it --no-deps")
    wheelhouse: Path | None = Field(None, description="local directory of wheels (and the pinned uv wheel), pushed "
                                                      "to hosts without internet; only missing wheels travel "
                                                      "([venvs](venvs.md))")
    index: str | None = Field(None, description="package index URL the host itself downloads from")
    python: str = Field("python3", description="the host's interpreter that creates the venv")

    @field_validator("python")
    @classmethod
    def _python_is_a_command(cls, value: str) -> str:
        if not re.fullmatch(r"/?[A-Za-z0-9._/+-]+", value) or ".." in value.split("/"):
            raise ValueError("must be a command name (python3) or an absolute path (/usr/bin/python3.11)")
        return value

    @field_validator("index")
    @classmethod
    def _index_is_a_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s]+", value):
            raise ValueError("must be an http(s) URL, e.g. https://pypi.org/simple")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> VenvSpec:
        if (self.wheelhouse is None) == (self.index is None):
            raise ValueError("give exactly one of `wheelhouse` (a local directory) or `index` (a URL)")
        return self
