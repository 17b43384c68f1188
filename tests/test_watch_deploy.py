"""The watch in a deploy (deploy_lib/host/watch.py, commands/deploy.py `_switch`): the old release's window read
before the switch, the new one's after it is ready, a regression rolled back as a failed gate is. The host is
scripted (no SSH); its /metrics answers are those recorded from the simulator (tests/data/metrics/watch/, see
tests/test_metrics_watch.py). Time is a virtual clock the watch's wait advances: nothing here waits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import deploy_trips
from helpers.deploy_plan import PROJECT, first_plan, options_accepting, target
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT, ScriptedHost, a_host

from deploy_lib import store
from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.errors import WatchFailed
from deploy_lib.facts import host as host_facts
from deploy_lib.health.probe import ProbeTarget
from deploy_lib.host import watch
from deploy_lib.metrics.watch import WatchOutcome
from deploy_lib.ops.fleet import HostRun
from deploy_lib.ops.notices import notification
from deploy_lib.profile import LoadedProfile
from deploy_lib.profile.settings import WatchSettings

RECORDED = Path(__file__).parent / "data" / "metrics" / "watch"
READ = "read /metrics"
PROBE = ProbeTarget(unit=None, port=8000)
SETTINGS = WatchSettings(window_s=60)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def answering(remote: FakeRemote, *windows: str) -> FakeRemote:
    """/metrics answers in order: each window's start, then its end (a rule answers once; the last added first)."""
    texts = [(RECORDED / f"{name}.{edge}.prom").read_text() for name in windows for edge in ("start", "end")]
    for text in reversed(texts):
        remote.reply(READ, stdout=text, times=1)
    return remote


def test_a_window_is_two_reads_the_window_apart() -> None:
    clock, progress = VirtualClock(), RecordingProgress()
    remote = answering(FakeRemote(), "old")
    figures = watch.read_window(remote, PROBE, 60, "release B", progress, clock.monotonic, clock.sleep)
    assert not isinstance(figures, str) and figures.window_s == 60 and figures.requests == 60
    assert clock.slept == [60] and remote.ran_names() == [READ, READ]
    assert progress.of_kind("note") == ["watch: reading release B's live traffic for 60 s"]


def test_a_window_that_cannot_be_read_says_why_and_does_not_wait() -> None:
    clock = VirtualClock()
    remote = FakeRemote().reply(READ, exit_code=3, stderr="HTTP 404\n")
    said = watch.read_window(remote, PROBE, 60, "release B", RecordingProgress(), clock.monotonic, clock.sleep)
    assert isinstance(said, str) and said.startswith("/metrics not served (HTTP 404)") and clock.slept == []


def test_after_the_switch_a_regression_raises_with_both_windows_and_a_release_as_fast_is_kept() -> None:
    clock = VirtualClock()
    before = watch.read_window(answering(FakeRemote(), "old"), PROBE, 60, "B", RecordingProgress(), clock.monotonic,
                               clock.sleep)
    assert not isinstance(before, str)
    with pytest.raises(WatchFailed) as failed:
        watch.watch_after_ready(answering(FakeRemote(), "slow"), PROBE, SETTINGS, before, RecordingProgress(),
                                clock.monotonic, clock.sleep)
    assert failed.value.exit_code == 7 and failed.value.message.startswith("live latency regressed (p99 TTFT")
    assert [line.split(":")[0] for line in failed.value.evidence] == ["before the switch", "after the switch"]
    progress = RecordingProgress()
    kept = watch.watch_after_ready(answering(FakeRemote(), "same"), PROBE, SETTINGS, before, progress,
                                   clock.monotonic, clock.sleep)
    assert kept is not None and kept.outcome is WatchOutcome.NO_REGRESSION
    assert progress.of_kind("note")[-1].startswith("watch: no regression in live latency")


def test_without_a_window_before_the_release_is_kept_unwatched_and_nothing_is_read() -> None:
    progress, remote, clock = RecordingProgress(), FakeRemote(), VirtualClock()
    assert watch.watch_after_ready(remote, PROBE, SETTINGS, "no release was serving", progress, clock.monotonic,
                                   clock.sleep) is None
    assert remote.ran_names() == []
    assert progress.of_kind("note") == ["watch: no window before the switch (no release was serving); the release is "
                                        "kept unwatched"]


def with_metrics(loaded: LoadedProfile, watched: bool, env: dict[str, str] | None = None) -> LoadedProfile:
    profile = loaded.profile
    changes = {"features": profile.features.model_copy(update={"metrics": True}),
               "watch": SETTINGS if watched else None, "env": {**profile.env, **(env or {})}}
    return loaded.model_copy(update={"profile": profile.model_copy(update=changes)})


def a_host_with_metrics() -> ScriptedHost:
    """The scripted host, its SGLang also accepting --enable-metrics."""
    host = a_host()
    args = (*first_plan()[1].release.args, "--revision", "c" * 40, "--enable-metrics")
    host.reply(host_facts.FACT_SGLANG, stdout=json.dumps({"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
                                                          "options": options_accepting(args)}))
    return host


