"""Deployment profiles: pydantic models, YAML loading with `extends:`, errors that name file, key and allowed values."""

from __future__ import annotations

import hashlib
import json
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from deploy_lib.errors import ConfigError, did_you_mean
from deploy_lib.settings import BenchSettings, GateSettings, PreflightSettings, VenvSpec
from deploy_lib.yaml_io import load_yaml_mapping

MAX_STRING = 4096  # longer than any real path or flag value; stops 1 MB strings at the door


def _no_control_chars(value: str) -> str:
    bad = next((c for c in value if c in "\x00\n\r" or (ord(c) < 32 and c != "\t")), None)
    if bad is not None:
        raise ValueError(f"contains the control character {bad!r}; newlines and NUL cannot be passed safely")
    return value


Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STRING), AfterValidator(_no_control_chars)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
AbsPath = Annotated[str, StringConstraints(pattern=r"^/", max_length=MAX_STRING), AfterValidator(_no_control_chars)]

# Model ids and paths reach argv, the unit and the journal: shell metacharacters are refused outright.
_MODEL_RE = re.compile(r"^[A-Za-z0-9._\-/+@:=,~ ]+$")
# Names that carry credentials; they must come through `secrets:` by reference, never inline.
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIALS?)$", re.IGNORECASE)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


# Backend and parser choices that some release in versions.KNOWN_SGLANG accepts (versions.CHOICE_FLAGS names the
# flag each enum is checked against, tests/test_versions.py against the real wheels).
# Preflight checks the chosen value against the parser of the version actually installed on the host.
class AttentionBackend(StrEnum):
    aiter = "aiter"
    ascend = "ascend"
    compressed = "compressed"
    cutedsl_mla = "cutedsl_mla"
    cutlass_mla = "cutlass_mla"
    dsa = "dsa"
    dsv4 = "dsv4"
    dual_chunk_flash_attn = "dual_chunk_flash_attn"
    fa3 = "fa3"
    fa4 = "fa4"
    flashinfer = "flashinfer"
    flashmla = "flashmla"
    flex_attention = "flex_attention"
    hpc_ops = "hpc_ops"
    intel_amx = "intel_amx"
    intel_xpu = "intel_xpu"
    nsa = "nsa"
    qsa = "qsa"
    torch_native = "torch_native"
    triton = "triton"
    trtllm_mha = "trtllm_mha"
    trtllm_mla = "trtllm_mla"
    wave = "wave"


class MoeRunnerBackend(StrEnum):
    aiter = "aiter"
    auto = "auto"
    cutlass = "cutlass"
    deep_gemm = "deep_gemm"
    flashinfer_cutedsl = "flashinfer_cutedsl"
    flashinfer_cutlass = "flashinfer_cutlass"
    flashinfer_megamoe = "flashinfer_megamoe"
    flashinfer_mxfp4 = "flashinfer_mxfp4"
    flashinfer_trtllm = "flashinfer_trtllm"
    flashinfer_trtllm_routed = "flashinfer_trtllm_routed"
    marlin = "marlin"
    triton = "triton"
    triton_kernel = "triton_kernel"


class Fp8GemmBackend(StrEnum):
    aiter = "aiter"
    auto = "auto"
    cutlass = "cutlass"
    deep_gemm = "deep_gemm"
    flashinfer_cutedsl = "flashinfer_cutedsl"
    flashinfer_cutlass = "flashinfer_cutlass"
    flashinfer_deepgemm = "flashinfer_deepgemm"
    flashinfer_trtllm = "flashinfer_trtllm"
    triton = "triton"


class DsaBackend(StrEnum):
    """Sparse-attention (NSA, renamed DSA in 0.5.15) decode/prefill kernels."""

    aiter = "aiter"
    fa3 = "fa3"
    flashinfer_sparse_mla = "flashinfer_sparse_mla"
    flashmla_auto = "flashmla_auto"
    flashmla_kv = "flashmla_kv"
    flashmla_sparse = "flashmla_sparse"
    flashmla_sparse_q8 = "flashmla_sparse_q8"
    intel_xpu = "intel_xpu"
    tilelang = "tilelang"
    triton = "triton"
    triton_sparse_mla = "triton_sparse_mla"
    trtllm = "trtllm"


class KvCacheDtype(StrEnum):
    auto = "auto"
    bf16 = "bf16"
    bfloat16 = "bfloat16"
    fp4_e2m1 = "fp4_e2m1"
    fp4_mx_block16 = "fp4_mx_block16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"


