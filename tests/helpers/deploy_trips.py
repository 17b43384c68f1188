"""A serving host's facts as one batch, and the writes a deploy's round trips send."""

from __future__ import annotations

import json

from deploy_lib import store
from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.facts import host as host_facts
from deploy_lib.profile import LoadedProfile
from deploy_lib.store import HEALTHY, history_entry
from helpers.deploy_plan import PROJECT, target
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT, NOW, ScriptedHost, _tags, a_host
from helpers.store_output import release_entries

WRITES = ("lock:", "stage:", "switch:", "systemd:", "history:", "put ")


def writes(host: ScriptedHost) -> list[str]:
    return [name for name in host.ran_names() if name.startswith(WRITES)]


def serving_the_profile(loaded: LoadedProfile | None = None) -> tuple[ScriptedHost, str]:
    """A host where the reference profile (or `loaded`) was deployed and verified: its release is current and
    serving."""
    host = a_host()
    outcome = deploy(loaded or PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    rid = outcome.release_id
    assert outcome.action == "deployed" and rid is not None
    metadata = json.loads(host.file_text(LAYOUT.staging(rid) / store.RELEASE_FILE))
    files = "".join(f"{LAYOUT.releases}/{r}/release.json\0{json.dumps(m)}\n" for r, m in
                    (("B", {**metadata, "id": "B"}), (rid, metadata)))
    history = "".join(history_entry("deploy", HEALTHY, tags, NOW).to_json().decode()
                      for tags in (_tags("B"), store.Tags.from_dict(metadata["tags"])))
    sums = "".join(f"{digest}  /x/{name}\n" for name, digest in metadata["files"].items())
    for name, stdout in ((store.FACT_CURRENT, f"releases/{rid}\n"), (store.FACT_RELEASE_DIRS,
                         release_entries("B", rid)), (store.FACT_RELEASE_FILES, files),
                         (store.FACT_HISTORY, history), (host_facts.FACT_FILE_SUMS, sums)):
        host.reply(name, stdout=stdout)
    host.batches.clear()
    host.results.clear()
    return host, rid


def with_service(loaded, **changes):  # type: ignore[no-untyped-def]
    profile = loaded.profile
    return loaded.model_copy(update={"profile": profile.model_copy(update={
        "service": profile.service.model_copy(update=changes)})})
