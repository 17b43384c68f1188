"""The operator's verbs (stop, start, restart) and what `status` shows, through FakeRemote: no host needed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import invoke
from helpers.current_release import LAYOUT, TAGS, host_with_current
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from rich.console import Console

from deploy_cli import present as ui
from deploy_cli import reports
from deploy_lib.commands import deploy as engine
from deploy_lib.commands.logs import follow_log
from deploy_lib.commands.status import StatusReport, read_status, serving_endpoint
from deploy_lib.commands.uninstall import removal_steps, uninstall
from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.errors import DeployError
from deploy_lib.facts.host import FACT_UNIT_LINK
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import (
    FACT_CURRENT,
    FACT_HISTORY,
    FACT_LOCK,
    FACT_RELEASE_DIRS,
    FACT_RELEASE_FILES,
    LOCK_TAKE,
    HistoryEntry,
    Tags,
)
from deploy_lib.venvs.installed import FACT_INSTALLED

REPO = Path(__file__).resolve().parent.parent
TARGET = resolve_target(Project(REPO).inventory(None), None)




def history_lines(remote: FakeRemote) -> list[HistoryEntry]:
    return [HistoryEntry.from_json(step.stdin.decode()) for step in remote.ran
            if step.name == "history: append" and step.stdin]


def test_stop_stops_the_unit_under_the_lock_and_records_who() -> None:
    remote = host_with_current("active")
    outcome = engine.stop(TARGET, "sglang", remote)
    assert outcome.action == "stopped" and outcome.release_id == "r1"
    names = remote.ran_names()
    assert names.index(LOCK_TAKE) < names.index("systemd: stop") < names.index("lock: release")
    [entry] = history_lines(remote)
    assert (entry.event, entry.outcome, entry.tags.release) == ("stop", "stopped", "r1")


def test_start_of_a_running_release_changes_nothing() -> None:
    remote = host_with_current("active")
    outcome = engine.start(TARGET, "sglang", remote, RecordingProgress(), {}, restart=False)
    assert outcome.action == "already running" and "systemd: restart" not in remote.ran_names()


def test_verbs_on_a_host_without_a_release_say_what_to_do_first() -> None:
    remote = (FakeRemote().reply(FACT_LOCK, exit_code=1).reply(FACT_CURRENT, exit_code=1)
              .reply(FACT_HISTORY, exit_code=1))
    for verb in (lambda: engine.stop(TARGET, "sglang", remote),
                 lambda: engine.start(TARGET, "sglang", remote, RecordingProgress(), {}, restart=True)):
        try:
            verb()
        except DeployError as error:
            assert error.exit_code == 2 and "no release is deployed" in error.message
            assert "invoke deploy" in str(error.hint)
        else:
            raise AssertionError("a verb without a release must fail")


def test_status_endpoint_is_the_hosts_address_when_the_server_listens_everywhere() -> None:
    assert serving_endpoint({"profile": {"server": {"host": "0.0.0.0", "port": 8000}}}, "192.0.2.10") \
        == "http://192.0.2.10:8000"
    assert serving_endpoint({"profile": {"server": {"host": "127.0.0.1", "port": 30000}}}, "gpu1") \
        == "http://127.0.0.1:30000"
    assert serving_endpoint({"profile": {"server": {"host": "::", "port": 8000}}}, "2001:db8::1") \
        == "http://[2001:db8::1]:8000"
    assert serving_endpoint({}, "gpu1") is None


def test_uninstall_copies_history_here_before_removing_the_store(tmp_path: Path) -> None:
    remote = (host_with_current("active")
              .reply(FACT_UNIT_LINK, stdout=f"{LAYOUT.current}/sglang.service\n")
              .reply("uninstall: read history", stdout='{"event":"deploy"}\n'))
    done = uninstall(TARGET, "sglang", remote, tmp_path)
    assert (done.copy / "history.jsonl").read_text() == '{"event":"deploy"}\n'
    assert json.loads((done.copy / "r1.release.json").read_text())["id"] == "r1"
    names = remote.ran_names()
    assert names[-6:] == ["uninstall: stop", "uninstall: disable", "uninstall: unit link", "uninstall: daemon-reload",
                          "uninstall: reset-failed", "uninstall: release store"]
    assert remote.ran[-1].argv == ("rm", "-rf", "--", "/opt/sglang-deploy/sglang")
    assert done.kept_on_host == ()


def test_uninstall_leaves_a_unit_it_did_not_make() -> None:
    steps = removal_steps(LAYOUT, remove_unit=False)
    assert [step.name for step in steps] == ["uninstall: release store"]


def test_uninstall_of_a_host_without_the_service_changes_nothing(tmp_path: Path) -> None:
    remote = (FakeRemote().reply(FACT_LOCK, exit_code=1).reply(FACT_CURRENT, exit_code=1)
              .reply(FACT_HISTORY, exit_code=1))
    try:
        uninstall(TARGET, "sglang", remote, tmp_path)
    except DeployError as error:
        assert "nothing of service sglang is installed" in error.message
    else:
        raise AssertionError("uninstalling nothing must fail")
    assert not any(step.name.startswith("uninstall: ") for step in remote.ran) and not list(tmp_path.iterdir())


def test_adopt_needs_a_pid_or_a_unit_and_never_overwrites_a_profile() -> None:
    both = invoke("adopt", "--profile", "new-one", "--pid", "42", "--unit", "sglhand")
    assert both.returncode == 2 and "adopt takes --pid PID (a process id) or --unit NAME" in both.stderr
    word = invoke("adopt", "--profile", "new-one", "--pid", "abc")
    assert word.returncode == 2 and "adopt takes --pid PID" in word.stderr
    existing = invoke("adopt", "--profile", "glm5-nvfp4", "--pid", "42")
    assert existing.returncode == 2 and "glm5-nvfp4.yaml exists; adopt writes a new profile" in existing.stderr


def test_uninstall_without_a_terminal_asks_for_yes_and_touches_nothing() -> None:
    refused = invoke("uninstall", "--inventory", "inventory/sandbox.yaml")
    assert refused.returncode == 1 and "stdin is not a terminal, so nothing was changed" in refused.stderr
    assert "remove service sglang from th1" in refused.stderr and "rerun with --yes" in refused.stderr


def test_logs_follow_shows_the_last_lines_then_only_new_ones() -> None:
    """`invoke logs --follow`: one read of the newest lines, then each poll asks journald for what came after."""
    remote = FakeRemote()
    remote.reply(lambda step: "--after-cursor=c1" not in step.argv, stdout="loading\nready\n-- cursor: c1\n")
    remote.reply(lambda step: "--after-cursor=c1" in step.argv, stdout="GET /health 200\n-- cursor: c2\n")
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 2:
            raise KeyboardInterrupt

    shown: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        shown.extend(follow_log(TARGET, "sglang", remote, lines=50, sleep=sleep))
    first, second = (step.argv for step in remote.ran)
    assert shown == ["loading", "ready", "GET /health 200"]
    assert first[:first.index("-n") + 2] == ("journalctl", "-o", "cat", "--no-pager", "-q", "-n", "50")
    assert "--show-cursor" in first and "UNIT=sglang.service" in first
    assert "--after-cursor=c1" in second and all(step.sudo for step in remote.ran)


class InstalledReadHere(FakeRemote):
    """A FakeRemote whose venv's installed-packages step runs the real script here, in `venv` (the host's venv path
    is the release's): what the venv holds decides the answer, not a canned reply."""

    def __init__(self, venv: Path) -> None:
        super().__init__()
        self.venv = venv

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        return [self._here(result) for result in super().run(batch, on_output)]

    def _here(self, result: StepResult) -> StepResult:
        if result.step.name != FACT_INSTALLED:
            return result
        # through a shell, as on the host: a venv without its python exits 127
        python = str(self.venv / "bin" / "python3")
        done = subprocess.run(["sh", "-c", 'exec "$@"', "sh", python, *result.step.argv[1:]], capture_output=True,
                              text=True, timeout=60)
        return StepResult(result.step, done.returncode, done.stdout, done.stderr, 0.0)