class Quantization(StrEnum):
    awq = "awq"
    awq_marlin = "awq_marlin"
    bitsandbytes = "bitsandbytes"
    compressed_tensors = "compressed-tensors"
    fp8 = "fp8"
    gguf = "gguf"
    gptq = "gptq"
    gptq_marlin = "gptq_marlin"
    modelopt = "modelopt"
    modelopt_fp4 = "modelopt_fp4"
    modelopt_fp8 = "modelopt_fp8"
    moe_wna16 = "moe_wna16"
    mxfp4 = "mxfp4"
    w4afp8 = "w4afp8"
    w8a8_fp8 = "w8a8_fp8"
    w8a8_int8 = "w8a8_int8"


class P2PLevel(StrEnum):
    """NCCL_P2P_LEVEL: a name or its number (0 LOC .. 5 SYS), as NCCL documents."""

    LOC = "LOC"
    NVL = "NVL"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    SYS = "SYS"
    L0 = "0"
    L1 = "1"
    L2 = "2"
    L3 = "3"
    L4 = "4"
    L5 = "5"


class NcclDebug(StrEnum):
    VERSION = "VERSION"
    WARN = "WARN"
    INFO = "INFO"
    TRACE = "TRACE"


class RestartPolicy(StrEnum):
    no = "no"
    on_failure = "on-failure"
    always = "always"


class SecretRef(Strict):
    """A secret given by reference: the name of a local environment variable, or a local file holding it."""

    env: EnvName | None = None
    file: Text | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of `env: VAR_NAME` or `file: /path/to/secret`")
        return self


def _secret_ref(value: Any) -> Any:
    if isinstance(value, str | int | float):
        raise ValueError(
            "secrets are never written inline; give `{env: VAR_NAME}` (a local environment variable) "
            "or `{file: /path}` (a local file)"
        )
    return value


SecretField = Annotated[SecretRef, BeforeValidator(_secret_ref), Field(description="{env: NAME} or {file: PATH}")]


# The files SGLang reads from a checkpoint: weights, configs and index, tokenizer files, remote code, chat templates.
DEFAULT_ALLOW_PATTERNS = ("*.safetensors", "*.json", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja")
Pattern = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_no_control_chars)]


class ModelSource(Strict):
    rsync: Text = Field(description="directory on the machine running the tool, pushed to the host with rsync")


class ModelSpec(Strict):
    path: Text = Field(description="Hugging Face repo id or absolute path of the weights (--model-path)")
    revision: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,255}$")] | None = Field(
        None, description="commit, tag or branch of a hub model (default main), resolved to a commit at plan time")
    allow_patterns: list[Pattern] = Field(default_factory=lambda: list(DEFAULT_ALLOW_PATTERNS),
                                          description="files of the repo staged on the host (fnmatch patterns)")
    ignore_patterns: list[Pattern] = Field(default_factory=list, description="files never staged")
    source: ModelSource | None = Field(
        None, description="{rsync: LOCAL_DIR}: push the weights from this machine into a version directory under "
                          "the absolute model.path on the host (for hosts without internet)")
    served_name: Text | None = Field(None, description="name clients use (--served-model-name)")
    tokenizer: Text | None = Field(None, description="tokenizer path if not the model's (--tokenizer-path)")
    trust_remote_code: bool = False
    reasoning_parser: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_\-.]+$")] | None = None
    tool_call_parser: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_\-.]+$")] | None = None
    quantization: Quantization | None = None
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.auto

    @field_validator("path")
    @classmethod
    def _safe_model_path(cls, value: str) -> str:
        if not _MODEL_RE.match(value):
            raise ValueError(
                "model path may contain letters, digits, spaces and . _ - / + @ : = , ~ only "
                "(no ; $ ` quotes or other shell characters)"
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
    tp: Literal[1, 2, 4, 8, 16] = Field(1, description="tensor parallel size (--tp-size): a power of two")
    pp: Annotated[int, Field(ge=1, le=64)] = Field(1, description="pipeline parallel size (--pp-size)")
    dp: Annotated[int, Field(ge=1, le=64)] = Field(1, description="data parallel size (--dp-size)")
    nnodes: Annotated[int, Field(ge=1, le=64)] = 1
    node_rank: Annotated[int, Field(ge=0, le=63)] = 0
    dist_init_addr: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")] | None = Field(
        None, description="--dist-init-addr host:port of node 0, as written (else node 0's address and dist_init_port)")
    dist_init_port: Annotated[int, Field(ge=1024, le=65535)] | None = Field(
        None, description="port of --dist-init-addr on node 0; a group deploy adds node 0's inventory address")

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


