"""What the tool knows about SGLang releases, in one place: the module a maintainer edits when SGLang ships one.

Every row cites the wheels it was read from. tests/test_versions.py checks each row against the real sglang
wheels of KNOWN_SGLANG (tests/helpers/wheelcache.py downloads them once), and tests/test_server_args.py renders the
reference profiles for each of them and parses the result with that version's own argument parser.

When SGLang ships a release: add it to KNOWN_SGLANG, run `pytest -m wheels tests/test_versions.py
tests/test_server_args.py`, and add a row below wherever a test names what changed (a renamed flag: a Spelling; a new
endpoint or module: its `since`; a new backend choice: a member of the profile's enum, deploy_lib/profile/choices.py).
Patch sets name the versions they apply to in their own target files (roles/*/targets/*.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

# The releases whose wheels the tests read (oldest first); the last is the newest the tool knows, the default of
# `invoke render --sglang-version` and `invoke plan --against`.
KNOWN_SGLANG = ("0.5.6.post1", "0.5.8.post1", "0.5.9", "0.5.15", "0.5.15.post1", "0.5.20", "0.5.23")
NEWEST_SGLANG = KNOWN_SGLANG[-1]

# `/ready` (no generation, cheapest) is routed from this release on (srt/entrypoints/http_server.py: absent in the
# 0.5.15.post1 wheel, present in 0.5.20); older releases only have `/health`, which runs a 1-token generation.
READY_ENDPOINT_SINCE = "0.5.20"


# sglang-router's power_of_two policy reads each worker's load from its `/get_load` (the sglang_router 0.3.2 wheel's
# LoadMonitor, "Started LoadMonitor for PowerOfTwo policies"). SGLang served it until 0.5.20 (srt/entrypoints/
# http_server.py: `@app.get("/get_load")`, line 613 in 0.5.9, deprecated; line 853 in 0.5.20) and no longer from
# 0.5.21 (absent in the 0.5.21, 0.5.22 and 0.5.23 wheels).
GET_LOAD_REMOVED = "0.5.21"


def version_key(text: str) -> Version:
    """The version `text` names, in PEP 440 order (packaging.version: 1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 == 1.0.0 <
    1.0.post1); a local label is dropped (0.5.23+cu128, a CUDA build of 0.5.23, is 0.5.23)."""
    try:
        return Version(Version(text.strip()).public)
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a version (expected e.g. 0.5.15 or 0.5.15.post1)") from None


def reached(sglang_version: str, since: str) -> bool:
    """`sglang_version` is `since` or later (PEP 440 order: 0.5.15rc1 < 0.5.15 < 0.5.15.post1)."""
    return version_key(sglang_version) >= version_key(since)


def health_path_for(sglang_version: str) -> str:
    """`/ready` where the installed SGLang has it, else `/health`."""
    return "/ready" if reached(sglang_version, READY_ENDPOINT_SINCE) else "/health"


@dataclass(frozen=True)
class BenchModule:
    """SGLang's serving benchmark as `python -m <module>`; `path` is its file inside the sglang package."""

    since: str
    module: str
    path: str


# Oldest first; the host runs the newest one its venv has (sglang.bench_serving is a deprecated shim from 0.5.15).
BENCH_MODULES = (
    BenchModule("0", "sglang.bench_serving", "bench_serving.py"),                  # 0.5.6.post1 - 0.5.9: the module
    BenchModule("0.5.15", "sglang.benchmark.serving", "benchmark/serving.py"),     # 0.5.15 wheel on
)

# The profile's backend enums (deploy_lib/profile/choices.py) hold choices of these flags that at least one release in
# KNOWN_SGLANG accepts; preflight checks the chosen value against the parser of the release on the host.
CHOICE_FLAGS: dict[str, tuple[str, ...]] = {
    "AttentionBackend": ("--attention-backend",),
    "MoeRunnerBackend": ("--moe-runner-backend",),
    "Fp8GemmBackend": ("--fp8-gemm-backend",),
    "DsaBackend": ("--nsa-decode-backend", "--nsa-prefill-backend", "--dsa-decode-backend", "--dsa-prefill-backend"),
    "KvCacheDtype": ("--kv-cache-dtype",),
    "Quantization": ("--quantization",),
}


@dataclass(frozen=True)
class Spelling:
    """How a setting is written on the command line from SGLang `since` on; `{}` stands for the value."""

    since: str
    argv: tuple[str, ...]
    source: str


