"""A Release: the complete desired state of one host's server, as data, with a content id; and its semantic diff."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from deploy_lib.digests import sha256_text
from deploy_lib.errors import ConfigError
from deploy_lib.models import ReleaseModel
from deploy_lib.profile import LoadedProfile, Profile, SecretRef, StoredProfile, read_stored_profile
from deploy_lib.release.render import (
    EnvSpec,
    UnitSpec,
    render_digested_unit,
    render_env,
    render_env_redacted,
    render_launcher,
    unit_digest_of,
    validate_argv,
    validate_env,
    validate_unit,
)
from deploy_lib.release.server_args import API_KEY_ENV, launch_argv, launch_environment, secret_environment, sglang_args
from deploy_lib.store import ENV_FILE, LAUNCHER_FILE, UNIT_FILE, StoreLayout
from deploy_lib.yaml_io import read_text_file

SECRET_NOT_AVAILABLE = "not available here"
SECRET_VALUES = "values"  # the Change that says secret values differ (a digest comparison)
SECRET_PLACEHOLDER = "<secret>"


SECRET_COMMAND_TIMEOUT_S = 120  # a password manager may ask for its own unlock at the terminal


def _secret_from_command(label: str, argv: tuple[str, ...]) -> str:
    """The stdout of the secret's command run here without a shell (one trailing newline dropped); its output is
    never shown, its stderr only when it fails."""
    shown = shlex.join(argv)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=SECRET_COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise ConfigError(f"{label}: command {argv[0]!r} is not found on this machine",
                          f"install it or fix the secret's `command:` ({shown})") from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"{label}: `{shown}` did not run: {error}") from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "no message"
        raise ConfigError(f"{label}: `{shown}` exited with status {done.returncode}: {said}",
                          "run it yourself to see why (not signed in to the password manager?)")
    return done.stdout.removesuffix("\n")


def read_secret(name: str, ref: SecretRef, environ: Mapping[str, str], source: str | None = None) -> str:
    """The secret's value from this machine; never from the profile itself. A refusal names `source` (the profile
    file) where it is given."""
    label = f"{source}: secret {name}" if source else f"secret {name}"
    if ref.env is not None:
        if ref.env not in environ:
            raise ConfigError(f"{label}: environment variable {ref.env} is not set on this machine",
                              f"export {ref.env}=... before deploying")
        value = environ[ref.env]
    elif ref.command is not None:
        value = _secret_from_command(label, ref.command)
    else:
        path = Path(os.path.expanduser(str(ref.file)))
        try:
            value = read_text_file(path).rstrip("\n")
        except ConfigError as err:
            raise ConfigError(f"{label}: {err.message}", err.hint) from None
    if not value or any(c in value for c in "\x00\n\r"):
        origin = ref.env or ref.file or f"`{shlex.join(ref.command or ())}`"
        raise ConfigError(f"{label}: value from {origin} is empty or has a newline/NUL")
    return value


def resolve_secrets(profile: Profile, environ: Mapping[str, str], source: str | None = None) -> dict[str, str]:
    """Every secret of the env file (profile secrets and the API key), read on this machine; `source`: the profile
    file, named by a refusal."""
    return {name: read_secret(name, ref, environ, source) for name, ref in secret_environment(profile).items()}


def available_secrets(profile: Profile, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """For a plan, which needs no secret value: the secrets readable here, and why each other one is not."""
    values, not_available = {}, {}
    for name, ref in secret_environment(profile).items():
        try:
            values[name] = read_secret(name, ref, environ)
        except ConfigError as error:
            not_available[name] = error.message.removeprefix(f"secret {name}: ")
    return values, not_available


def describe_secret_source(ref: Mapping[str, Any]) -> str:
    """Where a secret is read from, in the profile's own syntax: never its value."""
    def shown(value: Any) -> str:
        return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list | tuple) else str(value)
    return "{" + ", ".join(f"{key}: {shown(value)}" for key, value in ref.items() if value is not None) + "}"


def _secret_sources(metadata: Mapping[str, Any]) -> dict[str, str]:
    profile = metadata.get("profile") or {}
    refs = dict(profile.get("secrets") or {})
    api_key = (profile.get("server") or {}).get("api_key")
    if api_key:
        refs[API_KEY_ENV] = api_key
    return {name: describe_secret_source(refs[name]) if isinstance(refs.get(name), Mapping) else "(set)"
            for name in metadata.get("secret_names", [])}