class MemorySpec(Strict):
    mem_fraction_static: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="fraction of GPU memory for weights + KV cache, in (0, 1)")
    max_running_requests: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    chunked_prefill_size: Annotated[int, Field(ge=-1, le=1_000_000)] | None = None


class BackendSpec(Strict):
    attention: AttentionBackend | None = None
    moe_runner: MoeRunnerBackend | None = None
    fp8_gemm: Fp8GemmBackend | None = None
    dsa_decode: DsaBackend | None = Field(None, description="--dsa-decode-backend (--nsa-decode-backend < 0.5.15)")
    dsa_prefill: DsaBackend | None = Field(None, description="--dsa-prefill-backend (--nsa-prefill-backend < 0.5.15)")


class FeatureSpec(Strict):
    cuda_graph: bool = True
    radix_cache: bool = True
    allreduce_fusion: bool = Field(False, description="FlashInfer allreduce+RMSNorm fusion (SM90/SM10X upstream)")
    metrics: bool = Field(False, description="--enable-metrics: Prometheus /metrics")


class ServerSpec(Strict):
    host: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\-]+$", max_length=255)] = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    api_key: SecretField | None = None


# nccl.<key> -> the environment variable it sets, in the env file's order
NCCL_ENV = {"p2p_level": "NCCL_P2P_LEVEL", "p2p_disable": "NCCL_P2P_DISABLE", "ib_disable": "NCCL_IB_DISABLE",
            "min_nchannels": "NCCL_MIN_NCHANNELS", "max_nchannels": "NCCL_MAX_NCHANNELS",
            "socket_ifname": "NCCL_SOCKET_IFNAME", "debug": "NCCL_DEBUG"}


class NcclSpec(Strict):
    p2p_level: P2PLevel | None = Field(None, description="NCCL_P2P_LEVEL: LOC/NVL/PIX/PXB/PHB/SYS or 0-5")
    p2p_disable: bool | None = None
    ib_disable: bool | None = None
    min_nchannels: Annotated[int, Field(ge=1, le=64)] | None = None
    max_nchannels: Annotated[int, Field(ge=1, le=64)] | None = None
    socket_ifname: Annotated[str, StringConstraints(pattern=r"^[\^=]?[A-Za-z0-9_.,\-]+$")] | None = None
    debug: NcclDebug | None = None

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
        return {k: _env_text(v) for k, v in as_env.items() if v is not None}


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value.value if isinstance(value, StrEnum) else value)


class ServiceSpec(Strict):
    name: Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_\-]{1,64}$")] = "sglang"
    venv: AbsPath = Field("/root/ml-env", description="virtual environment the server runs from")
    user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_\-]{0,31}$")] = "root"
    working_directory: AbsPath = "/root"
    startup_timeout_s: Annotated[int, Field(ge=5, le=24 * 3600)] = Field(
        1800, description="readiness deadline; real models take minutes to load")
    stop_timeout_s: Annotated[int, Field(ge=1, le=3600)] = 120
    restart: RestartPolicy = Field(RestartPolicy.on_failure,
                                   description="systemd restarts a server that crashes after its deploy")
    restart_sec: Annotated[int, Field(ge=0, le=3600)] = 10
    start_limit_burst: Annotated[int, Field(ge=1, le=100)] = Field(
        3, description="restarts within start_limit_interval_s before systemd gives up and leaves the unit failed")
    start_limit_interval_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] = 900
    limit_nofile: Annotated[int, Field(ge=1024, le=1_048_576)] = 65536
    keep_releases: Annotated[int, Field(ge=2, le=100)] = 5
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


ExtraArg = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STRING), AfterValidator(_no_control_chars)]