def venv_with(root: Path, distributions: dict[str, dict[str, Any] | None]) -> Path:
    """A real venv (no pip) holding `distributions` by name, each with its PEP 610 direct_url.json when given."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3.*/site-packages"))
    for name, direct_url in distributions.items():
        info = site / f"{name.replace('-', '_')}-0.7.2.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.7.2\n")
        files = ["METADATA", "RECORD"] + (["direct_url.json"] if direct_url else [])
        if direct_url:
            (info / "direct_url.json").write_text(json.dumps(direct_url))
        (info / "RECORD").write_text("".join(f"{info.name}/{file},,\n" for file in files))
    return root


def host_with_venv(venv: Path) -> FakeRemote:
    """host_with_current's release r1 serving from /opt/ml-env (whose packages are read from `venv` here)."""
    remote = InstalledReadHere(venv)
    remote._rules = host_with_current("active")._rules
    metadata = {"id": "r1", "staged_at": "2026-11-30T10:00:00+00:00", "tags": TAGS.as_dict(), "venv": "/opt/ml-env",
                "profile": {"server": {"host": "0.0.0.0", "port": 8000}}, "sglang_version": "0.5.23"}
    return (remote.reply(FACT_RELEASE_FILES, stdout=f"{LAYOUT.releases}/r1/release.json\0{json.dumps(metadata)}\n")
            .reply(lambda step: step.name.startswith("readiness probe"), stdout='{"port_open": false}\n'))