@dataclass(frozen=True)
class Release:
    """Everything that decides how the server starts. `id` is derived from the content, so equal means no change.

    The unit, env file and launcher are rendered when first read (staging them, `render`, `record()`): a no-op deploy
    compares ids and renders nothing. Their specs are checked when the release is built, so bad input fails as early.
    The unit names `current`'s env file and launcher, so every release with the same unit-level settings has the same
    unit text, and a switch between them needs no daemon-reload (deploy/plan.py `unit_held`)."""

    id: str
    service: str
    profile_name: str
    profile_hash: str
    profile: dict[str, Any]
    sglang_version: str
    flashinfer_version: str | None
    venv: str
    argv: tuple[str, ...]
    args: tuple[str, ...]
    environment: dict[str, str]
    secret_names: tuple[str, ...]
    secrets_digest: str
    unit: UnitSpec = field(repr=False)
    env: EnvSpec = field(repr=False)
    patches: tuple[str, ...] = ()
    model: dict[str, str] = field(default_factory=dict)  # ReleaseModel.metadata(): path, revision, commit, hf_home
    torch_version: str | None = None  # the venv's torch and NCCL: preflight.gpu_check compares them with current's
    nccl_version: str | None = None
    hand_written_unit: str | None = field(default=None, repr=False)  # an adopted unit file, kept as release 0's
    overrides: tuple[str, ...] = ()  # the `--set path=value` options the profile was deployed with

    @cached_property
    def unit_text(self) -> str:
        return self.hand_written_unit if self.hand_written_unit is not None else render_digested_unit(self.unit)

    @cached_property
    def unit_digest(self) -> str | None:
        """The digest the rendered unit carries in Description=; None for an adopted hand-written unit."""
        return None if self.hand_written_unit is not None else unit_digest_of(self.unit_text)

    @cached_property
    def launcher_text(self) -> str | None:
        """The launcher the rendered unit runs; an adopted hand-written unit runs its own ExecStart= instead."""
        return None if self.hand_written_unit is not None else render_launcher(self.argv)

    @cached_property
    def env_text(self) -> str:
        return render_env(self.env)

    @cached_property
    def env_text_redacted(self) -> str:
        return render_env_redacted(self.env)

    def record(self) -> dict[str, Any]:
        """What release.json records: the metadata, the sha256 of each file as written and the unit's digest."""
        files = {UNIT_FILE: sha256_text(self.unit_text), ENV_FILE: sha256_text(self.env_text)}
        if self.launcher_text is not None:
            files[LAUNCHER_FILE] = sha256_text(self.launcher_text)
        digest = {"unit_digest": self.unit_digest} if self.unit_digest is not None else {}
        return {**self.metadata(), "files": files, **digest}

    def metadata(self) -> dict[str, Any]:
        """The release as plans, probes and history read it (release.json without `files`, see `record`): no secret
        value, only a digest that changes when one does."""
        return {
            "id": self.id, "service": self.service, "profile_name": self.profile_name,
            "profile_hash": self.profile_hash, "profile": self.profile, "sglang_version": self.sglang_version,
            "flashinfer_version": self.flashinfer_version, "torch_version": self.torch_version,
            "nccl_version": self.nccl_version, "venv": self.venv, "argv": list(self.argv),
            "args": list(self.args), "environment": self.environment, "secret_names": list(self.secret_names),
            "secrets_digest": self.secrets_digest, "patches": list(self.patches), "model": self.model,
            "overrides": list(self.overrides),
            # the unit's settings, which `plan` compares (an adopted hand-written unit's are its own file's)
            **({"unit": unit_settings(self.unit)} if self.hand_written_unit is None else {}),
        }


@dataclass(frozen=True)
class RenderedContent:
    """What a release's id hashes: what the host runs (the unit's settings, the server's argv and environment, the
    secrets' digest, the venv and its SGLang, the patch set, the weights), never the profile it came from. A
    profile field that renders nothing (one a later version of the tool adds with a default, bench or gate
    settings, keep_releases) makes no new release and restarts nothing; every field that renders something reaches
    one of these, and `diff_releases` shows it."""

    unit: Mapping[str, str]
    argv: tuple[str, ...]
    environment: Mapping[str, str]
    secrets_digest: str
    venv: str
    sglang_version: str
    patches: tuple[str, ...]
    model: Mapping[str, str]
    service: str


