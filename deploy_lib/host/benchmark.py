"""The benchmark on the host: which serving module the venv has, the GPU sampler, one run per concurrency level,
reading the results back; the gate after a deploy and `invoke bench`, each recorded in history."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.errors import GateFailed, RemoteError
from deploy_lib.facts.host import NVIDIA_SMI_QUERY
from deploy_lib.health import http_url, reachable_host
from deploy_lib.host_paths import venv_python
from deploy_lib.profile.settings import PROMPTS_PER_GROUP, BenchSettings, GateSettings
from deploy_lib.progress import Progress
from deploy_lib.remote import TIMED_OUT_EXIT, Put, Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK, ANY_EXIT
from deploy_lib.store import (
    HistoryEntry,
    StoreLayout,
    Tags,
    append_history,
)
from deploy_lib.throughput.gate import GateVerdict, evaluate_gate
from deploy_lib.throughput.history import bench_history_entry, find_baseline
from deploy_lib.throughput.results import BenchResult, LevelResult, parse_level, parse_telemetry
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


def parse_module(result: StepResult) -> str | None:
    name = result.stdout.strip().splitlines()[-1] if result.exit_code == 0 and result.stdout.strip() else ""
    return name if name in {m.module for m in BENCH_MODULES} else None


def _tail(result: StepResult) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).replace("\r", "\n")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-ERROR_TAIL_LINES:]) or "no output"


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
        return cls(release_id=str(metadata["id"]), python=str(venv_python(str(metadata["venv"]))),
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


def dataset_flags(settings: BenchSettings, concurrency: int) -> tuple[str, ...]:
    """bench_serving's dataset and its lengths (the same flags in the 0.5.9 and 0.5.23 wheels): random token ids, or
    with `shared_prefix_len` the generated-shared-prefix dataset, whose request count is its groups times their size
    (--num-prompts is not read there)."""
    prompts = settings.prompts_at(concurrency)
    ratio = f"{settings.range_ratio:g}"
    if settings.shared_prefix_len is None:
        return ("--dataset-name", "random-ids", "--num-prompts", str(prompts), "--random-input-len",
                str(settings.input_len), "--random-output-len", str(settings.output_len), "--random-range-ratio", ratio)
    groups = prompts // PROMPTS_PER_GROUP  # prompts_at gives whole groups
    return ("--dataset-name", "generated-shared-prefix", "--num-prompts", str(prompts),
            "--gsp-num-groups", str(groups), "--gsp-prompts-per-group", str(PROMPTS_PER_GROUP),
            "--gsp-system-prompt-len", str(settings.shared_prefix_len),
            "--gsp-question-len", str(settings.input_len - settings.shared_prefix_len),
            "--gsp-output-len", str(settings.output_len), "--gsp-range-ratio", ratio)


def benchmark_step(target: BenchRun, module: str, settings: BenchSettings, concurrency: int,
                   output: PurePosixPath, api_key: str | None) -> Step:
    command = ("env", *(f"{k}={v}" for k, v in sorted(target.environment.items())), target.python, "-m", module,
               "--backend", settings.backend, "--base-url", target.base_url, *dataset_flags(settings, concurrency),
               "--tokenizer", target.tokenizer, "--max-concurrency", str(concurrency), "--output-file", str(output))
    name, runs_to_the_end = f"bench: concurrency {concurrency}", ANY_EXIT
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
                  progress: Progress, api_key: str | None = None, clock: Callable[[], float] = time.monotonic,
                  modules: MutableMapping[str, str] | None = None) -> BenchResult:
    """Benchmark the release serving on the host now; never raises for a benchmark that fails (see `.error`).
    `modules` (venv python -> its benchmark module) keeps what earlier runs found: a sweep inspects a venv once."""
    target = BenchRun.of_release(release_metadata, settings)
    progress.phase_started("benchmark")
    started = clock()
    module = (modules or {}).get(target.python)
    try:
        module = module or parse_module(remote.run([module_step(target.python)])[0])
    except RemoteError as failure:
        return BenchResult(target.release_id, settings, error=f"could not inspect the venv: {failure.message}")
    if module is None:
        return BenchResult(target.release_id, settings,
                           error=f"no SGLang serving benchmark ({_MODULE_NAMES}) in {target.python}")
    if modules is not None:
        modules[target.python] = module
    run_dir = layout.base / "bench" / f"{target.release_id}-{secrets.token_hex(4)}"
    outputs = [run_dir / f"c{c}.jsonl" for c in settings.concurrency]
    finished: list[int] = []  # concurrency levels whose run exited 0
    error: str | None = None
    # the sampler starts in the first level's round trip, just before it
    sampler = sampler_steps(run_dir, len(settings.concurrency) * (settings.timeout_s + 60))
    try:
        for concurrency, output in zip(settings.concurrency, outputs, strict=True):
            progress.note(f"benchmark: concurrency {concurrency}, {settings.prompts_at(concurrency)} prompts")
            result = remote.run([*sampler, benchmark_step(target, module, settings, concurrency, output,
                                                          api_key)])[-1]
            sampler = []
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
            parsed.append(parse_level(collected[_read_name(output)].stdout, concurrency,
                                      settings.prompts_at(concurrency)))
        except ValueError as bad:
            error = error or str(bad)
            break
    gpus = parse_telemetry(collected[_read_name(run_dir / TELEMETRY_FILE)].stdout)
    wall_s = clock() - started
    progress.step_done("benchmark", wall_s)
    for level in parsed:
        progress.note(f"benchmark: {level.output_tok_s:,.1f} tok/s at concurrency {level.concurrency}, "
                      f"p99 TTFT {level.ttft.p99_ms or 0:,.0f} ms")
    return BenchResult(target.release_id, settings, tuple(parsed), gpus, error,
                       None if gpus else "nvidia-smi gave no samples during the benchmark", wall_s)


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