# Oldest first; a version uses the last spelling whose `since` it has reached. Before the first: the flag is absent.
_NOTES = "sglang wheels, srt/server_args.py add_cli_args"
SPELLINGS: dict[str, tuple[Spelling, ...]] = {
    "revision": (
        Spelling("0", ("--revision", "{}"),
                 "registered in the 0.5.9 and 0.5.15.post1 wheels (srt/server_args.py) and in 0.5.23 "
                 "(srt/arg_groups/fields/model.py); weight_utils.download_weights_from_hf reads it from the cache"),
    ),
    "fp8_gemm": (
        Spelling("0.5.6.post2", ("--fp8-gemm-backend", "{}"),
                 f"{_NOTES} (absent 0.5.5.post3, present 0.5.6.post2); absent from the 0.5.6 and 0.5.6.post1 wheels"),
    ),
    "dsa_decode": (
        Spelling("0", ("--nsa-decode-backend", "{}"), f"{_NOTES}: --nsa-* up to 0.5.9; a deprecated alias in 0.5.15.x"),
        Spelling("0.5.15", ("--dsa-decode-backend", "{}"),
                 f"{_NOTES}: --dsa-* from 0.5.15.post1, --nsa-* removed by 0.5.20; 0.5.15 wheel has --dsa-* too"),
    ),
    "dsa_prefill": (
        Spelling("0", ("--nsa-prefill-backend", "{}"), f"{_NOTES}: as dsa_decode"),
        Spelling("0.5.15", ("--dsa-prefill-backend", "{}"), f"{_NOTES}: as dsa_decode"),
    ),
    "allreduce_fusion": (
        Spelling("0", ("--enable-flashinfer-allreduce-fusion",), f"{_NOTES}: the only switch up to 0.5.9"),
        Spelling("0.5.15", ("--flashinfer-allreduce-fusion-backend", "auto"),
                 f"{_NOTES}: the old switch is deprecated and maps to backend auto, which resolves to "
                 "trtllm on a single non-SM100 node (srt/layers/flashinfer_comm_fusion.py _resolve_backend)"),
    ),
    "metrics": (
        Spelling("0", ("--enable-metrics", "--collect-tokens-histogram"),
                 f"{_NOTES}: up to 0.5.9 the prompt / generation length histograms are served only with "
                 "--collect-tokens-histogram (srt/metrics/collector.py TokenizerMetricsCollector)"),
        Spelling("0.5.15", ("--enable-metrics",),
                 f"{_NOTES}: the 0.5.15 wheel serves them with --enable-metrics alone and registers "
                 "--collect-tokens-histogram as a DeprecatedAction; removed by 0.5.20"),
    ),
    "cuda_graph_off": (
        Spelling("0", ("--disable-cuda-graph",), _NOTES),
        Spelling("0.5.15", ("--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"),
                 f"{_NOTES} (deprecated in 0.5.20+); the 0.5.15 and 0.5.15.post1 wheels already register "
                 "--disable-cuda-graph as DeprecatedStoreTrueAction pointing to these two flags"),
    ),
}


@dataclass(frozen=True)
class Arg:
    """How one profile key reaches the command line: a flag with its value, a switch written when the key equals
    `on`, or a versioned spelling (`setting` in SPELLINGS). The renderer and `invoke adopt` read the same rows."""

    key: str                        # dotted profile key, e.g. "parallel.tp"
    flag: str | None = None
    setting: str | None = None
    switch: bool = False
    on: bool = True
    omit: object = None             # a value that is not written (the flag's own default)
    multi_node: bool = False        # written only when parallel.nnodes > 1


# In command-line order; the order is part of each release's id.
ARGS: tuple[Arg, ...] = (
    Arg("model.path", "--model-path"),
    Arg("model.served_name", "--served-model-name"),
    Arg("model.tokenizer", "--tokenizer-path"),
    Arg("model.reasoning_parser", "--reasoning-parser"),
    Arg("model.tool_call_parser", "--tool-call-parser"),
    Arg("model.trust_remote_code", "--trust-remote-code", switch=True),
    Arg("parallel.tp", "--tp-size"),
    Arg("parallel.pp", "--pp-size", omit=1),
    Arg("parallel.dp", "--dp-size", omit=1),
    Arg("parallel.nnodes", "--nnodes", multi_node=True),
    Arg("parallel.node_rank", "--node-rank", multi_node=True),
    Arg("parallel.dist_init_addr", "--dist-init-addr", multi_node=True),
    Arg("memory.mem_fraction_static", "--mem-fraction-static"),
    Arg("memory.max_running_requests", "--max-running-requests"),
    Arg("memory.chunked_prefill_size", "--chunked-prefill-size"),
    Arg("model.kv_cache_dtype", "--kv-cache-dtype"),
    Arg("model.quantization", "--quantization"),
    Arg("backends.attention", "--attention-backend"),
    Arg("backends.fp8_gemm", setting="fp8_gemm"),
    Arg("backends.dsa_decode", setting="dsa_decode"),
    Arg("backends.dsa_prefill", setting="dsa_prefill"),
    Arg("backends.moe_runner", "--moe-runner-backend"),
    Arg("features.cuda_graph", setting="cuda_graph_off", switch=True, on=False),
    Arg("features.radix_cache", "--disable-radix-cache", switch=True, on=False),
    Arg("features.allreduce_fusion", setting="allreduce_fusion", switch=True),
    Arg("features.metrics", setting="metrics", switch=True),
    Arg("server.host", "--host"),
    Arg("server.port", "--port"),
)


def modelled_flags(arg: Arg) -> frozenset[str]:
    """Every flag a row may write, in any SGLang version the tool knows."""
    if arg.flag is not None:
        return frozenset({arg.flag})
    return frozenset(token for spelled in SPELLINGS[arg.setting or ""] for token in spelled.argv
                     if token.startswith("--"))