def rendered_id(content: RenderedContent) -> str:
    """The release id of `content`: 12 hex digits of the sha256 of its canonical JSON."""
    fields = {"unit": dict(content.unit), "argv": list(content.argv), "environment": dict(content.environment),
              "secrets": content.secrets_digest, "venv": content.venv, "version": content.sglang_version,
              "patches": list(content.patches), "model": dict(content.model), "service": content.service}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def unit_settings(spec: UnitSpec) -> dict[str, str]:
    """The unit's settings as its file writes them (name= -> value), each as text: what `plan` compares and the id
    hashes. The template adds nothing that varies (render.py); Description= is the service's, its digest left out."""
    return {"Description": spec.description, "User": spec.user, "Group": spec.group or "",
            "WorkingDirectory": spec.working_directory, "EnvironmentFile": spec.environment_file,
            "ExecStart": shlex.join(spec.exec_argv), "TimeoutStartSec": str(spec.timeout_start_s),
            "TimeoutStopSec": str(spec.timeout_stop_s), "Restart": str(spec.restart),
            "RestartSec": str(spec.restart_sec),
            "StartLimitBurst": str(spec.start_limit_burst), "StartLimitIntervalSec": str(spec.start_limit_interval_s),
            "LimitNOFILE": str(spec.limit_nofile), "SyslogIdentifier": spec.syslog_identifier}


def renders_as(record: Mapping[str, Any], release: Release) -> bool:
    """A recorded release (release.json) holds what `release` renders: the same unit, env file and launcher (the
    sha256 of each file as written: secrets' values included), on the same venv, SGLang, patches and weights.
    Whatever id it was written under (an earlier version of the tool hashed the whole profile), deploying `release`
    over it changes nothing on the host."""
    written = dict(record.get("files") or {})
    wanted = release.metadata()
    # the metadata first: the files are rendered (Jinja2 loaded) only when nothing cheaper tells them apart
    return bool(written) and all(record.get(key) == wanted[key] for key in (
        "venv", "sglang_version", "patches", "model", "argv", "environment", "secrets_digest")) \
        and written == release.record()["files"]


def placeholder_secrets(profile: Profile) -> dict[str, str]:
    """Each secret the profile names, a placeholder standing in for a value not read (a render, a comparison of
    profiles, a sweep's argv)."""
    return {name: SECRET_PLACEHOLDER for name in secret_environment(profile)}


def build_release(loaded: LoadedProfile, layout: StoreLayout, sglang_version: str, secrets: Mapping[str, str],
                  venv: str | None = None, patches: tuple[str, ...] = (), flashinfer_version: str | None = None,
                  extra_environment: Mapping[str, str] | None = None, launch_args: tuple[str, ...] | None = None,
                  release_id: str | None = None, model: ReleaseModel | None = None,
                  torch_version: str | None = None, nccl_version: str | None = None) -> Release:
    """The release of a profile on one host: `venv` replaces the profile's (a built or host-specific venv),
    `extra_environment` adds what the host side decides (the venv's cache directories), `model` the weights as
    resolved on the host (the commit of a hub revision and the cache holding it), `torch_version`/`nccl_version`
    what the venv has installed (recorded, not part of the id). An adopted server's release 0 gives its own
    arguments as written (`launch_args`) and its id."""
    profile = loaded.profile
    if venv is not None:
        profile = profile.model_copy(update={"service": profile.service.model_copy(update={"venv": venv})})
    model = model or ReleaseModel(profile.model.path, profile.model.revision)
    if model.path != profile.model.path:  # a pushed version directory: the server loads that one
        profile = profile.model_copy(update={"model": profile.model.model_copy(update={"path": model.path})})
    argv = launch_argv(profile, sglang_version,
                       launch_args if launch_args is not None else sglang_args(profile, sglang_version, model.commit))
    # an adopted server runs as it was written; every other release reads staged weights, offline
    weights_env = model.environment() if launch_args is None else {}
    environment = {**launch_environment(profile), **(extra_environment or {}), **weights_env}
    secrets_digest = hashlib.sha256(json.dumps(sorted(secrets.items())).encode()).hexdigest()[:16]
    env_spec = EnvSpec(values={**environment, **secrets}, secret_names=frozenset(secrets))
    unit_spec = UnitSpec(
        description=f"SGLang server {layout.service}",
        user=profile.service.user,
        group=None,
        working_directory=profile.service.working_directory,
        environment_file=str(layout.current / ENV_FILE),
        exec_argv=(str(layout.current / LAUNCHER_FILE),),
        timeout_start_s=profile.service.startup_timeout_s,
        timeout_stop_s=profile.service.stop_timeout_s,
        restart=profile.service.restart,
        restart_sec=profile.service.restart_sec,
        start_limit_burst=profile.service.start_limit_burst,
        start_limit_interval_s=profile.service.start_limit_interval_s,
        limit_nofile=profile.service.limit_nofile,
        syslog_identifier=layout.service,
    )
    validate_unit(unit_spec)
    validate_argv(argv)
    validate_env(env_spec)
    release_id = release_id or rendered_id(RenderedContent(
        unit=unit_settings(unit_spec), argv=argv, environment=environment, secrets_digest=secrets_digest,
        venv=profile.service.venv, sglang_version=sglang_version, patches=patches, model=model.metadata(),
        service=layout.service))
    return Release(
        id=release_id, service=layout.service, profile_name=loaded.name, profile_hash=profile.content_hash(),
        profile=profile.model_dump(mode="json"), sglang_version=sglang_version,
        flashinfer_version=flashinfer_version, venv=profile.service.venv, argv=argv,
        args=argv[3:], environment=environment, secret_names=tuple(sorted(secrets)),
        secrets_digest=secrets_digest, unit=unit_spec, env=env_spec, patches=patches, model=model.metadata(),
        torch_version=torch_version, nccl_version=nccl_version, overrides=loaded.overrides,
    )