class Profile(Strict):
    """A deployment profile: the intent; server_args turns it into one SGLang version's argv."""

    description: Text | None = None
    model: ModelSpec
    parallel: ParallelSpec = ParallelSpec()
    memory: MemorySpec = MemorySpec()
    backends: BackendSpec = BackendSpec()
    features: FeatureSpec = FeatureSpec()
    server: ServerSpec = ServerSpec()
    nccl: NcclSpec = NcclSpec()
    env: dict[EnvName, Annotated[str, StringConstraints(max_length=MAX_STRING), AfterValidator(_no_control_chars)]] = (
        Field(default_factory=dict, description="other environment of the server process"))
    secrets: dict[EnvName, SecretField] = Field(
        default_factory=dict, description="environment variables whose values are read locally at deploy time")
    service: ServiceSpec = ServiceSpec()
    bench: BenchSettings = Field(default_factory=BenchSettings,
                                 description="SGLang's serving benchmark, run by the gate and `invoke bench`")
    gate: GateSettings | None = Field(None, description="benchmark every new release after it is ready and roll "
                                                        "it back when it is slower than the last good release")
    preflight: PreflightSettings = Field(default_factory=PreflightSettings,
                                         description="checks a deploy runs before it starts the release")
    extra_args: list[ExtraArg] = Field(
        default_factory=list, description="flags not modelled here; checked against the host's SGLang at preflight")

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_text(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: (_env_text(v) if isinstance(v, bool | int | float) else v) for k, v in value.items()}

    @model_validator(mode="after")
    def _env_is_not_secret_nor_modelled(self) -> Profile:
        for name in self.env:
            if SECRET_NAME_RE.search(name):
                raise ValueError(f"env.{name} looks like a secret; move it to `secrets: {{{name}: {{env: {name}}}}}`")
            if name in self.nccl.environment():
                raise ValueError(f"env.{name} is also set by `nccl:`; set it in one place")
            if name == "VIRTUAL_ENV":
                raise ValueError("env.VIRTUAL_ENV is set from the venv the release runs from (service.venv); "
                                 "remove it")
        clash = sorted(set(self.env) & set(self.secrets))
        if clash:
            raise ValueError(f"{', '.join(clash)} set in both env and secrets")
        if self.features.allreduce_fusion and self.parallel.nnodes > 1:
            raise ValueError("allreduce_fusion is single-node (TRT-LLM fusion uses CUDA IPC); nnodes must be 1")
        for arg in self.extra_args:
            if arg.startswith("--") and arg.split("=", 1)[0] in ("--api-key", "--admin-api-key"):
                raise ValueError(f"extra_args: {arg.split('=', 1)[0]} would put a secret in argv; use server.api_key")
        return self

    def environment(self) -> dict[str, str]:
        """Non-secret environment of the server process, NCCL first, in a stable order."""
        return {**self.nccl.environment(), **self.env}

    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