def test_status_shows_the_installed_versions_and_a_jit_cache_installed_from_a_source_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: a venv whose flashinfer-jit-cache was installed from a directory (`pip install ./dir`), and the
    same venv without its python."""
    source = {"url": "file:///src/flashinfer%20jit", "dir_info": {}}
    venv = venv_with(tmp_path / "env", {"flashinfer-python": None, "flashinfer-jit-cache": source})
    report = read_status(TARGET, "sglang", host_with_venv(venv))
    assert report.venv_sources == {"flashinfer-jit-cache": "copy of /src/flashinfer jit"}
    assert report.venv_versions == {"flashinfer-python": "0.7.2", "flashinfer-jit-cache": "0.7.2"}
    shown = status_text(report, monkeypatch)
    assert "installed: flashinfer-python 0.7.2, flashinfer-jit-cache 0.7.2" in shown
    assert "flashinfer-jit-cache copy of /src/flashinfer jit" in shown
    (venv / "bin" / "python3").unlink()
    report = read_status(TARGET, "sglang", host_with_venv(venv))
    assert report.venv_versions == {} and report.venv_sources == {}
    assert report.venv_problem is not None and report.venv_problem.startswith("the venv /opt/ml-env does not run: ")
    assert report.venv_problem in status_text(report, monkeypatch)


def status_text(report: StatusReport, monkeypatch: pytest.MonkeyPatch) -> str:
    out = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=out, width=200))
    reports.print_status(report)
    return out.getvalue()


def test_status_says_when_the_current_release_was_switched_to_but_never_verified(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: r1 current while history's last start is r0's healthy deploy (the deploy that switched to r1
    never finished: killed, or the host went down), then with r1's healthy deploy after it."""
    venv = venv_with(tmp_path / "env", {"flashinfer-python": None})
    r0 = HistoryEntry("deploy", "healthy", "2026-11-30T09:00:00Z", Tags(**{**TAGS.as_dict(), "release": "r0"}))
    r1 = HistoryEntry("deploy", "healthy", "2026-11-30T10:01:00Z", TAGS)
    unfinished = host_with_venv(venv).reply(FACT_HISTORY, stdout=r0.to_json().decode())
    report = read_status(TARGET, "sglang", unfinished)
    assert not report.verified and report.advice is not None
    assert "release r1 was switched to but never verified" in status_text(report, monkeypatch)
    verified = host_with_venv(venv).reply(FACT_HISTORY, stdout=(r0.to_json() + r1.to_json()).decode())
    report = read_status(TARGET, "sglang", verified)
    assert report.verified and report.advice is None


@pytest.mark.parametrize(("history", "said"), [
    ((("deploy", "failed", "r1"),), "no other healthy release is on the host to go back to"),
    ((("deploy", "healthy", "r0"), ("rollback", "failed", "r1")),
     "and nothing was verified since: release r1 is current; `invoke rollback --to r0` goes back to release r0")])
def test_status_of_a_release_whose_verification_failed_says_so_and_what_is_left_to_go_back_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history: tuple[tuple[str, str, str], ...], said: str) -> None:
    """Input tried: r1 current after its first deploy failed (nothing to go back to), and after a rollback by hand to
    it failed (status said r1 "was switched to but never verified")."""
    lines = [HistoryEntry(event, outcome, "2026-11-30T10:01:00Z", Tags(**{**TAGS.as_dict(), "release": rid}),
                          cause="the unit failed" if outcome == "failed" else "") for event, outcome, rid in history]
    remote = host_with_venv(venv_with(tmp_path / "env", {"flashinfer-python": None}))
    r0 = {"id": "r0", "staged_at": "2026-11-30T09:00:00+00:00", "tags": {**TAGS.as_dict(), "release": "r0"}}
    files = [result.stdout for result in remote.run([Step(FACT_RELEASE_FILES, ("true",))])]
    remote.reply(FACT_RELEASE_DIRS, stdout="".join(
        f"{rid}\0{rid}/release.json\0{rid}/sglang.service\0{rid}/sglang.env\0" for rid in ("r0", "r1")))
    remote.reply(FACT_RELEASE_FILES, stdout=files[0] + f"{LAYOUT.releases}/r0/release.json\0{json.dumps(r0)}\n")
    report = read_status(TARGET, "sglang", remote.reply(FACT_HISTORY, stdout=b"".join(
        line.to_json() for line in lines).decode()))
    shown = " ".join(status_text(report, monkeypatch).split())
    assert f"release r1 failed its verification ({history[-1][0]}, 2026-11-30T10:01:00Z: the unit failed)" in shown
    assert said in shown and "never verified" not in shown