@dataclass(frozen=True)
class RecordedRelease:
    """A release as its release.json records it: what switching back to it needs, read without today's schema.

    The release's rendered unit and env file are what runs; this is what checks and probes them. A key an
    earlier version did not write falls back to what the recorded profile says, or to nothing to check."""

    id: str
    venv: str
    sglang_version: str | None
    args: tuple[str, ...]
    environment: Mapping[str, str]    # the server's environment without secrets
    files: Mapping[str, str]          # file name -> sha256 when the release was written
    profile: StoredProfile

    @classmethod
    def of(cls, release_id: str, metadata: Mapping[str, Any]) -> RecordedRelease:
        profile = read_stored_profile(metadata.get("profile"))
        version = metadata.get("sglang_version")
        return cls(id=release_id, venv=str(metadata.get("venv") or profile.service.venv),
                   sglang_version=str(version) if version else None,
                   args=tuple(str(arg) for arg in metadata.get("args") or ()),
                   environment={str(k): str(v) for k, v in dict(metadata.get("environment") or {}).items()},
                   files={str(k): str(v) for k, v in dict(metadata.get("files") or {}).items()}, profile=profile)

    @classmethod
    def of_release(cls, release: Release) -> RecordedRelease:
        return cls.of(release.id, release.metadata())


@dataclass(frozen=True)
class Change:
    kind: str  # "flag", "env", "secret", "venv", "version", "patch", "service", "model", "unit"
    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        if self.old is None:
            return f"+ {self.kind} {self.name} = {self.new}"
        if self.new is None:
            return f"- {self.kind} {self.name} (was {self.old})"
        return f"~ {self.kind} {self.name}: {self.old} -> {self.new}"


def argv_options(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """SGLang arguments as flag -> value ('' for switches)."""
    options: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            options[name] = value
        elif arg.startswith("--"):
            values = []
            while index + 1 < len(args) and not args[index + 1].startswith("--"):
                index += 1
                values.append(args[index])
            options[arg] = " ".join(values)
        index += 1
    return options


def diff_releases(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Change]:
    """Semantic diff of two release metadata dicts (release.json form): flags, environment, secrets, venv, patches."""
    old = old or {}
    changes: list[Change] = []

    def compare(kind: str, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                changes.append(Change(kind, name, before.get(name), after.get(name)))

    compare("flag", argv_options(old.get("args", [])), argv_options(new.get("args", [])))
    compare("env", old.get("environment", {}), new.get("environment", {}))
    old_secrets, new_secrets = set(old.get("secret_names", [])), set(new.get("secret_names", []))
    compare("secret", _secret_sources(old), _secret_sources(new))
    if old_secrets & new_secrets and old.get("secrets_digest") != new.get("secrets_digest"):
        changes.append(Change("secret", SECRET_VALUES, "(previous)", "(changed)"))
    for key, kind in (("venv", "venv"), ("sglang_version", "version"), ("flashinfer_version", "version"),
                      ("service", "service")):
        if old.get(key) != new.get(key):
            changes.append(Change(kind, key, old.get(key), new.get(key)))
    compare("patch", {p: "on" for p in old.get("patches", [])}, {p: "on" for p in new.get("patches", [])})
    compare("model", old.get("model", {}), new.get("model", {}))
    old_unit, new_unit = old.get("unit"), new.get("unit")
    if isinstance(old_unit, Mapping) and isinstance(new_unit, Mapping):
        compare("unit", old_unit, new_unit)
    elif old and not _same_unit_file(old, new):
        # a release.json written before the unit's settings were recorded: its unit file against the new one's
        changes.append(Change("unit", UNIT_FILE, "as the current release wrote it", "rendered otherwise now"))
    return changes


def _same_unit_file(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Both unit files' sha256 known and equal, or either not known (nothing to say)."""
    before, after = (dict(data.get("files") or {}).get(UNIT_FILE) for data in (old, new))
    return before is None or after is None or before == after