class LoadedProfile(BaseModel):
    """A validated profile with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    name: str
    path: Path
    chain: tuple[str, ...]  # this profile first, then its parents
    profile: Profile


SCHEMA_KEY = "$schema"
PROFILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def profile_path(profiles_dir: Path, name: str) -> Path:
    if not PROFILE_NAME_RE.match(name):
        raise ConfigError(f"profile name {name!r} is not valid", "use letters, digits, '.', '_' and '-'")
    return profiles_dir / f"{name}.yaml"


def _resolve(profiles_dir: Path, name: str, seen: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    path = profile_path(profiles_dir, name)
    if name in seen:
        cycle = " -> ".join((*seen, name))
        raise ConfigError(f"{path}: extends: cycle {cycle}", "remove one `extends:` from the cycle")
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir.glob("*.yaml"))
        where = f"{profile_path(profiles_dir, seen[-1])}: extends: " if seen else ""
        raise ConfigError(f"{where}profile {name!r} not found ({path})", f"known profiles: {', '.join(known)}")
    raw = load_yaml_mapping(path)
    raw.pop(SCHEMA_KEY, None)  # for editors only: where the profile's JSON Schema is
    parent = raw.pop("extends", None)
    if parent is None:
        return raw, (name,)
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: must be a profile name, got {type(parent).__name__}")
    parent_raw, parent_chain = _resolve(profiles_dir, parent, (*seen, name))
    return _deep_merge(parent_raw, raw), (name, *parent_chain)


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None,
                            extra_keys: Iterable[str] = ()) -> str:
    """One line per problem, naming the key; with `model`, a close known key or choice is suggested."""
    lines = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
            if model is not None:
                known = _keys_at(model, item["loc"][:-1])
                msg += did_you_mean(str(item["loc"][-1]), [*known, *(extra_keys if len(item["loc"]) == 1 else ())])
        elif item["type"] in ("enum", "literal_error"):
            choices = re.findall(r"'([^']*)'", (item.get("ctx") or {}).get("expected", ""))
            msg += did_you_mean(str(item["input"]), choices)
        lines.append(f"{source}: {key}: {msg}")
    return "\n".join(lines)


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys a mapping at `loc` of `model` may have (a dict's own key or a list index is a level too)."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        else:  # a dict or a list: step into its value type
            current = next((arg for arg in typing.get_args(current)[1:] or typing.get_args(current)), None)
        current = _model_in(current) or current
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _model_in(annotation: Any) -> Any:
    """The annotation itself if it is a mapping type or a model; else the first such type inside Optional/Annotated."""
    is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    if is_model or typing.get_origin(annotation) in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_profile(profiles_dir: Path, name: str) -> LoadedProfile:
    """Load NAME.yaml from profiles_dir, following `extends:`; raise ConfigError naming file and key."""
    raw, chain = _resolve(profiles_dir, name, ())
    path = profile_path(profiles_dir, name)
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as err:
        source = str(path) if len(chain) == 1 else f"{path} (extends {' -> '.join(chain[1:])})"
        raise ConfigError(format_validation_error(source, err, Profile, ("extends",)), _allowed_hint(err)) from None
    return LoadedProfile(name=name, path=path, chain=chain, profile=profile)


def _allowed_hint(err: ValidationError) -> str | None:
    if any(item["type"] == "extra_forbidden" for item in err.errors()):
        return "`invoke schema` prints every key a profile may have"
    return None


@dataclass(frozen=True)
class StoredProfile:
    """The parts of a profile recorded in a release.json that running that release again needs.

    Read against today's schema without failing on it: a release written before a key was renamed, removed or
    added stays rollback-able. The release.json itself is never rewritten, so unknown keys stay on the host."""

    server: ServerSpec
    service: ServiceSpec
    parallel: ParallelSpec
    features: FeatureSpec
    unknown: tuple[str, ...] = ()    # keys today's schema does not have: kept in release.json, not used
    refused: tuple[str, ...] = ()    # recorded values today's schema refuses: "key: why", read as the default

    def notes(self, release_id: str) -> list[str]:
        notes = []
        if self.unknown:
            notes.append(f"release {release_id} records profile keys this version does not know (kept, not used): "
                         f"{', '.join(self.unknown)}")
        if self.refused:
            notes.append(f"release {release_id} records profile values this version refuses (defaults used): "
                         f"{'; '.join(self.refused)}")
        return notes


def _section_model(annotation: Any) -> type[BaseModel] | None:
    candidates = (annotation, *typing.get_args(annotation))
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _known_keys(model: type[BaseModel], data: Any, prefix: str, unknown: list[str]) -> Any:
    """`data` without the keys `model` (and its sections) does not have; each one left out is added to `unknown`."""
    if not isinstance(data, dict):
        return data
    known = {}
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            unknown.append(f"{prefix}{key}")
            continue
        section = _section_model(field.annotation)
        known[key] = _known_keys(section, value, f"{prefix}{key}.", unknown) if section else value
    return known


def _lenient_section(model: type[Strict], name: str, data: Any, refused: list[str]) -> Any:
    """One section of a stored profile; a recorded value the model refuses is reported and its default used."""
    values = dict(data) if isinstance(data, dict) else {}
    while True:
        try:
            return model.model_validate(values)
        except ValidationError as err:
            bad = {str(item["loc"][0]): item["msg"] for item in err.errors() if item["loc"]}
            bad_here = {key: msg for key, msg in bad.items() if key in values}
            if not bad_here:  # a check across keys: nothing recorded in this section can be used
                refused.append(f"{name}: {err.errors()[0]['msg']}")
                return model()
            refused.extend(f"{name}.{key}: {msg}" for key, msg in bad_here.items())
            values = {key: value for key, value in values.items() if key not in bad_here}


def read_stored_profile(data: Any) -> StoredProfile:
    """A release's recorded profile, read leniently (see StoredProfile); never raises on what was recorded."""
    unknown: list[str] = []
    refused: list[str] = []
    known = _known_keys(Profile, data if isinstance(data, dict) else {}, "", unknown)
    return StoredProfile(server=_lenient_section(ServerSpec, "server", known.get("server"), refused),
                         service=_lenient_section(ServiceSpec, "service", known.get("service"), refused),
                         parallel=_lenient_section(ParallelSpec, "parallel", known.get("parallel"), refused),
                         features=_lenient_section(FeatureSpec, "features", known.get("features"), refused),
                         unknown=tuple(unknown), refused=tuple(refused))


def profile_json_schema() -> dict[str, Any]:
    schema = Profile.model_json_schema()
    schema["properties"]["extends"] = {"type": "string", "description": "name of a profile this one builds on"}
    schema["properties"][SCHEMA_KEY] = {"type": "string", "description": "path or URL of this schema, for editors"}
    schema["title"] = "sglang-deploy profile"
    return schema


def venv_python(profile: Profile) -> PurePosixPath:
    return PurePosixPath(profile.service.venv) / "bin" / "python3"
