"""Throughput gate: SGLang's own serving benchmark on the host, GPU telemetry while it runs, and the gate
(`invoke bench`, profile keys `bench:` and `gate:`; the tool's own timings are `make bench`, in bench/).

The benchmark is `python -m sglang.benchmark.serving` (`sglang.bench_serving` before 0.5.15; versions.BENCH_MODULES),
run by the release's venv python on the host against the local server, on the `random-ids` dataset (no download)
with the model's local tokenizer (HF_HUB_OFFLINE=1), one run per concurrency level, each writing one JSONL line that
is read back (the printed table is not parsed). An nvidia-smi sampler runs in the background for the whole
benchmark and is stopped by its PID.

The rest is pure: parsers of the JSONL and the telemetry CSV, figures for history.jsonl (event "bench"), the
baseline (the last good release's figures at the same settings, from history) and `evaluate_gate`.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import ConfigError, GateFailed, RemoteError
from deploy_lib.facts import NVIDIA_SMI_QUERY, Gpu, parse_gpus
from deploy_lib.health import http_url, reachable_host
from deploy_lib.progress import Progress
from deploy_lib.readings import ABSENT_OK
from deploy_lib.remote import TIMED_OUT_EXIT, Put, Remote, Step, StepResult
from deploy_lib.settings import BenchSettings, GateSettings
from deploy_lib.store import (
    ACTIVATIONS,
    FAILED,
    HEALTHY,
    HistoryEntry,
    StoreLayout,
    Tags,
    append_history,
    history_entry,
)
from deploy_lib.versions import BENCH_MODULES

SAMPLE_INTERVAL_S = 1                     # nvidia-smi is started once per sample: works with any nvidia-smi
STEP_BENCH_MODULE = "bench: which serving benchmark"
STEP_SAMPLER_START = "bench: start GPU sampler"
STEP_SAMPLER_STOP = "bench: stop GPU sampler"
ERROR_TAIL_LINES = 6
_MODULE_NAMES = " or ".join(m.module for m in reversed(BENCH_MODULES))  # newest first
TELEMETRY_FILE = "gpus.csv"

# Prints the benchmark module the venv has, from its installed files (find_spec of a top-level name does not
# import it, so sglang/__init__ and torch are not loaded).
_MODULE_SCRIPT = f"""
import importlib.util, os
spec = importlib.util.find_spec("sglang")
root = list(spec.submodule_search_locations or [])[0] if spec else ""
found = [m for m, f in {[(m.module, m.path) for m in reversed(BENCH_MODULES)]!r}
         if root and os.path.isfile(os.path.join(root, f))]