def serving_with_metrics(monkeypatch: pytest.MonkeyPatch) -> tuple[ScriptedHost, str]:
    """A host whose current release was deployed from the reference profile with features.metrics on."""
    monkeypatch.setattr(deploy_trips, "a_host", a_host_with_metrics)
    host, rid = deploy_trips.serving_the_profile(with_metrics(PROJECT.profile("glm5-nvfp4"), watched=False))
    metadata = json.loads(host.file_text(LAYOUT.staging(rid) / store.RELEASE_FILE))
    sums = "".join(f"{digest}  /x/{name}\n" for name, digest in metadata["files"].items())
    host.reply(host_facts.FACT_RELEASE_SUMS, stdout=sums)  # its files as written: a rollback to it may start it
    return host, rid


def history_lines(host: ScriptedHost) -> list[dict[str, Any]]:
    """The history lines the deploy appended, whole."""
    return [json.loads(step.stdin) for step in host.ran if getattr(step, "name", "") == "history: append"]


def watched_deploy(host: ScriptedHost, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(watch, "_sleep", clock.sleep)
    changed = with_metrics(PROJECT.profile("glm5-nvfp4"), watched=True, env={"NCCL_DEBUG_SUBSYS": "ALL"})
    host.progress = RecordingProgress()
    return deploy(changed, target(), host, host.progress, Options(grace_s=0), clock=clock.monotonic)


def test_a_deploy_ten_times_slower_live_is_rolled_back_with_both_windows_in_its_history_and_webhook(
        monkeypatch: pytest.MonkeyPatch) -> None:
    host, old = serving_with_metrics(monkeypatch)
    clock = VirtualClock()
    answering(host, "old", "slow")
    with pytest.raises(WatchFailed) as failed:  # a rolled-back gate's exit 7, and still the watch's error
        watched_deploy(host, clock, monkeypatch)
    watched = failed.value
    assert failed.value.exit_code == 7 and "live latency regressed (p99 TTFT 396 ms -> 3960 ms" in failed.value.message
    assert f"rolled back, release {old} is serving" in failed.value.message
    assert clock.slept == [60, 60], "one window before the switch, one after"
    reads = [name for name in host.ran_names() if name == READ or name.startswith("switch: temp link")]
    assert reads[:3] == [READ, READ, "switch: temp link"], "the old release's window before the switch"
    assert host.switches()[-1] == f"releases/{old}", "switched back to the release before"
    [failed] = [line for line in host.history() if line[1] == "failed"]
    assert failed[0] == "deploy" and "live latency regressed" in failed[3]
    [figures] = [line["figures"] for line in history_lines(host) if line["outcome"] == "failed"]
    assert figures["watch.after.ttft_p99_s"] == pytest.approx(10 * figures["watch.before.ttft_p99_s"], rel=0.05)
    assert figures["watch.before.requests"] > 0 and figures["watch.after.request_rate"] > 0
    assert all(not line["figures"] for line in history_lines(host) if line["event"] == "rollback"), \
        "the windows belong to the deploy's line alone"
    told = notification(HostRun("gpu1", error=watched), "sglang")
    assert told is not None
    document = told.document()  # what the host's webhook is POSTed
    assert (document["event"], document["serving"]) == ("gate-failed", old)
    assert document["figures"] == figures, "the webhook hears both windows' figures, as history keeps them"


def test_a_deploy_as_fast_live_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    host, old = serving_with_metrics(monkeypatch)
    clock = VirtualClock()
    answering(host, "old", "same")
    outcome = watched_deploy(host, clock, monkeypatch)
    assert getattr(outcome, "action", None) == "deployed" and clock.slept == [60, 60]
    assert host.switches()[-1] != f"releases/{old}"
    assert any(note.startswith("watch: no regression") for note in host.progress.of_kind("note"))
    [kept] = [line for line in history_lines(host) if line["event"] == "deploy"]
    assert kept["outcome"] == "healthy" and {"watch.before.ttft_p99_s", "watch.after.ttft_p99_s"} <= set(
        kept["figures"]), "the kept release's history line carries both windows for the report"


def test_a_replica_behind_a_router_is_not_watched_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A router group's replica deploys with a drain before its restart (ops/router_deploy.py) and rejoins the router
    only after its deploy: the new release's window would see no traffic."""
    host, _ = serving_with_metrics(monkeypatch)
    clock = VirtualClock()
    monkeypatch.setattr(watch, "_sleep", clock.sleep)
    changed = with_metrics(PROJECT.profile("glm5-nvfp4"), watched=True, env={"NCCL_DEBUG_SUBSYS": "ALL"})
    progress = RecordingProgress()
    outcome = deploy(changed, target(), host, progress, Options(grace_s=0), clock=clock.monotonic,
                     before_restart=lambda: None)
    assert outcome.action == "deployed" and READ not in host.ran_names() and clock.slept == []
    assert any(note.startswith("watch: not run for a replica behind a router") for note in progress.of_kind("note"))
