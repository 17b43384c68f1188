"""The per-pair copy measurement wired into `invoke gpu-check` (deploy_lib.ops.dispatch, no SSH), the venv gpu-check
runs with (the host's `venv` var first, as a deploy resolves it) and a venv without python refused by name.

The VM host is test_gpu_check_p2p_wiring's vm105 (two GPUs, the 2 x H200 topology). No host with two GPUs was lent,
so no pair's copies could be recorded: the measure step is answered with the script's output recorded on the lent
H200 (tests/data/p2p/h200-1gpu-2026-12-01/measure-loopback*.json), its one copy's fields given to each direction of
the pair as the script fills them for a pair (src, dst, peer_access from torch.cuda.can_device_access_peer)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from helpers.deploy_plan import target
from helpers.gpu_check_deploy import checked
from helpers.gpu_check_p2p_reading import DATA
from helpers.gpu_check_p2p_wiring import INVENTORY, Reached, vm_scope
from helpers.recording_progress import RecordingProgress
from helpers.rollback import READY
from helpers.router import StoppableHost
from rich.console import Console

from deploy_cli import present, reports
from deploy_cli.present import jsonable
from deploy_lib.commands.gpu_check import run_gpu_check
from deploy_lib.deploy.project import resolve_target
from deploy_lib.errors import PreflightError
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops import dispatch
from deploy_lib.remote import Step

H200_1GPU = DATA / "p2p/h200-1gpu-2026-12-01"
H200X2 = DATA / "gpu_check/h200x2-2026-11-30"


def pair_copies(peer_access: bool, wrong_direction: tuple[int, int] | None = None) -> str:
    """The measure script's stdout for GPU0 <-> GPU1: the H200's recorded copy in each direction; the direction
    `wrong_direction` carries the recorded planted wrong element."""
    recorded = json.loads((H200_1GPU / "measure-loopback.json").read_text())
    planted = json.loads((H200_1GPU / "measure-loopback-planted.json").read_text())["pairs"][0]["wrong"]
    pairs = []
    for src, dst in ((0, 1), (1, 0)):
        pair = copy.deepcopy(recorded["pairs"][0])
        pair.update(src=src, dst=dst, loopback=False, peer_access=peer_access,
                    wrong=planted if (src, dst) == wrong_direction else [])
        pairs.append(pair)
    return json.dumps({**recorded, "gpus": ["NVIDIA H200", "NVIDIA H200"], "pairs": pairs}) + "\n"


def checked_vm(tmp_path: Path, hosts: Reached, text: str = INVENTORY) -> Any:
    return dispatch.one(dispatch.gpu_check(vm_scope(tmp_path, text), "sglang", None, False, [1024], hosts.reach()))


def test_two_gpus_are_copied_after_the_all_reduce_and_each_pair_shows_its_copies(tmp_path: Path) -> None:
    hosts = Reached()
    host = hosts.remotes["vm105"].reply("p2p measure", stdout=pair_copies(peer_access=False))
    report = checked_vm(tmp_path, hosts)
    names = host.ran_names()
    assert names.index("all-reduce check") < names.index("p2p measure") < names.index("p2p: links")
    measure = next(step for step in host.ran if isinstance(step, Step) and step.name == "p2p measure")
    assert measure.argv == ("timeout", "--kill-after=10", "240", "/opt/ml-env/bin/python3", "-") and measure.sudo
    verdict = report.peer_to_peer
    assert verdict.measurement == ("P2P measurement: 2 directed copies between 2 GPUs at 1 MiB, 64 MiB, 256 MiB, "
                                   "every element verified")
    (pair,) = verdict.pairs
    assert [(m.src, m.dst, m.sums_verified) for m in pair.measured] == [(0, 1, True), (1, 0, True)]
    assert pair.disagreement == ()  # the driver says CNS and torch copies through host memory: they agree


def test_a_pair_the_driver_calls_p2p_but_that_copies_through_host_memory_is_said_so(tmp_path: Path) -> None:
    """Input tried: nvidia-smi's `topo -p2p r/w` of the 2 x H200 (OK both ways), torch seeing no peer access."""
    hosts = Reached()
    host = hosts.remotes["vm105"]
    host.reply("p2p read", stdout=(H200X2 / "topo-p2p-r.txt").read_text())
    host.reply("p2p write", stdout=(H200X2 / "topo-p2p-w.txt").read_text())
    host.reply("p2p measure", stdout=pair_copies(peer_access=False))
    (pair,) = checked_vm(tmp_path, hosts).peer_to_peer.pairs
    assert (pair.read, pair.write) == ("OK", "OK")
    assert pair.disagreement == (
        "nvidia-smi reports P2P, but the copy GPU0 -> GPU1 went through host memory (torch sees no peer access): "
        "1997.9 GB/s at 256 MiB",
        "nvidia-smi reports P2P, but the copy GPU1 -> GPU0 went through host memory (torch sees no peer access): "
        "1997.9 GB/s at 256 MiB")


