"""What a benchmark measured (levels, latencies, GPU telemetry), the figures history.jsonl keeps of it, and the
parsers of the benchmark's JSONL and the sampler's CSV."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from deploy_lib.facts.host import Gpu, parse_gpus
from deploy_lib.json_lines import json_objects
from deploy_lib.profile.settings import RANGE_RATIO_KEY, SHARED_PREFIX_KEY, BenchSettings
from deploy_lib.remote import Step, StepResult

WALL_KEY = "bench.wall_s"  # a run's wall time in history: its timed levels plus what each level costs around them


@dataclass(frozen=True)
class Latency:
    mean_ms: float | None
    median_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class LevelResult:
    """One run of the benchmark at one concurrency, as its JSONL line reports it."""

    concurrency: int
    completed: int
    duration_s: float
    output_tok_s: float
    ttft: Latency
    itl: Latency
    tpot: Latency = Latency(None, None, None)  # time per output token, after the first

    @property
    def request_rate(self) -> float:
        """Completed requests per second (0 for a run that reports no duration)."""
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class GpuTelemetry:
    index: int
    name: str
    samples: int
    power_mean_w: float | None
    power_peak_w: float | None
    power_limit_w: float | None
    util_mean_pct: float | None
    util_peak_pct: float | None
    memory_peak_mib: float
    memory_total_mib: float

    def line(self) -> str:
        def watts(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.0f} W"
        limit = f" of {watts(self.power_limit_w)}" if self.power_limit_w else ""
        util = "n/a" if self.util_mean_pct is None else f"{self.util_mean_pct:.0f}% (peak {self.util_peak_pct:.0f}%)"
        return (f"GPU {self.index}: power mean {watts(self.power_mean_w)}, peak {watts(self.power_peak_w)}{limit}; "
                f"utilization {util}; memory peak {self.memory_peak_mib:.0f} of {self.memory_total_mib:.0f} MiB")


@dataclass(frozen=True)
class BenchResult:
    release_id: str
    settings: BenchSettings
    levels: tuple[LevelResult, ...] = ()
    gpus: tuple[GpuTelemetry, ...] = ()
    error: str | None = None            # the benchmark did not run to the end: why
    telemetry_error: str | None = None  # no GPU samples: why (does not fail the benchmark)
    wall_s: float | None = None         # the whole run: each level's client, the sampler, reading the results back

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.levels)

    def level(self, concurrency: int) -> LevelResult | None:
        return next((level for level in self.levels if level.concurrency == concurrency), None)

    def figures(self) -> dict[str, float]:
        """Flat figures for history.jsonl: the settings identity, then c<level>.<metric>, then gpu<i>.<metric>."""
        figures = dict(self.settings.identity())
        if self.wall_s is not None:
            figures[WALL_KEY] = round(self.wall_s, 3)
        for level in self.levels:
            values = {"output_tok_s": level.output_tok_s, "completed": float(level.completed),
                      "duration_s": level.duration_s,
                      "ttft_mean_ms": level.ttft.mean_ms, "ttft_median_ms": level.ttft.median_ms,
                      "ttft_p99_ms": level.ttft.p99_ms,
                      "itl_mean_ms": level.itl.mean_ms, "itl_median_ms": level.itl.median_ms,
                      "itl_p99_ms": level.itl.p99_ms,
                      "tpot_mean_ms": level.tpot.mean_ms, "tpot_median_ms": level.tpot.median_ms,
                      "tpot_p99_ms": level.tpot.p99_ms}
            figures |= {f"c{level.concurrency}.{k}": round(v, 3) for k, v in values.items() if v is not None}
        for gpu in self.gpus:
            values = {"power_mean_w": gpu.power_mean_w, "power_peak_w": gpu.power_peak_w,
                      "power_limit_w": gpu.power_limit_w, "util_mean_pct": gpu.util_mean_pct,
                      "memory_peak_mib": gpu.memory_peak_mib}
            figures |= {f"gpu{gpu.index}.{k}": round(v, 1) for k, v in values.items() if v is not None}
        return figures

    @classmethod
    def from_figures(cls, release_id: str, figures: Mapping[str, float], error: str | None = None) -> BenchResult:
        """Rebuild the levels and settings identity of a history entry (GPU telemetry is not needed again)."""
        levels = sorted({int(key[1:].split(".", 1)[0]) for key in figures
                         if key.startswith("c") and key[1:].split(".", 1)[0].isdigit()})

        def value(key: str) -> float | None:
            return figures.get(key)

        results = []
        for c in levels:
            if value(f"c{c}.output_tok_s") is None:
                continue
            results.append(LevelResult(
                concurrency=c, completed=int(value(f"c{c}.completed") or 0),
                duration_s=value(f"c{c}.duration_s") or 0.0, output_tok_s=figures[f"c{c}.output_tok_s"],
                ttft=Latency(value(f"c{c}.ttft_mean_ms"), value(f"c{c}.ttft_median_ms"), value(f"c{c}.ttft_p99_ms")),
                itl=Latency(value(f"c{c}.itl_mean_ms"), value(f"c{c}.itl_median_ms"), value(f"c{c}.itl_p99_ms")),
                tpot=Latency(value(f"c{c}.tpot_mean_ms"), value(f"c{c}.tpot_median_ms"),
                             value(f"c{c}.tpot_p99_ms"))))
        prompts = int(figures.get("settings.prompts", max(levels, default=1)))
        settings = BenchSettings.model_construct(
            prompts=prompts, input_len=int(figures.get("settings.input_len", 0)),
            output_len=int(figures.get("settings.output_len", 0)), concurrency=[r.concurrency for r in results],
            backend="sglang-oai" if figures.get("settings.openai_api") else "sglang", tokenizer=None,
            timeout_s=3600, workload=None, range_ratio=figures.get(RANGE_RATIO_KEY, 1.0),
            shared_prefix_len=int(figures[SHARED_PREFIX_KEY]) if SHARED_PREFIX_KEY in figures else None)
        return cls(release_id=release_id, settings=settings, levels=tuple(results), error=error)

    def summary(self) -> str:
        """One line: throughput per level (also of a run the gate failed), or why there is none."""
        if not self.levels:
            return f"benchmark failed: {self.error}"
        return ", ".join(f"{level.output_tok_s:,.0f} tok/s @{level.concurrency}" for level in self.levels)


def parse_level(jsonl: str, concurrency: int, prompts: int) -> LevelResult:
    """The last JSON object of a benchmark's --output-file; ValueError names what is missing or wrong."""
    records = [record for record in json_objects(jsonl) if "output_throughput" in record]
    if not records:
        raise ValueError("the benchmark wrote no result line to its JSONL file")
    record = records[-1]

    def number(key: str, required: bool = True) -> float | None:
        raw = record.get(key)
        if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
            return float(raw)
        if required:
            raise ValueError(f"the result line has no usable {key!r} (got {raw!r})")
        return None

    completed = int(number("completed") or 0)
    if completed < prompts:
        raise ValueError(f"only {completed} of {prompts} requests completed at concurrency {concurrency}")
    output = number("output_throughput")
    assert output is not None
    return LevelResult(
        concurrency=concurrency, completed=completed, duration_s=number("duration") or 0.0, output_tok_s=output,
        ttft=Latency(number("mean_ttft_ms"), number("median_ttft_ms"), number("p99_ttft_ms")),
        itl=Latency(*(number(f"{kind}_itl_ms", required=False) for kind in ("mean", "median", "p99"))),
        tpot=Latency(*(number(f"{kind}_tpot_ms", required=False) for kind in ("mean", "median", "p99"))))


