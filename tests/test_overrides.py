"""`--set path.to.key=value` on render, plan and deploy: checked by the profile's schema like the file, shown in the
plan, recorded in the release; and `plan --detailed-exitcode` (0 no change, 2 changes, 1 error) as a drift check,
driven through the CLI task against a scripted host (no SSH)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
from helpers.deploy_plan import PROJECT, REPO, target
from helpers.deploy_trips import serving_the_profile, writes
from helpers.ops import Hosts, installed, release, scope
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT
from invoke import Context, Exit

from deploy_cli import common
from deploy_cli import deploy as deploy_tasks
from deploy_lib import store
from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.errors import ConfigError
from deploy_lib.ops import dispatch

CAP = "memory.max_running_requests=512"  # the reference profile says 1024


def test_an_override_is_recorded_and_a_redeploy_with_it_is_a_no_op_and_without_it_a_change() -> None:
    """Input tried: deploy glm5-nvfp4 with --set memory.max_running_requests=512, then again with it, then without."""
    overridden = PROJECT.profile("glm5-nvfp4", [CAP])
    host, rid = serving_the_profile(overridden)
    recorded = json.loads(host.file_text(LAYOUT.staging(rid) / store.RELEASE_FILE))
    assert recorded["overrides"] == [CAP] and "--max-running-requests" in recorded["args"]
    assert recorded["args"][recorded["args"].index("--max-running-requests") + 1] == "512"

    again = deploy(PROJECT.profile("glm5-nvfp4", [CAP]), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (again.action, again.release_id) == ("unchanged", rid) and writes(host) == []

    without = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(),
                     Options(grace_s=0, dry_run=True))
    assert without.plan is not None and not without.plan.unchanged
    assert "~ flag --max-running-requests: 512 -> 1024" in [str(change) for change in without.plan.changes]


def test_the_plan_names_the_overrides_it_was_made_with() -> None:
    host, _ = serving_the_profile()
    planned = deploy(PROJECT.profile("glm5-nvfp4", [CAP, "parallel.tp=4"]), target(), host, RecordingProgress(),
                     Options(grace_s=0, dry_run=True))
    assert planned.plan is not None
    first = planned.plan.dry_run_lines()[0]
    assert f"profile glm5-nvfp4 --set {CAP} --set parallel.tp=4," in first
    assert "~ flag --tp-size: 8 -> 4" in [str(change) for change in planned.plan.changes]


@pytest.mark.parametrize(("given", "says"), [
    ("memory.max_running_requests=lots", "memory.max_running_requests: Input should be a valid integer"),
    ("memory.max_runing_requests=5", "memory.max_runing_requests: unknown key; did you mean `max_running_requests`"),
    ("memory", "--set 'memory': not of the form path.to.key=value"),
    ("model.path.x=3", "model.path is a value, not a section"),
    ("parallel.tp=3", "parallel.tp: Input should be 1, 2, 4, 8 or 16"),
])
def test_a_bad_override_is_refused_naming_key_and_why_before_any_host_is_reached(tmp_path: Path, given: str,
                                                                                  says: str) -> None:
    """Input tried: each `--set` above on a deploy of glm5-nvfp4 to n1 (a lost key, a typo, a word for a number,
    a path through a value, a tp of 3)."""
    hosts = Hosts(n1=installed(release("r1")))
    with pytest.raises(ConfigError) as refused:
        dispatch.deploy(PROJECT, scope(tmp_path, host="n1"), "glm5-nvfp4", Options(), hosts.reach(), [given])
    assert says in refused.value.message and refused.value.exit_code == 2
    assert hosts.connected == [] and hosts.asked == []


def test_render_applies_the_override_and_shows_it_as_json() -> None:
    """Input tried: `invoke render -p glm5-nvfp4 --set memory.max_running_requests=512 --json`."""
    shown = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "render", "-p", "glm5-nvfp4",
                            "--set", CAP, "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)["hosts"][0]["result"]
    assert document["overrides"] == [CAP] and "--max-running-requests 512" in document["launcher_file"]


def plan_exit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host: object, *overrides: str,
              profile: str = "glm5-nvfp4") -> int:
    """`invoke plan -p PROFILE [--set ...] --detailed-exitcode` against `host` (as the inventory's gpu1): its exit
    code."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 192.0.2.10, gpu_count: 8, gpu_arch: sm120}\n")
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(host))
    try:
        deploy_tasks.plan(Context(), profile=profile, set_=list(overrides), detailed_exitcode=True,
                          inventory=str(inventory))
    except Exit as ended:
        return int(ended.code)
    return 0


def test_plan_detailed_exitcode_is_0_unchanged_2_changed_1_error(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """Input tried: `plan -p glm5-nvfp4 --detailed-exitcode` against a host serving that profile (0), with
    --set memory.max_running_requests=512 (2), with --set memory.max_running_requests=lots (1, where the plain
    exit code of a bad profile is 2), with a profile that does not exist (1)."""
    host, _ = serving_the_profile()
    assert plan_exit(monkeypatch, tmp_path, host) == 0
    assert plan_exit(monkeypatch, tmp_path, host, CAP) == 2
    assert plan_exit(monkeypatch, tmp_path, host, "memory.max_running_requests=lots") == 1
    assert plan_exit(monkeypatch, tmp_path, host, profile="no-such-profile") == 1
    assert writes(host) == []
