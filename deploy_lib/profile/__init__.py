"""Deployment profiles: pydantic models, YAML loading with `extends:`, errors that name file, key and allowed values.

    fields      the constrained field types every section uses (text without control characters, paths, secrets)
    choices     the enums: SGLang's backend and parser choices, NCCL levels, the restart policy
    sections    model, parallel, memory, backends, features, server, nccl, service
    model       Profile (the whole intent), LoadedProfile, the JSON Schema
    loading     profile files: `extends:` chains, validation errors that name the file and key
    stored      a release's recorded profile, read leniently so an old release stays rollback-able

The sections operations act on (`bench:`, `gate:`, `preflight:`, `venv:`) are in deploy_lib/profile/settings.py.
"""

from deploy_lib.profile.choices import RestartPolicy
from deploy_lib.profile.fields import SECRET_NAME_RE, AbsPath, SecretRef
from deploy_lib.profile.loading import format_validation_error, load_profile, profile_path
from deploy_lib.profile.model import LoadedProfile, Profile, profile_json_schema
from deploy_lib.profile.sections import NCCL_ENV, FeatureSpec, ModelSource, ParallelSpec, ServiceSpec
from deploy_lib.profile.stored import StoredProfile, read_stored_profile

__all__ = [
    "NCCL_ENV",
    "SECRET_NAME_RE",
    "AbsPath",
    "FeatureSpec",
    "LoadedProfile",
    "ModelSource",
    "ParallelSpec",
    "Profile",
    "RestartPolicy",
    "SecretRef",
    "ServiceSpec",
    "StoredProfile",
    "format_validation_error",
    "load_profile",
    "profile_json_schema",
    "profile_path",
    "read_stored_profile",
]
