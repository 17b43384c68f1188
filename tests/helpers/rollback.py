"""A scripted host that serves, fails or dies on cue, for the deploy and rollback tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from deploy_lib import store
from deploy_lib.facts import host as host_facts
from deploy_lib.host.readiness import LIVE_UNIT
from deploy_lib.models import FACT_MODEL
from deploy_lib.profile import LoadedProfile
from deploy_lib.remote import NOT_SENT, Forwarded, OutputLine, Put, Step, StepResult
from deploy_lib.store import (
    HEALTHY,
    UNIT_FILE,
    StoreLayout,
    Tags,
    history_entry,
)
from helpers.deploy_plan import PROJECT, first_plan, options_accepting, target
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.store_output import release_entries

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


LAYOUT = StoreLayout("sglang")


def _tags(release: str) -> Tags:
    return Tags("u@m", "th1", release, "p", "h")


READY = {"unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainPID": "7"},
         "port_open": True, "health_status": 200, "generation": {"status": 200, "text": " Paris"}}


DEAD = {"unit": {"ActiveState": "failed", "SubState": "failed", "NRestarts": "0", "ExecMainPID": "0",
                 "Result": "exit-code", "ExecMainStatus": "1", "ExecMainCode": "1"}, "port_open": False}


class ScriptedHost(FakeRemote):
    """A host holding releases A and B (B current and serving); each probe answers for the release `current` names
    with the next of its scripted snapshots (the last one repeats), or raises it. A live probe is answered from the
    same script, its unit state on the host and its health request forwarded (`forwarding`: the host's sshd forwards
    TCP; without, it refuses and the host probe answers)."""

    def __init__(self, probes: dict[str, list[object]], sglang_ok: bool = True, forwarding: bool = True) -> None:
        super().__init__()
        _, plan = first_plan()
        self.current, self.probes, self.forwarding = "B", probes, forwarding
        releases = {rid: {**plan.release.record(), "id": rid, "staged_at": f"2026-11-30T1{n}:00:00+00:00",
                          "tags": {**_tags(rid).as_dict(), "profile": "glm5-nvfp4"}}
                    for n, rid in enumerate(("A", "B"))}
        files = "".join(f"{LAYOUT.releases}/{rid}/release.json\0{json.dumps(meta)}\n" for rid, meta in releases.items())
        history = "".join(history_entry("deploy", HEALTHY, _tags(rid), NOW).to_json().decode() for rid in ("A", "B"))
        sums = plan.release.record()["files"]
        gpus = "".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 0, 30, 600, 0, "
                       "580\n" for i in range(8))
        sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
                  "options": options_accepting(plan.release.args)}
        replies: dict[str, tuple[int, str]] = {
            store.FACT_CURRENT: (0, "releases/B\n"), store.FACT_RELEASE_DIRS: (0, release_entries("A", "B")),
            store.FACT_RELEASE_FILES: (0, files), store.FACT_HISTORY: (0, history),
            store.FACT_CLOCK: (0, "1764500000\n"), store.FACT_LOCK: (1, ""), store.FACT_LOCK_OWNER: (1, ""),
            host_facts.FACT_GPUS: (0, gpus),
            host_facts.FACT_UNIT: (0, "ActiveState=active\nSubState=running\nMainPID=7\nNRestarts=0\n"
                                      "LoadState=loaded\n"),
            host_facts.FACT_RELEASE_SUMS: (0, "".join(f"{digest}  /x/{name}\n" for name, digest in sums.items())),
            host_facts.FACT_DISK: (0, "Filesystem 1-blocks Used Available Capacity Mounted on\n"
                                      "/dev/sda 1000000000000 1 900000000000 1% /\n"),
            host_facts.FACT_SGLANG: (0, json.dumps(sglang)) if sglang_ok else (127, ""),
        }
        for name, (code, out) in replies.items():
            self.reply(name, exit_code=code, stdout=out)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        for step in batch:
            if step.name == "switch: temp link":
                self.current = step.argv[-2].removeprefix("releases/")  # type: ignore[union-attr]
        if batch and batch[0].name.startswith("readiness probe"):
            self.reply(batch[0].name, stdout=json.dumps(self.next_snapshot()), times=1)
        if any(step.name == LIVE_UNIT for step in batch):  # the script's next snapshot, which `forward` then takes
            unit = dict(self.next_snapshot(take=False).get("unit") or {})
            self.reply(LIVE_UNIT, stdout="".join(f"{key}={value}\n" for key, value in unit.items()), times=1)
        return super().run(batch, on_output)

    def next_snapshot(self, take: bool = True) -> dict:
        script = self.probes[self.current]
        answer = script.pop(0) if take and len(script) > 1 else script[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        self.forwards.append((host, port, data))
        if not self.forwarding:
            return NOT_SENT
        snapshot = self.next_snapshot()
        if not snapshot.get("port_open"):
            return Forwarded(sent=True, error="Connection refused")
        status = snapshot.get("health_status")
        return Forwarded(sent=True, connected=True, answer=f"HTTP/1.1 {status} -\r\n\r\n".encode() if status else b"")

    def rollback(self, to: str = "A") -> object:

        from deploy_lib.commands.deploy import rollback

        self.progress = RecordingProgress()
        return rollback(target(), "sglang", self, self.progress, to, {}, grace_s=0)

    def history(self) -> list[tuple[str, str, str, str]]:
        lines = [json.loads(step.stdin) for step in self.ran
                 if getattr(step, "name", "") == "history: append"]
        return [(line["event"], line["outcome"], line["release"], line["cause"]) for line in lines]

    def switches(self) -> list[str]:
        return [step.argv[-2] for step in self.ran if getattr(step, "name", "") == "switch: temp link"]


class ServingEveryRelease(dict):  # type: ignore[type-arg]
    def __missing__(self, release_id: str) -> list[object]:
        return [READY]


LIVE_PROBE = "readiness probe (health)"


def a_host() -> ScriptedHost:
    """Releases A and B (B current and serving), the model staged, and an SGLang that knows the profile's flags."""
    host = ScriptedHost(ServingEveryRelease())
    model = {"commit": "c" * 40, "files": [{"path": "config.json", "size": 12, "blob": "c1"}], "missing": [],
             "missing_bytes": 0, "free_bytes": 10**12, "hf_home": "/root/.cache/huggingface", "asked_hub": True}
    host.reply(FACT_MODEL, stdout=f"RESULT {json.dumps(model)}\n")
    host.reply(host_facts.FACT_UNIT_LINK, stdout=f"{LAYOUT.current / UNIT_FILE}\n")
    sums = first_plan()[1].release.record()["files"]
    host.reply(host_facts.FACT_FILE_SUMS, stdout="".join(f"{digest}  /x/{name}\n" for name, digest in sums.items()))
    sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
              "options": options_accepting((*first_plan()[1].release.args, "--revision", "c" * 40))}
    host.reply(host_facts.FACT_SGLANG, stdout=json.dumps(sglang))
    host.reply(LIVE_PROBE, stdout=json.dumps(READY))
    return host


def changed_profile() -> LoadedProfile:
    """The reference profile with one env var more: a release other than the current one."""
    base = PROJECT.profile("glm5-nvfp4")
    return base.model_copy(update={"profile": base.profile.model_copy(update={"env": {"NCCL_DEBUG_SUBSYS": "ALL"}})})
