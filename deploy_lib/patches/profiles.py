"""The profile a release on a patch set's venv runs (the set's feature on, the name `<base>+<set>`), and back (pure)."""

from __future__ import annotations

from deploy_lib.patches.spec import PatchSet
from deploy_lib.profile import LoadedProfile


def patched_profile(loaded: LoadedProfile, patch_set: PatchSet) -> LoadedProfile:
    """The profile a release on the patched venv runs: the base, named `<base>+<set>`, with the patch set's feature
    (if it enables one) turned on."""
    return _with_feature(base_profile(loaded, patch_set), patch_set, on=True)


def base_profile(loaded: LoadedProfile, patch_set: PatchSet) -> LoadedProfile:
    """The unpatched profile: the patch set's feature off, and without the name suffix a patched release carries
    (so the profile of a host's patched current release can be enabled or disabled again)."""
    return _with_feature(loaded, patch_set, on=False)


def _with_feature(loaded: LoadedProfile, patch_set: PatchSet, on: bool) -> LoadedProfile:
    feature = patch_set.meta.enables_feature
    profile = loaded.profile
    features = profile.features.model_copy(update={feature: on}) if feature else profile.features
    base_name = loaded.name.removesuffix(f"+{patch_set.name}")
    return loaded.model_copy(update={"name": f"{base_name}+{patch_set.name}" if on else base_name,
                                     "profile": profile.model_copy(update={"features": features})})