print(found[0] if found else "")
"""
# $1 pid file, $2 output, $3 interval, $4 lifetime (s), then the nvidia-smi argv; ends by itself at the lifetime.
# Its own stdio leaves the SSH channel at once (exec), or the batch would wait for the sampler to end.
_SAMPLER_SCRIPT = ('echo $$ >"$1"; exec >>"$2" 2>&1 </dev/null; interval=$3 end=$(( $(date +%s) + $4 )); shift 4; '
                   'while [ "$(date +%s)" -lt "$end" ] && "$@"; do sleep "$interval"; done')
_STOP_SCRIPT = 'kill "$(cat "$1")"'
# One socket per in-flight request: at concurrency 1,024 the client needs more than the usual soft limit of 1,024
# open files, and the benchmark's own raise to 65,535 fails silently where the hard limit is lower (its requests
# then fail with EMFILE), so the soft limit goes up to the hard one first (no privilege needed, unlike prlimit).
_RUN_SCRIPT = 'ulimit -n "$(ulimit -Hn)"; exec "$@"'
# The API key travels on stdin, never in argv: the benchmark reads OPENAI_API_KEY (sent as a bearer token).
_RUN_WITH_KEY_SCRIPT = 'ulimit -n "$(ulimit -Hn)"; IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; exec "$@"'
_HF_ENV_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")


# ---------------------------------------------------------------------------------------------------------
# Results


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

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.levels)

    def level(self, concurrency: int) -> LevelResult | None:
        return next((level for level in self.levels if level.concurrency == concurrency), None)

    def figures(self) -> dict[str, float]:
        """Flat figures for history.jsonl: the settings identity, then c<level>.<metric>, then gpu<i>.<metric>."""
        figures = dict(self.settings.identity())
        for level in self.levels:
            values = {"output_tok_s": level.output_tok_s, "completed": float(level.completed),
                      "duration_s": level.duration_s,
                      "ttft_mean_ms": level.ttft.mean_ms, "ttft_median_ms": level.ttft.median_ms,
                      "ttft_p99_ms": level.ttft.p99_ms,
                      "itl_mean_ms": level.itl.mean_ms, "itl_median_ms": level.itl.median_ms,
                      "itl_p99_ms": level.itl.p99_ms}
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
                itl=Latency(value(f"c{c}.itl_mean_ms"), value(f"c{c}.itl_median_ms"), value(f"c{c}.itl_p99_ms"))))
        prompts = int(figures.get("settings.prompts", max(levels, default=1)))
        settings = BenchSettings.model_construct(
            prompts=prompts, input_len=int(figures.get("settings.input_len", 0)),
            output_len=int(figures.get("settings.output_len", 0)), concurrency=[r.concurrency for r in results],
            backend="sglang-oai" if figures.get("settings.openai_api") else "sglang", tokenizer=None,
            timeout_s=3600)
        return cls(release_id=release_id, settings=settings, levels=tuple(results), error=error)

    def summary(self) -> str:
        """One line: throughput per level (also of a run the gate failed), or why there is none."""
        if not self.levels:
            return f"benchmark failed: {self.error}"
        return ", ".join(f"{level.output_tok_s:,.0f} tok/s @{level.concurrency}" for level in self.levels)


# ---------------------------------------------------------------------------------------------------------
# Parsers


def parse_level(jsonl: str, concurrency: int, prompts: int) -> LevelResult:
    """The last JSON object of a benchmark's --output-file; ValueError names what is missing or wrong."""
    records = []
    for line in jsonl.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "output_throughput" in record:
            records.append(record)
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
        itl=Latency(*(number(f"{kind}_itl_ms", required=False) for kind in ("mean", "median", "p99"))))


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


def parse_module(result: StepResult) -> str | None:
    name = result.stdout.strip().splitlines()[-1] if result.exit_code == 0 and result.stdout.strip() else ""
    return name if name in {m.module for m in BENCH_MODULES} else None


def _tail(result: StepResult) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).replace("\r", "\n")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-ERROR_TAIL_LINES:]) or "no output"


# ---------------------------------------------------------------------------------------------------------
# Steps


