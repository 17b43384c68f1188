"""A host lost in a rolling deploy (issue 31, point 6), through the library's fleet runner (`fleet.run_hosts`,
`fleet.summarize`) on three sandbox guests: the second guest's link is cut while its `stage, switch and restart`
round trip is sent, and the guest drops its end of the connection (netcut.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.guest_group import GuestGroup, booted_group
from helpers.netcut import CutDuring
from helpers.recording_progress import RecordingProgress

from deploy_lib.commands import deploy as engine
from deploy_lib.deploy.project import Project, Target, load_for_target, resolve_group
from deploy_lib.ops.fleet import HostEnd, Rollout, run_hosts, summarize
from deploy_lib.remote import FabricRemote
from sandbox import names

pytestmark = pytest.mark.sandbox
PROFILES = {f"lost-{n}": f"extends: glm5-nvfp4\nenv:\n  OMP_NUM_THREADS: '{n}'\n" for n in (3, 5)}


class Group(GuestGroup):
    fault_path = "/etc/sglang-sim/fault-lost"


@pytest.fixture(scope="module")
def group(venv_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with booted_group(Group, "n", 3, PROFILES, venv_layer, tmp_path_factory) as booted:
        yield booted


def _rolling_deploy(group: Group, profile: str, cut_host: str | None = None) -> tuple[object, list[CutDuring]]:
    project = Project(group.root)
    inventory = project.inventory(group.inventory)
    cuts: list[CutDuring] = []

    def deploy_one(target: Target) -> engine.Outcome:
        loaded = load_for_target(project, profile, inventory, target)
        with FabricRemote(target.ssh) as inner:
            guest = next(guest for guest in group.guests if guest.name == target.host.name)
            remote = CutDuring(inner, guest, "switch:") if target.host.name == cut_host else None
            try:
                return engine.deploy(loaded, target, remote or inner, RecordingProgress(), engine.Options())
            finally:
                if remote is not None:
                    cuts.append(remote)
                    remote.restore()

    fleet = run_hosts(resolve_group(inventory, names.GROUP), deploy_one, RecordingProgress(), Rollout.parse(["1"], "1"))
    summary = summarize(fleet, lambda outcome: HostEnd(outcome.action, outcome.release_id, outcome.release_id))
    return summary, cuts


def test_a_host_whose_connection_dies_mid_rollout_fails_alone_with_its_cause_and_a_rerun_converges(
        group: Group) -> None:
    baseline, _ = _rolling_deploy(group, "lost-3")
    assert baseline.exit_code == 0, baseline.rows  # type: ignore[attr-defined]
    lost_host = group.names[1]
    summary, cuts = _rolling_deploy(group, "lost-5", cut_host=lost_host)
    rows = {row.host: row for row in summary.rows}  # type: ignore[attr-defined]
    assert cuts and cuts[0].aborted, "the cut dropped the guest's end of the connection"
    lost = rows[lost_host]
    assert lost.outcome == "failed" and lost.exit_code == 11 and "lost during step" in lost.cause, lost
    assert "Traceback" not in lost.cause and lost.serving == "unknown (see status)"
    others = [rows[name] for name in group.names if name != lost_host]
    assert [row.outcome for row in others] == ["deployed", "deployed"], "--max-fail 1: the rollout went on"
    again, _ = _rolling_deploy(group, "lost-5")
    assert again.exit_code == 0, again.rows  # type: ignore[attr-defined]
    converged = {row.host: (row.outcome, row.release) for row in again.rows}  # type: ignore[attr-defined]
    assert converged[lost_host] == ("deployed", rows[lost_host].release)
    for guest, row in zip(group.guests, again.rows, strict=True):  # type: ignore[attr-defined]
        assert group.current(guest) == row.release, f"{guest.name} serves the new release"
