"""A release's recorded profile, read against today's schema without failing on it."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from deploy_lib.profile.fields import Strict
from deploy_lib.profile.model import Profile
from deploy_lib.profile.sections import FeatureSpec, ParallelSpec, ServerSpec, ServiceSpec


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
