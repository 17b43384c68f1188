"""gpu-check end to end on the sandbox guest: the reference rig's simulated topology (8 GPUs over PCIe, P2P not
supported), the refusal while the server holds the GPUs, --stop-server restarting the release through the ladder,
and the all-reduce reported as needing torch with CUDA (the guest has none), never faked. In a deploy
(preflight.gpu_check): a check that is due is refused at preflight there (no torch), nothing stopped; one that is
not due lets the deploy run as without the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.projects import project_for_guest
from helpers.recording_progress import RecordingProgress

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.gpu_check import run_gpu_check
from deploy_lib.commands.status import read_status
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.errors import PreflightError
from deploy_lib.host.store import read_store_facts
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]
SERVICE = "sglang-gpucheck"
PROFILES = {"gc-ref": f"extends: glm5-nvfp4\nservice:\n  name: {SERVICE}\nserver:\n  port: 8300\n",
            # what the check depends on changes: it must run
            "gc-p2p-off": "extends: gc-ref\npreflight:\n  gpu_check: true\nnccl:\n  p2p_disable: true\n",
            # a new release whose NCCL setup and venv are the current one's
            "gc-threads": "extends: gc-ref\npreflight:\n  gpu_check: true\nenv:\n  OMP_NUM_THREADS: \"4\"\n",
            # a venv that is not there: the guest's `venv` var names the one a deploy would use
            "gc-elsewhere": "extends: gc-ref\nservice:\n  venv: /opt/no-such-venv\n"}
NO_VENV = "/opt/no-such-venv"


@pytest.fixture(scope="module")
def deployed(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Project, str, manage.Guest]]:
    project, inventory = project_for_guest(tmp_path_factory.mktemp("project"), sandbox_venv, PROFILES)
    loaded, target = load_for_host(project, "gc-ref", inventory, None)
    with FabricRemote(target.ssh) as remote:
        engine.deploy(loaded, target, remote, RecordingProgress(), engine.Options())
    yield project, inventory, sandbox_venv
    manage.run_on(sandbox_venv, f"systemctl stop {SERVICE}.service || true", user="root")


def test_a_running_server_is_refused_and_nothing_changes(deployed: tuple[Project, str, manage.Guest]) -> None:
    project, inventory, _ = deployed
    _, target = load_for_host(project, "gc-ref", inventory, None)
    with FabricRemote(target.ssh) as remote:
        before = read_store_facts(remote, target.layout(SERVICE))
        with pytest.raises(PreflightError, match=f"{SERVICE}.service is running and holds the GPUs") as refused:
            run_gpu_check(target, SERVICE, remote, RecordingProgress(), None, False, {})
        after = read_store_facts(remote, target.layout(SERVICE))
    assert "--stop-server" in (refused.value.hint or "")
    assert after.current == before.current and after.history == before.history


def test_stop_server_advises_from_the_topology_and_restarts_the_release(
        deployed: tuple[Project, str, manage.Guest]) -> None:
    project, inventory, guest = deployed
    _, target = load_for_host(project, "gc-ref", inventory, None)
    progress = RecordingProgress()
    with FabricRemote(target.ssh) as remote:
        current = read_store_facts(remote, target.layout(SERVICE)).current
        report = run_gpu_check(target, SERVICE, remote, progress, None, True, {})
        facts = read_store_facts(remote, target.layout(SERVICE))
    assert report.subject.source == f"release {current}" and report.subject.world_size == 8
    assert report.topology is not None
    assert report.topology.one_line() == "8 GPUs, links PHB, P2P not supported on 28 of 28 pairs"
    assert report.advice is not None and report.advice.environment == {"NCCL_P2P_DISABLE": "1"}
    assert report.advice.warnings[0].startswith("NCCL_P2P_LEVEL=5 permits P2P where the driver reports it not")
    assert report.check.error is not None and report.check.error.startswith("needs torch with CUDA")
    assert not report.check.verified
    assert facts.current == current, "the same release serves again"
    assert [e.event for e in facts.history[-2:]] == ["stop", "start"] and facts.history[-1].outcome == "healthy"
    assert manage.run_on(guest, f"systemctl is-active {SERVICE}.service", user="root").strip() == "active"


def test_status_shows_the_topology_in_one_line(deployed: tuple[Project, str, manage.Guest]) -> None:
    project, inventory, _ = deployed
    _, target = load_for_host(project, "gc-ref", inventory, None)
    with FabricRemote(target.ssh) as remote:
        report = read_status(target, SERVICE, remote)
    assert report.topology == "8 GPUs, links PHB, P2P not supported on 28 of 28 pairs"


def test_a_due_check_in_a_venv_without_torch_is_refused_before_anything_stops(
        deployed: tuple[Project, str, manage.Guest]) -> None:
    project, inventory, guest = deployed
    loaded, target = load_for_host(project, "gc-p2p-off", inventory, None)
    venv = target.venv_of(loaded.profile)
    with FabricRemote(target.ssh) as remote:
        before = read_store_facts(remote, target.layout(SERVICE))
        with pytest.raises(PreflightError) as refused:
            engine.deploy(loaded, target, remote, RecordingProgress(), engine.Options())
        after = read_store_facts(remote, target.layout(SERVICE))
    assert refused.value.exit_code == 3
    assert (f"preflight.gpu_check: the NCCL check must run (env NCCL_P2P_DISABLE (none) -> 1), but {venv} has no "
            "torch") in refused.value.message
    assert "preflight.gpu_check: false in profile gc-p2p-off" in (refused.value.hint or "")
    assert (after.current, after.history, after.releases) == (before.current, before.history, before.releases)
    assert manage.run_on(guest, f"systemctl is-active {SERVICE}.service", user="root").strip() == "active"


def test_a_deploy_whose_nccl_setup_is_unchanged_runs_no_check(deployed: tuple[Project, str, manage.Guest]) -> None:
    project, inventory, _ = deployed
    loaded, target = load_for_host(project, "gc-threads", inventory, None)
    progress = RecordingProgress()
    with FabricRemote(target.ssh) as remote:
        outcome = engine.deploy(loaded, target, remote, progress, engine.Options())
        facts = read_store_facts(remote, target.layout(SERVICE))
    assert outcome.action == "deployed" and "gpu check" not in outcome.timings
    assert any(text.startswith("gpu check (preflight.gpu_check) not needed") for kind, text in progress.events
               if kind == "note" and isinstance(text, str))
    assert facts.current == outcome.release_id and facts.history[-1].outcome == "healthy"


def test_a_venv_without_python_is_refused_by_name_and_nothing_stops(
        deployed: tuple[Project, str, manage.Guest], tmp_path: Path) -> None:
    """Input tried: the guest's `venv` var set to a path that does not exist, --stop-server (failed before: sudo
    exits 1 for a command it cannot find, so the all-reduce step failed, exit 5, after the server had stopped)."""
    project, inventory, guest = deployed
    moved = tmp_path / "sandbox.yaml"
    text = Path(inventory).read_text()
    assert f"venv: {manage.GUEST_VENV}" in text
    moved.write_text(text.replace(f"venv: {manage.GUEST_VENV}", f"venv: {NO_VENV}"))
    loaded, target = load_for_host(project, "gc-ref", str(moved), None)
    with FabricRemote(target.ssh) as remote:
        before = read_store_facts(remote, target.layout(SERVICE))
        with pytest.raises(PreflightError) as refused:
            run_gpu_check(target, SERVICE, remote, RecordingProgress(), loaded, True, {})
        after = read_store_facts(remote, target.layout(SERVICE))
    assert refused.value.exit_code == 3
    assert f"checks with venv {NO_VENV} ({target.host.name}'s `venv` var), which has no {NO_VENV}/bin/python3" in \
        refused.value.message
    assert f"python3 -m venv {NO_VENV}" in (refused.value.hint or "")
    assert after.history == before.history
    assert manage.run_on(guest, f"systemctl is-active {SERVICE}.service", user="root").strip() == "active"


def test_a_profile_is_checked_with_the_hosts_venv_var(deployed: tuple[Project, str, manage.Guest]) -> None:
    """`gpu-check --profile gc-elsewhere` (service.venv names no venv on the guest): the guest's `venv` var wins, as
    in a deploy, so the check runs there and says it needs torch (failed before: the profile's venv was used)."""
    project, inventory, _ = deployed
    loaded, target = load_for_host(project, "gc-elsewhere", inventory, None)
    with FabricRemote(target.ssh) as remote:
        report = run_gpu_check(target, SERVICE, remote, RecordingProgress(), loaded, True, {})
    assert report.subject.venv == str(manage.GUEST_VENV) and report.subject.source == "profile gc-elsewhere"
    assert report.check.error is not None and report.check.error.startswith("needs torch with CUDA")
