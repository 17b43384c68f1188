"""The sections of a profile (`model:`, `parallel:`, `memory:`, `backends:`, `features:`, `server:`, `nccl:`,
`service:`); the sections operations act on are in deploy_lib/profile/settings.py."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from deploy_lib.profile.choices import (
    AttentionBackend,
    DsaBackend,
    Fp8GemmBackend,
    KvCacheDtype,
    MoeRunnerBackend,
    NcclDebug,
    P2PLevel,
    Quantization,
    RestartPolicy,
)
from deploy_lib.profile.fields import AbsPath, SecretField, Strict, Text, no_control_chars
from deploy_lib.profile.settings import VenvSpec

# Model ids and paths reach argv, the unit and the journal: shell metacharacters are refused outright.
# A Hub repo id as huggingface_hub 0.36.0 checks one (utils/_validators.py REPO_ID_REGEX, validate_repo_id: no `--`
# or `..`): so `./weights/glm`, `../glm`, `~/glm` and `a/b/c` are not ids.
_HUB_REPO_RE = re.compile(r"^(?!.*(?:--|\.\.))(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")
_MODEL_RE = re.compile(r"^[A-Za-z0-9._\-/+@:=,~ ]+$")


# The files SGLang reads from a checkpoint: weights, configs and index, tokenizer files, remote code, chat templates.
DEFAULT_ALLOW_PATTERNS = ("*.safetensors", "*.json", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja")
Pattern = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(no_control_chars)]


class ModelSource(Strict):
    rsync: Text = Field(description="a directory on the machine running the tool, pushed with rsync into "
                                    "`<model.path>/<digest>/` on the host (the release's `--model-path`); unchanged "
                                    "files are hard-linked from the newest version there, so only changed files travel")


class ModelSpec(Strict):
    path: Text = Field(description="Hugging Face repo id (staged into the host's HF cache before the switch) or "
                                   "absolute path of the weights on the host (`--model-path`); letters, digits, "
                                   "space and `._-/+@:=,~` only; a relative path is refused")
    revision: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,255}$")] | None = Field(
        None, description="commit, tag or branch of a repo id (none: the repo's main branch), resolved to a commit "
                          "at plan time and recorded; the release runs `--revision <commit>`")
    allow_patterns: list[Pattern] = Field(default_factory=lambda: list(DEFAULT_ALLOW_PATTERNS),
                                          description="files of the repo staged on the host (fnmatch, as "
                                                      "huggingface_hub's `allow_patterns`)")
    # a lambda, not `list`: pydantic reads a builtin's signature by tokenizing its text (a 4 ms regex, every command)
    ignore_patterns: list[Pattern] = Field(default_factory=lambda: [], description="files never staged")
    source: ModelSource | None = Field(
        None, description="where the weights come from when not a hub: `{rsync: LOCAL_DIR}` pushes them from this "
                          "machine (for hosts without internet); without it an absolute `model.path` is used as it "
                          "is, checked to hold a config.json")
    served_name: Text | None = Field(None, description="name clients use (`--served-model-name`)")
    tokenizer: Text | None = Field(None, description="tokenizer path if not the model's (`--tokenizer-path`)")
    trust_remote_code: bool = Field(False, description="`--trust-remote-code`")
    reasoning_parser: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_\-.]+$")] | None = Field(
        None, description="`--reasoning-parser`")
    tool_call_parser: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_\-.]+$")] | None = Field(
        None, description="`--tool-call-parser`")
    quantization: Quantization | None = Field(None, description="`--quantization` (modelopt_fp4, fp8, awq, ...)")
    kv_cache_dtype: KvCacheDtype = Field(KvCacheDtype.auto, description="`--kv-cache-dtype`")

    @field_validator("path")
    @classmethod
    def _safe_model_path(cls, value: str) -> str:
        if not _MODEL_RE.match(value):
            raise ValueError(
                "model path may contain letters, digits, spaces and . _ - / + @ : = , ~ only "
                "(no ; $ ` quotes or other shell characters)"
            )
        if not value.startswith("/") and not _HUB_REPO_RE.match(value):
            raise ValueError(
                f"{value!r} is neither an absolute path on the host nor a Hugging Face repo id (owner/name): a "
                "relative path is not resolved anywhere; give the weights' absolute directory on the host"
            )
        return value

    @model_validator(mode="after")
    def _revision_is_for_the_hub(self) -> ModelSpec:
        if self.revision is not None and self.is_local_path:
            raise ValueError("revision: an absolute model.path is used as it is on the host; it has no revision")
        if self.source is not None and not self.is_local_path:
            raise ValueError("source: rsync needs model.path to be the absolute directory on the host that holds "
                             "the pushed versions, e.g. /srv/models/glm5")
        return self

    @property
    def is_local_path(self) -> bool:
        """An absolute path on the host: nothing to stage, only checked to exist."""
        return self.path.startswith("/")


class ParallelSpec(Strict):
    tp: Literal[1, 2, 4, 8, 16] = Field(1, description="tensor parallel size (`--tp-size`): a power of two; "
                                                       "tp x dp x pp at most the host's GPU count")
    pp: Annotated[int, Field(ge=1, le=64)] = Field(1, description="pipeline parallel size (`--pp-size`)")
    dp: Annotated[int, Field(ge=1, le=64)] = Field(1, description="data parallel size (`--dp-size`)")
    nnodes: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="`--nnodes`; more than 1 is deployed to a group, one host per node "
                       "([multi-node](fleet.md#multi-node-sglang-one-release-over-a-group)); no allreduce fusion")
    node_rank: Annotated[int, Field(ge=0, le=63)] = Field(
        0, description="`--node-rank`: a group deploy sets it per node (the group's order, or the hosts' "
                       "`node_rank` var)")
    dist_init_addr: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")] | None = Field(
        None, description="`--dist-init-addr host:port` of node 0, as written (instead of `dist_init_port`)")
    dist_init_port: Annotated[int, Field(ge=1024, le=65535)] | None = Field(
        None, description="port of `--dist-init-addr` on node 0; a group deploy adds node 0's inventory address")

    @model_validator(mode="after")
    def _multi_node_needs_addr(self) -> ParallelSpec:
        if self.nnodes > 1 and self.dist_init_addr is None and self.dist_init_port is None:
            raise ValueError("nnodes > 1 needs dist_init_port (node 0's address comes from the inventory group) or "
                             "dist_init_addr (host:port of node 0)")
        if self.dist_init_addr is not None and self.dist_init_port is not None:
            raise ValueError("give dist_init_addr (host:port) or dist_init_port, not both")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nnodes {self.nnodes}")
        return self

    @property
    def gpus_per_node(self) -> int:
        return self.tp * self.pp * self.dp // self.nnodes

    @property
    def shape(self) -> str:
        """`tp 8 x dp 2`, `tp 4 x pp 3 over 2 nodes`: the factors of the GPUs the layout takes."""
        factors = " x ".join(f"{name} {size}" for name, size in (("tp", self.tp), ("dp", self.dp), ("pp", self.pp))
                             if size > 1 or name == "tp")
        return factors + (f" over {self.nnodes} nodes" if self.nnodes > 1 else "")

    def fitting(self, gpus: int) -> str:
        """A hint for a node of GPUS too few: this layout with a smaller tp, dp or pp that fits, where one does."""
        options = []
        for name in ("tp", "dp", "pp"):
            given: int = getattr(self, name)
            sizes = get_args(ParallelSpec.model_fields["tp"].annotation) if name == "tp" else range(1, given)
            smaller = [size for size in sizes if size < given
                       and self.model_copy(update={name: size}).gpus_per_node <= gpus]
            if smaller:
                options.append(self.model_copy(update={name: max(smaller)}).shape)
        fits = f"use {' or '.join(options)}, or " if options else ""
        return f"tp x dp x pp (per node) must be at most {gpus}: {fits}a host with {self.gpus_per_node} GPUs"


class MemorySpec(Strict):
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="`--mem-fraction-static`: fraction of GPU memory for weights + KV cache")
    max_running_requests: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="`--max-running-requests`")
    chunked_prefill_size: Annotated[int, Field(ge=-1, le=1_000_000)] | None = Field(
        None, description="`--chunked-prefill-size`")


class BackendSpec(Strict):
    attention: AttentionBackend | None = Field(None, description="`--attention-backend`")
    moe_runner: MoeRunnerBackend | None = Field(None, description="`--moe-runner-backend`")
    fp8_gemm: Fp8GemmBackend | None = Field(None, description="`--fp8-gemm-backend` (SGLang >= 0.5.6.post2)")
    dsa_decode: DsaBackend | None = Field(
        None, description="`--dsa-decode-backend` (`--nsa-decode-backend` before 0.5.15)")
    dsa_prefill: DsaBackend | None = Field(
        None, description="`--dsa-prefill-backend` (`--nsa-prefill-backend` before 0.5.15)")


class FeatureSpec(Strict):
    cuda_graph: bool = Field(True, description="false: `--disable-cuda-graph` (before 0.5.15) or "
                                               "`--cuda-graph-backend-{decode,prefill} disabled`")
    radix_cache: bool = Field(True, description="false: `--disable-radix-cache`")
    allreduce_fusion: bool = Field(
        False, description="FlashInfer allreduce+RMSNorm fusion: `--enable-flashinfer-allreduce-fusion` (before "
                           "0.5.15) or `--flashinfer-allreduce-fusion-backend auto`; upstream gates it to SM90/SM10X")
    metrics: bool = Field(False, description="`--enable-metrics` (Prometheus `/metrics`)")


class ServerSpec(Strict):
    host: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\-]+$", max_length=255)] = Field(
        "127.0.0.1", description="`--host`: the address the server listens on")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(30000, description="`--port`")
    api_key: SecretField | None = Field(
        None, description="`--api-key`, given by reference: `{env: NAME}`, `{file: PATH}` or `{command: [ARGV...]}` "
                          "([secrets](profiles.md#secrets))")


# nccl.<key> -> the environment variable it sets, in the env file's order
NCCL_ENV = {"p2p_level": "NCCL_P2P_LEVEL", "p2p_disable": "NCCL_P2P_DISABLE", "ib_disable": "NCCL_IB_DISABLE",
            "min_nchannels": "NCCL_MIN_NCHANNELS", "max_nchannels": "NCCL_MAX_NCHANNELS",
            "socket_ifname": "NCCL_SOCKET_IFNAME", "debug": "NCCL_DEBUG"}


class NcclSpec(Strict):
    p2p_level: P2PLevel | None = Field(None, description="`NCCL_P2P_LEVEL`: LOC, NVL, PIX, PXB, PHB, SYS or 0-5")
    p2p_disable: bool | None = Field(None, description="`NCCL_P2P_DISABLE`")
    ib_disable: bool | None = Field(None, description="`NCCL_IB_DISABLE`")
    min_nchannels: Annotated[int, Field(ge=1, le=64)] | None = Field(None, description="`NCCL_MIN_NCHANNELS`")
    max_nchannels: Annotated[int, Field(ge=1, le=64)] | None = Field(None, description="`NCCL_MAX_NCHANNELS`")
    socket_ifname: Annotated[str, StringConstraints(pattern=r"^[\^=]?[A-Za-z0-9_.,\-]+$")] | None = Field(
        None, description="`NCCL_SOCKET_IFNAME`")
    debug: NcclDebug | None = Field(None, description="`NCCL_DEBUG`")

    @field_validator("p2p_level", mode="before")
    @classmethod
    def _level_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _channels_ordered(self) -> NcclSpec:
        if self.min_nchannels and self.max_nchannels and self.min_nchannels > self.max_nchannels:
            raise ValueError(f"min_nchannels {self.min_nchannels} exceeds max_nchannels {self.max_nchannels}")
        return self

    def environment(self) -> dict[str, str]:
        as_env = {name: getattr(self, key) for key, name in NCCL_ENV.items()}
        return {k: env_text(v) for k, v in as_env.items() if v is not None}


def env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value.value if isinstance(value, StrEnum) else value)


class ServiceSpec(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_\-]{1,64}$")] = Field(
        "sglang", description="systemd unit name and store directory")
    venv: AbsPath = Field("/root/ml-env", description="virtual environment the server runs from (the inventory's "
                                                     "host var `venv` overrides it per host)")
    user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_\-]{0,31}$")] = Field(
        "root", description="`User=` of the unit")
    working_directory: AbsPath = Field("/root", description="`WorkingDirectory=` of the unit")
    startup_timeout_s: Annotated[int, Field(ge=5, le=24 * 3600)] = Field(
        1800, description="readiness deadline (and `TimeoutStartSec=`); real models take minutes to load")
    stop_timeout_s: Annotated[int, Field(ge=1, le=3600)] = Field(
        120, description="`TimeoutStopSec=`: how long the old server's in-flight requests may take to finish when it "
                         "stops (SGLang drains on SIGTERM with no bound of its own, then systemd kills what is left)")
    restart: RestartPolicy = Field(RestartPolicy.on_failure,
                                   description="`Restart=`: systemd restarts a server that crashes after its deploy")
    restart_sec: Annotated[int, Field(ge=0, le=3600)] = Field(10, description="`RestartSec=`: wait before a restart")
    start_limit_burst: Annotated[int, Field(ge=1, le=100)] = Field(
        3, description="`StartLimitBurst=`: restarts within start_limit_interval_s before systemd gives up and "
                       "leaves the unit failed")
    start_limit_interval_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] = Field(
        900, description="`StartLimitIntervalSec=`; must exceed start_limit_burst x restart_sec, and a model that "
                         "loads for minutes needs about start_limit_burst + 1 load times")
    limit_nofile: Annotated[int, Field(ge=1024, le=1_048_576)] = Field(65536, description="`LimitNOFILE=`")
    keep_releases: Annotated[int, Field(ge=2, le=100)] = Field(
        5, description="releases kept on the host (the current one, the last healthy one and the one `rollback` "
                       "returns to are never pruned)")
    venv_build: VenvSpec | None = Field(
        None, description="build the venv on the host from a hashed lock (content-addressed, immutable); "
                          "without it the server runs from `venv` as it is")

    @model_validator(mode="after")
    def _start_limit_reachable(self) -> ServiceSpec:
        # systemd refuses a start once start_limit_burst starts fell within one window; restarts come at least
        # restart_sec apart, so a window that cannot hold them all means a crash loop that never stops.
        if self.restart is not RestartPolicy.no and \
                self.start_limit_burst * self.restart_sec >= self.start_limit_interval_s:
            raise ValueError(f"start_limit_interval_s ({self.start_limit_interval_s}) must be longer than "
                             f"start_limit_burst x restart_sec ({self.start_limit_burst} x {self.restart_sec}), "
                             "or systemd restarts a crashing server for ever")
        return self