def parse_telemetry(csv_text: str) -> tuple[GpuTelemetry, ...]:
    """Mean and peak per GPU over every sample nvidia-smi appended (rows as facts.GPU_FIELDS)."""
    rows, _ = parse_gpus(StepResult(Step("telemetry", ("true",)), 0, csv_text, "", 0.0))
    by_index: dict[int, list[Gpu]] = {}
    for gpu in rows or ():
        by_index.setdefault(gpu.index, []).append(gpu)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    telemetry = []
    for index, samples in sorted(by_index.items()):
        power = [g.power_draw_w for g in samples if g.power_draw_w is not None]
        util = [g.utilization_pct for g in samples if g.utilization_pct is not None]
        limits = [g.power_limit_w for g in samples if g.power_limit_w is not None]
        telemetry.append(GpuTelemetry(
            index=index, name=samples[0].name, samples=len(samples), power_mean_w=mean(power),
            power_peak_w=max(power, default=None), power_limit_w=max(limits, default=None),
            util_mean_pct=mean(util), util_peak_pct=max(util, default=None),
            memory_peak_mib=max(g.memory_used_mib for g in samples), memory_total_mib=samples[0].memory_total_mib))
    return tuple(telemetry)


def ratio(new: float | None, old: float | None) -> float | None:
    """new / old; None when either is missing or old is not positive."""
    if new is None or old is None or old <= 0:
        return None
    return new / old
