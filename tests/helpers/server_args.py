"""A profile with changes applied, for the launch-argument tests."""

from __future__ import annotations

from typing import Any

from deploy_lib.profile import Profile


def with_changes(profile: Profile, **sections: dict[str, Any]) -> Profile:
    data = profile.model_dump(mode="json")
    for section, values in sections.items():
        data[section] = {**data[section], **values} if isinstance(data[section], dict) else values
    return Profile.model_validate(data)