def test_a_driver_without_p2p_but_torch_with_peer_access_and_a_wrong_copy_are_said_so(tmp_path: Path) -> None:
    hosts = Reached()
    hosts.remotes["vm105"].reply("p2p measure", stdout=pair_copies(peer_access=True, wrong_direction=(1, 0)))
    report = checked_vm(tmp_path, hosts)
    (pair,) = report.peer_to_peer.pairs
    assert pair.disagreement[0] == "nvidia-smi reports CNS, but torch has peer access GPU0 -> GPU1: 1997.9 GB/s at " \
                                   "256 MiB"
    assert pair.disagreement[-1] == (
        "the copy GPU1 -> GPU0 arrived WRONG (64 MiB: element 8388608 expected 58720256, got 58720257 (1 wrong)): "
        "keep NCCL off P2P on this pair (nccl.p2p_disable: true) until it copies exactly")
    assert report.peer_to_peer.measurement.endswith("1 with WRONG elements")


def test_the_section_prints_each_pairs_copies_and_json_carries_them(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = Reached()
    hosts.remotes["vm105"].reply("p2p measure", stdout=pair_copies(peer_access=True))
    report = checked_vm(tmp_path, hosts)
    monkeypatch.setattr(present, "console", Console(record=True, width=10_000, highlight=False))
    reports.print_gpu_check(report)
    printed = present.console.export_text().splitlines()
    at = printed.index("  GPU0-GPU1: no P2P (read CNS: chipset not supported, write CNS: chipset not supported)")
    assert printed[at + 1] == ("    measured GPU0 -> GPU1, peer access: 1 MiB 65.7 GB/s, 64 MiB 1671.2 GB/s, 256 MiB "
                               "1997.9 GB/s; 4-byte copy 15.3 us; every element as sent")
    assert printed[at + 3] == "    disagrees: nvidia-smi reports CNS, but torch has peer access GPU0 -> GPU1: " \
                              "1997.9 GB/s at 256 MiB"
    as_json = json.loads(json.dumps(jsonable(report)))["peer_to_peer"]
    first = as_json["pairs"][0]["measured"][0]
    assert (first["src"], first["dst"], first["peer_access"], first["sums_verified"]) == (0, 1, True, True)
    assert first["gbps"][-1] == [268435456, 1997.912] and first["latency_us"] == 15.34
    assert as_json["pairs"][0]["disagreement"][0].startswith("nvidia-smi reports CNS, but torch has peer access")
    assert as_json["measurement"].startswith("P2P measurement: 2 directed copies")


@pytest.mark.parametrize(("exit_code", "stdout", "said"), [
    (124, "", "P2P measurement not run: the copies did not finish within 240 s (ended by timeout)"),
    (0, '{"error": "needs torch with CUDA (No module named \'torch\')"}\n',
     "P2P measurement not run: needs torch with CUDA (No module named 'torch')"),
    (139, "", "P2P measurement not run: the measurement printed no result"),
])
def test_a_measurement_that_cannot_finish_is_said_and_the_check_still_reports(
        tmp_path: Path, exit_code: int, stdout: str, said: str) -> None:
    hosts = Reached()
    hosts.remotes["vm105"].reply("p2p measure", exit_code=exit_code, stdout=stdout, stderr="")
    report = checked_vm(tmp_path, hosts)
    assert report.check.verified and report.peer_to_peer.measurement.startswith(said)
    assert report.peer_to_peer.pairs[0].measured == ()


def test_the_copies_run_while_the_server_is_stopped_and_before_its_restart() -> None:
    """--stop-server: the measurement runs under the same rules as the all-reduce, between the stop and the start."""
    host = StoppableHost({"A": [READY], "B": [READY]})
    run_gpu_check(target(), "sglang", host, RecordingProgress(), None, True, {}, peer_to_peer=lambda _: None)
    names = host.ran_names()
    assert names.index("systemd: stop") < names.index("all-reduce check") < names.index("p2p measure") < \
        names.index("systemd: restart") < names.index("lock: release")


def test_a_venv_without_python_is_refused_by_name_before_the_server_stops() -> None:
    """Input tried: --stop-server on a host whose release venv has no bin/python3 (sudo exits 1 for a missing
    command, so the all-reduce used to fail as a step, exit 5)."""
    host = StoppableHost({"A": [READY], "B": [READY]})
    host.reply("host facts: venv python (gpu-check)", exit_code=3)
    with pytest.raises(PreflightError) as refused:
        run_gpu_check(target(), "sglang", host, RecordingProgress(), None, True, {}, peer_to_peer=lambda _: None)
    assert "release B checks with venv /root/ml-env (release B's record), which has no /root/ml-env/bin/python3" \
        in refused.value.message
    assert "python3 -m venv /root/ml-env" in (refused.value.hint or "")
    assert "systemd: stop" not in host.ran_names() and "all-reduce check" not in host.ran_names()
    step = next(s for s in host.ran if isinstance(s, Step) and s.name == "host facts: venv python (gpu-check)")
    assert step.sudo and step.argv == ("sh", "-c", 'test -x "$1" || exit 3', "sh", "/root/ml-env/bin/python3")


def test_a_profile_checks_with_the_hosts_venv_var_as_a_deploy_would(tmp_path: Path) -> None:
    """Input tried: `gpu-check --profile glm5-nvfp4` on a host whose inventory entry sets `venv: /opt/host-venv`
    (failed before: the profile's service.venv was used)."""
    text = INVENTORY.replace("proxmox_vmid: 105}", "proxmox_vmid: 105, venv: /opt/host-venv}")
    hosts = Reached()
    host = hosts.remotes["vm105"]
    report = dispatch.one(dispatch.gpu_check(vm_scope(tmp_path, text), "sglang", checked(tp=2), False, [1024],
                                             hosts.reach()))
    assert report.subject.venv == "/opt/host-venv" and report.subject.venv_from == "vm105's `venv` var"
    assert report.subject.environment["VIRTUAL_ENV"] == "/opt/host-venv"
    check = next(step for step in host.ran if isinstance(step, Step) and step.name == "all-reduce check")
    assert check.argv[0] == "/opt/host-venv/bin/python3"
    assert ("sh", "-c", 'test -x "$1" || exit 3', "sh", "/opt/host-venv/bin/python3") in host.ran_argvs()
    # the one rule deploy resolves it by
    (path := tmp_path / "hosts.yaml").write_text(text)
    assert resolve_target(load_inventory(path), "vm105").venv_of(checked().profile) == "/opt/host-venv"


def test_status_never_copies_and_its_verdict_says_no_measurement(tmp_path: Path) -> None:
    hosts = Reached()
    report = dispatch.one(dispatch.status(vm_scope(tmp_path), "sglang", hosts.reach()))
    assert report.peer_to_peer is not None and report.peer_to_peer.measurement is None
    assert json.loads(json.dumps(jsonable(report)))["peer_to_peer"]["measurement"] is None
    assert "p2p measure" not in hosts.remotes["vm105"].ran_names()
    assert not any(line.strip().startswith("P2P measurement") for line in report.peer_to_peer.lines())
