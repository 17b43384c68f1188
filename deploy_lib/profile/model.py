"""A whole deployment profile (Profile), one loaded from its file (LoadedProfile), and its JSON Schema."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from deploy_lib.profile.credentials import looks_like_credential
from deploy_lib.profile.fields import MAX_STRING, SECRET_NAME_RE, EnvName, SecretField, Strict, Text, no_control_chars
from deploy_lib.profile.sections import (
    BackendSpec,
    FeatureSpec,
    MemorySpec,
    ModelSpec,
    NcclSpec,
    ParallelSpec,
    ServerSpec,
    ServiceSpec,
    env_text,
)
from deploy_lib.profile.settings import BenchSettings, GateSettings, PreflightSettings, WatchSettings
from deploy_lib.versions import ARGS, modelled_flags


def _move_it(name: str) -> str:
    return (f"move it to `secrets: {{{name}: {{env: {name}}}}}` (or `{{file: PATH}}`, `{{command: [ARGV...]}}`), "
            f"read where the tool runs")


class Profile(Strict):
    """A deployment profile: the intent; server_args turns it into one SGLang version's argv."""

    description: Text | None = Field(None, description="free text")
    model: ModelSpec
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    backends: BackendSpec = Field(default_factory=BackendSpec)
    features: FeatureSpec = Field(default_factory=FeatureSpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    nccl: NcclSpec = Field(default_factory=NcclSpec)
    env: dict[EnvName, Annotated[str, StringConstraints(max_length=MAX_STRING), AfterValidator(no_control_chars)]] = (
        Field(default_factory=dict, description="other environment of the server process (no secret-looking "
                                                    "names or values, not the NCCL ones of `nccl`, not "
                                                    "`VIRTUAL_ENV`)"))
    secrets: dict[EnvName, SecretField] = Field(
        default_factory=dict, description="environment variables whose values are read locally at deploy time, "
                                          "written only to the release's 0600 env file "
                                          "([secrets](profiles.md#secrets))")
    not_secret: list[EnvName] = Field(  # a lambda, not `list`: see ModelSpec.ignore_patterns
        default_factory=lambda: [],
        description="env names whose values look like a credential but are not one (a digest, a build id); "
                    "[secrets](profiles.md#secrets)")
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    bench: BenchSettings = Field(default_factory=BenchSettings,
                                 description="SGLang's serving benchmark, run by the gate and the `bench` "
                                             "command")
    gate: GateSettings | None = Field(None, description="benchmark every new release after it is ready and roll "
                                                        "it back when it is slower than the last good release")
    watch: WatchSettings | None = Field(None, description="read the live traffic's latency from /metrics before and "
                                                          "after the switch; roll back a regression at comparable "
                                                          "load (needs features.metrics; not behind a router)")
    preflight: PreflightSettings = Field(default_factory=PreflightSettings,
                                         description="checks a deploy runs before it starts the release")
    extra_args: list[Text] = Field(  # a lambda, not `list`: see ModelSpec.ignore_patterns
        default_factory=lambda: [],
        description="flags not modelled here, appended last; checked against the host's SGLang at "
                    "preflight; `--api-key` and a flag a key of the profile sets are refused")

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_text(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for name, text in value.items():
            credential = looks_like_credential(text) if isinstance(text, str) and "\n" in text else None
            if credential is not None:  # refused for its newline too, but this says what it is
                raise ValueError(f"{name}: its value looks like {credential.kind}, and a credential is never "
                                 f"written in a profile; {_move_it(name)}")
        return {k: (env_text(v) if isinstance(v, bool | int | float) else v) for k, v in value.items()}

    @model_validator(mode="after")
    def _env_is_not_secret_nor_modelled(self) -> Profile:
        for name in self.env:
            if SECRET_NAME_RE.search(name):
                raise ValueError(f"env.{name} looks like a secret; move it to `secrets: {{{name}: {{env: {name}}}}}`")
            credential = looks_like_credential(self.env[name])
            if credential is not None and name not in self.not_secret:
                raise ValueError(
                    f"env.{name}: its value looks like {credential.kind}, and a credential is never written in a "
                    f"profile; {_move_it(name)}. If it is not a secret, say so: `not_secret: [{name}]`")
            if name in self.nccl.environment():
                raise ValueError(f"env.{name} is also set by `nccl:`; set it in one place")
            if name == "VIRTUAL_ENV":
                raise ValueError("env.VIRTUAL_ENV is set from the venv the release runs from (service.venv); "
                                 "remove it")
        self._not_secret_is_needed()
        clash = sorted(set(self.env) & set(self.secrets))
        if clash:
            raise ValueError(f"{', '.join(clash)} set in both env and secrets")
        if self.watch is not None and not self.features.metrics:
            raise ValueError("watch: reads SGLang's /metrics; set features.metrics: true (--enable-metrics)")
        if self.features.allreduce_fusion and self.parallel.nnodes > 1:
            raise ValueError("allreduce_fusion is single-node (TRT-LLM fusion uses CUDA IPC); nnodes must be 1")
        for arg in self.extra_args:
            if arg.startswith("--") and arg.split("=", 1)[0] in ("--api-key", "--admin-api-key"):
                raise ValueError(f"extra_args: {arg.split('=', 1)[0]} would put a secret in argv; use server.api_key")
        self._no_flag_twice()
        return self

    def _not_secret_is_needed(self) -> None:
        """Each name in not_secret waives the value check of one env value that would be refused without it: not a
        name (HF_TOKEN is a secret whatever its value), not a name missing from env, not a value that passes anyway
        (a waiver left behind would let the next value through unseen)."""
        for name in self.not_secret:
            if name not in self.env:
                raise ValueError(f"not_secret: {name} is not in env; remove it from not_secret")
            if SECRET_NAME_RE.search(name):
                raise ValueError(f"not_secret: {name} is a secret by its name, whatever its value; move it to "
                                 f"`secrets: {{{name}: {{env: {name}}}}}`")
            if looks_like_credential(self.env[name]) is None:
                raise ValueError(f"not_secret: env.{name} does not look like a credential; remove it from "
                                 f"not_secret")
        if len(set(self.not_secret)) != len(self.not_secret):
            raise ValueError("not_secret: a name is given twice")

    def _no_flag_twice(self) -> None:
        """A flag a key of the profile writes may not be given again in extra_args (SGLang would take the last); a key
        set to null writes no flag, so the flag may then be given by hand."""
        given = {arg.split("=", 1)[0] for arg in self.extra_args if arg.startswith("--")}
        for row in ARGS:
            section_name, key = row.key.split(".", 1)
            section = getattr(self, section_name)
            twice = sorted(given & modelled_flags(row))
            if twice and key in section.model_fields_set and getattr(section, key) is not None:
                raise ValueError(f"{row.key} ({getattr(section, key)}) and extra_args ({twice[0]}) both give "
                                 f"{twice[0]}: set it in one place (as {row.key})")

    def environment(self) -> dict[str, str]:
        """Non-secret environment of the server process, NCCL first, in a stable order."""
        return {**self.nccl.environment(), **self.env}

    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


class LoadedProfile(BaseModel):
    """A validated profile with where it came from."""

    model_config = ConfigDict(defer_build=True, frozen=True, arbitrary_types_allowed=True)
    name: str
    path: Path
    chain: tuple[str, ...]  # this profile first, then its parents
    profile: Profile
    overrides: tuple[str, ...] = ()  # `--set path=value` texts applied on top of the file, in the order given


SCHEMA_KEY = "$schema"


def profile_json_schema() -> dict[str, Any]:
    schema = Profile.model_json_schema()
    schema["properties"]["extends"] = {"type": "string", "description": "name of a profile this one builds on"}
    schema["properties"][SCHEMA_KEY] = {"type": "string", "description": "path or URL of this schema, for editors"}
    schema["title"] = "sglang-deploy profile"
    return schema