@dataclass(frozen=True)
class BenchRun:
    """Where and with what the benchmark runs, read from a release's metadata (release.json)."""

    release_id: str
    python: str
    base_url: str
    tokenizer: str
    environment: Mapping[str, str]

    @classmethod
    def of_release(cls, metadata: Mapping[str, Any], settings: BenchSettings) -> BenchRun:
        profile = metadata["profile"]
        server, model = profile.get("server") or {}, profile["model"]
        environment = {k: str(v) for k, v in dict(metadata.get("environment") or {}).items()
                       if k.startswith(_HF_ENV_PREFIXES)}
        return cls(release_id=str(metadata["id"]), python=str(PurePosixPath(str(metadata["venv"])) / "bin" / "python3"),
                   base_url=http_url(reachable_host(str(server.get("host") or "")), int(server.get("port") or 30000)),
                   tokenizer=settings.tokenizer or str(model.get("tokenizer") or model["path"]),
                   environment=environment | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def module_step(python: str) -> Step:
    return Step(STEP_BENCH_MODULE, (python, "-I", "-c", _MODULE_SCRIPT), ok=frozenset({0, 1, 127}), timeout_s=60)


def sampler_steps(run_dir: PurePosixPath, lifetime_s: int) -> list[Step | Put]:
    return [
        Step("bench: run directory", ("mkdir", "-p", "--", str(run_dir)), sudo=True),
        Step(STEP_SAMPLER_START, ("setsid", "-f", "sh", "-c", _SAMPLER_SCRIPT, "gpu-sampler",
                                  str(run_dir / "sampler.pid"), str(run_dir / TELEMETRY_FILE), str(SAMPLE_INTERVAL_S),
                                  str(lifetime_s), *NVIDIA_SMI_QUERY), sudo=True),
    ]


def benchmark_step(target: BenchRun, module: str, settings: BenchSettings, concurrency: int,
                   output: PurePosixPath, api_key: str | None) -> Step:
    command = ("env", *(f"{k}={v}" for k, v in sorted(target.environment.items())), target.python, "-m", module,
               "--backend", settings.backend, "--base-url", target.base_url, "--dataset-name", "random-ids",
               "--tokenizer", target.tokenizer, "--num-prompts", str(settings.prompts),
               "--random-input-len", str(settings.input_len), "--random-output-len", str(settings.output_len),
               "--random-range-ratio", "1", "--max-concurrency", str(concurrency), "--output-file", str(output))
    name, runs_to_the_end = f"bench: concurrency {concurrency}", frozenset(range(256))
    if api_key is None:
        return Step(name, ("sh", "-c", _RUN_SCRIPT, "bench", *command), sudo=True, ok=runs_to_the_end,
                    timeout_s=settings.timeout_s)
    return Step(name, ("sh", "-c", _RUN_WITH_KEY_SCRIPT, "bench", *command), sudo=True,
                stdin=api_key.encode() + b"\n", ok=runs_to_the_end, timeout_s=settings.timeout_s, secret=True)


def _read_name(path: PurePosixPath) -> str:
    return f"bench: read {path.name}"


def collect_steps(run_dir: PurePosixPath, outputs: Sequence[PurePosixPath]) -> list[Step | Put]:
    """Stop the sampler, read every output, remove the run directory."""
    read = [Step(_read_name(path), ("cat", "--", str(path)), sudo=True, ok=ABSENT_OK)
            for path in (*outputs, run_dir / TELEMETRY_FILE)]
    return [Step(STEP_SAMPLER_STOP, ("sh", "-c", _STOP_SCRIPT, "stop", str(run_dir / "sampler.pid")), sudo=True,
                 ok=frozenset({0, 1, 2})),
            *read,
            Step("bench: remove run directory", ("rm", "-rf", "--", str(run_dir)), sudo=True)]


def run_benchmark(remote: Remote, layout: StoreLayout, release_metadata: Mapping[str, Any], settings: BenchSettings,
                  progress: Progress, api_key: str | None = None,
                  clock: Callable[[], float] = time.monotonic) -> BenchResult:
    """Benchmark the release serving on the host now; never raises for a benchmark that fails (see `.error`)."""
    target = BenchRun.of_release(release_metadata, settings)
    progress.phase_started("benchmark")
    started = clock()
    try:
        module = parse_module(remote.run([module_step(target.python)])[0])
    except RemoteError as error:
        return BenchResult(target.release_id, settings, error=f"could not inspect the venv: {error.message}")
    if module is None:
        return BenchResult(target.release_id, settings,
                           error=f"no SGLang serving benchmark ({_MODULE_NAMES}) in {target.python}")
    run_dir = layout.base / "bench" / f"{target.release_id}-{secrets.token_hex(4)}"
    outputs = [run_dir / f"c{c}.jsonl" for c in settings.concurrency]
    finished: list[int] = []  # concurrency levels whose run exited 0
    error: str | None = None
    try:
        remote.run(sampler_steps(run_dir, len(settings.concurrency) * (settings.timeout_s + 60)))
        for concurrency, output in zip(settings.concurrency, outputs, strict=True):
            progress.note(f"benchmark: concurrency {concurrency}, {settings.prompts} prompts")
            result = remote.run([benchmark_step(target, module, settings, concurrency, output, api_key)])[0]
            if result.exit_code != 0:
                how = "timed out" if result.exit_code == TIMED_OUT_EXIT else f"exited {result.exit_code}"
                error = f"{module} at concurrency {concurrency} {how}: {_tail(result)}"
                break
            finished.append(concurrency)
    except RemoteError as failure:
        error = f"the benchmark could not run: {failure.message}"
    try:
        collected = {r.step.name: r for r in remote.run(collect_steps(run_dir, outputs))}
    except RemoteError as failure:
        return BenchResult(target.release_id, settings, error=error or f"reading the results failed: {failure}")
    parsed: list[LevelResult] = []
    for concurrency, output in zip(finished, outputs, strict=False):
        try:
            parsed.append(parse_level(collected[_read_name(output)].stdout, concurrency, settings.prompts))
        except ValueError as bad:
            error = error or str(bad)
            break
    gpus = parse_telemetry(collected[_read_name(run_dir / TELEMETRY_FILE)].stdout)
    progress.step_done("benchmark", clock() - started)
    for level in parsed:
        progress.note(f"benchmark: {level.output_tok_s:,.1f} tok/s at concurrency {level.concurrency}, "
                      f"p99 TTFT {level.ttft.p99_ms or 0:,.0f} ms")
    return BenchResult(target.release_id, settings, tuple(parsed), gpus, error,
                       None if gpus else "nvidia-smi gave no samples during the benchmark")


# ---------------------------------------------------------------------------------------------------------
# Gate and history (pure)


@dataclass(frozen=True)
class LevelCheck:
    concurrency: int
    new_tok_s: float
    baseline_tok_s: float
    throughput_ratio: float
    new_ttft_p99_ms: float | None
    baseline_ttft_p99_ms: float | None
    ttft_ratio: float | None
    passed: bool


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    message: str
    baseline_release: str | None = None
    checks: tuple[LevelCheck, ...] = ()


def _ratio(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return new / old


def evaluate_gate(new: BenchResult, baseline: BenchResult | None, gate: GateSettings) -> GateVerdict:
    """Pass, fail or record: a failed benchmark fails; no baseline passes and says so; else every level's ratios."""
    if not new.ok:
        return GateVerdict(False, f"release {new.release_id}: the benchmark failed, so the gate fails: {new.error}")
    if baseline is None:
        return GateVerdict(True, f"release {new.release_id}: no baseline at these settings ({new.settings.describe()})"
                                 f"; recorded {new.summary()} as the first figures and kept the release")
    checks = []
    for level in new.levels:
        old = baseline.level(level.concurrency)
        assert old is not None  # find_baseline only returns results with the same levels
        throughput = level.output_tok_s / old.output_tok_s if old.output_tok_s > 0 else math.inf
        ttft = _ratio(level.ttft.p99_ms, old.ttft.p99_ms)
        passed = throughput >= gate.min_throughput_ratio and (ttft is None or ttft <= gate.max_ttft_p99_ratio)
        checks.append(LevelCheck(level.concurrency, level.output_tok_s, old.output_tok_s, throughput,
                                 level.ttft.p99_ms, old.ttft.p99_ms, ttft, passed))
    failed = [check for check in checks if not check.passed]
    shown = failed or checks

    def line(check: LevelCheck) -> str:
        text = (f"{check.new_tok_s:,.1f} tok/s at concurrency {check.concurrency} vs {check.baseline_tok_s:,.1f} "
                f"tok/s for release {baseline.release_id} ({check.throughput_ratio:.2f}x, minimum "
                f"{gate.min_throughput_ratio:.2f}x)")
        if check.ttft_ratio is not None:
            text += (f", p99 TTFT {check.new_ttft_p99_ms:,.0f} ms vs {check.baseline_ttft_p99_ms:,.0f} ms "
                     f"({check.ttft_ratio:.2f}x, maximum {gate.max_ttft_p99_ratio:.2f}x)")
        return text

    verdict = "below the gate" if failed else "within the gate"
    message = f"release {new.release_id} is {verdict}: " + "; ".join(line(check) for check in shown)
    return GateVerdict(not failed, message, baseline.release_id, tuple(checks))


def last_good_release(history: Sequence[HistoryEntry], exclude: str | None = None) -> str | None:
    """The newest release that a start (deploy, rollback, adopt, start, restart) recorded healthy, but `exclude`."""
    for entry in reversed(history):
        if entry.event in ACTIVATIONS and entry.outcome == HEALTHY and entry.tags.release != exclude:
            return entry.tags.release
    return None


def _newest_bench(history: Sequence[HistoryEntry], release_id: str, healthy_only: bool = False
                  ) -> HistoryEntry | None:
    """The newest `bench` line of a release that has figures."""
    return next((entry for entry in reversed(history)
                 if entry.event == "bench" and entry.tags.release == release_id and entry.figures
                 and (entry.outcome == HEALTHY or not healthy_only)), None)


def latest_bench(history: Sequence[HistoryEntry], release_id: str, healthy_only: bool = False) -> BenchResult | None:
    """The newest benchmark of a release that has figures, rebuilt from history."""
    entry = _newest_bench(history, release_id, healthy_only)
    if entry is None:
        return None
    return BenchResult.from_figures(release_id, entry.figures,
                                    error=None if entry.outcome == HEALTHY else entry.cause or "failed")


def gpu_power(figures: Mapping[str, float]) -> str:
    """Power drawn during a benchmark, over all GPUs: `222 W mean, 250 W peak of 600 W`; '' without telemetry."""
    def values(metric: str) -> list[float]:
        return [value for key, value in figures.items() if key.startswith("gpu") and key.endswith(f".{metric}")]
    means, peaks, limits = values("power_mean_w"), values("power_peak_w"), values("power_limit_w")
    if not means:
        return ""
    limit = f" of {max(limits):.0f} W" if limits else ""
    peak = f", {max(peaks):.0f} W peak" if peaks else ""
    return f"{sum(means) / len(means):.0f} W mean{peak}{limit}"


def power_by_release(history: Sequence[HistoryEntry]) -> dict[str, str]:
    """Each release's GPU power during its newest benchmark (for `invoke releases`)."""
    releases = {entry.tags.release for entry in history if entry.event == "bench"}
    return {release: gpu_power(entry.figures) for release in releases
            if (entry := _newest_bench(history, release)) is not None}


def find_baseline(history: Sequence[HistoryEntry], settings: BenchSettings, new_release: str) -> BenchResult | None:
    """The last good release's newest passing benchmark at the same settings and levels, or None."""
    release = last_good_release(history, exclude=new_release)
    if release is None:
        return None
    for entry in reversed(history):
        if entry.event != "bench" or entry.tags.release != release or entry.outcome != HEALTHY:
            continue
        same = all(entry.figures.get(key) == value for key, value in settings.identity().items())
        result = BenchResult.from_figures(release, entry.figures)
        if same and sorted(level.concurrency for level in result.levels) == sorted(settings.concurrency):
            return result
    return None


def bench_history_entry(result: BenchResult, verdict: GateVerdict | None, tags: Tags, when: datetime) -> HistoryEntry:
    """The history line of one benchmark: healthy if it ran (and passed the gate, when there was one)."""
    passed = result.ok and (verdict is None or verdict.passed)
    cause = verdict.message if verdict is not None else (result.error or "")
    return history_entry("bench", HEALTHY if passed else FAILED, tags, when, cause, figures=result.figures())


def throughput_by_release(history: Sequence[HistoryEntry]) -> dict[str, str]:
    """Each release's newest benchmark as one line (for `invoke releases`)."""
    releases = {entry.tags.release for entry in history if entry.event == "bench"}
    return {release: result.summary() for release in releases
            if (result := latest_bench(history, release)) is not None}


@dataclass(frozen=True)
class GateRun:
    result: BenchResult
    verdict: GateVerdict


def gate_after_ready(remote: Remote, layout: StoreLayout, release_metadata: Mapping[str, Any], tags: Tags,
                     settings: BenchSettings, gate: GateSettings, history: Sequence[HistoryEntry],
                     progress: Progress, api_key: str | None = None,
                     clock: Callable[[], float] = time.monotonic) -> GateRun:
    """Benchmark a release that just became ready, judge it against the baseline, record it in history.

    Raises GateFailed (a ReadinessFailed: the caller rolls back as for a failed start) when it does not pass."""
    result = run_benchmark(remote, layout, release_metadata, settings, progress, api_key, clock)
    verdict = evaluate_gate(result, find_baseline(history, settings, result.release_id), gate)
    remote.run(append_history(layout, bench_history_entry(result, verdict, tags, datetime.now(UTC))))
    progress.note(verdict.message)
    if not verdict.passed:
        raise GateFailed(verdict.message, rung="benchmark", evidence=tuple(g.line() for g in result.gpus),
                         hint="the benchmark's figures are in history (`invoke releases`); compare with "
                              "`invoke bench --compare A B`")
    return GateRun(result, verdict)


def bench_on_demand(remote: Remote, layout: StoreLayout, release_metadata: Mapping[str, Any], tags: Tags,
                    settings: BenchSettings, progress: Progress, api_key: str | None = None) -> BenchResult:
    """`invoke bench`: benchmark the current release and record it (no gate)."""
    result = run_benchmark(remote, layout, release_metadata, settings, progress, api_key)
    remote.run(append_history(layout, bench_history_entry(result, None, tags, datetime.now(UTC))))
    return result


@dataclass(frozen=True)
class ComparisonRow:
    label: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        """b / a."""
        return _ratio(self.b, self.a)


_COMPARED = (("output_tok_s", "output tok/s"), ("ttft_mean_ms", "mean TTFT ms"), ("ttft_median_ms", "median TTFT ms"),
             ("ttft_p99_ms", "p99 TTFT ms"), ("itl_mean_ms", "mean ITL ms"), ("itl_median_ms", "median ITL ms"),
             ("itl_p99_ms", "p99 ITL ms"))


def compare(a: BenchResult, b: BenchResult) -> list[ComparisonRow]:
    """Side by side, per concurrency level either ran, with ratio b/a (`invoke bench --compare A B`)."""
    figures_a, figures_b = a.figures(), b.figures()
    levels = sorted({level.concurrency for level in (*a.levels, *b.levels)})
    return [ComparisonRow(f"c={c} {label}", figures_a.get(f"c{c}.{key}"), figures_b.get(f"c{c}.{key}"))
            for c in levels for key, label in _COMPARED]


def compare_releases(history: Sequence[HistoryEntry], release_a: str, release_b: str
                     ) -> tuple[BenchResult, BenchResult, list[ComparisonRow]]:
    """Each release's newest benchmark from history, side by side; ConfigError names a release without one."""
    results = []
    for release in (release_a, release_b):
        found = latest_bench(history, release)
        if found is None:
            known = sorted({entry.tags.release for entry in history if entry.event == "bench" and entry.figures})
            raise ConfigError(f"release {release} has no benchmark in history",
                              f"benchmarked releases: {', '.join(known) or 'none'}; `invoke bench` runs one")
        results.append(found)
    return results[0], results[1], compare(results[0], results[1])
