"""gpu-check's parsers, advisor and report, on output recorded from real GPUs (tests/data/gpu_check/: two H200s,
2026-11-30) and on the sandbox's simulated nvidia-smi (the reference rig: 8 GPUs over PCIe, P2P not supported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy_lib.gpu_check import (
    advise,
    check_step,
    parse_check_output,
    parse_check_result,
    parse_topology,
)
from deploy_lib.host_scripts import gpu_check as script
from deploy_lib.profile import load_profile
from deploy_lib.release.server_args import launch_environment
from deploy_lib.remote import StepResult

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "tests/data/gpu_check/h200x2-2026-11-30"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((H200 / f"{name}.json").read_text())


def h200_topology() -> Any:
    return parse_topology(*((H200 / f"topo-{kind}.txt").read_text() for kind in ("m", "p2p-r", "p2p-w")))


def simulated_nvidia_smi(tmp_path: Path, *args: str) -> str:
    config = tmp_path / "sim.json"
    config.write_text(json.dumps({"gpus": {"model": "rtx-pro-6000", "count": 8}, "state_dir": str(tmp_path)}))
    return subprocess.run([sys.executable, str(REPO / "sandbox/nvidia-smi"), *args], capture_output=True, text=True,
                          check=True, env={"SGLANG_SIM_CONFIG": str(config)}).stdout


def test_two_nvlinked_h200s_get_p2p_over_nvlink_and_a_disabled_p2p_is_flagged() -> None:
    topology = h200_topology()
    assert topology.one_line() == "2 GPUs, links NV18, P2P supported"
    assert advise(topology, {}).environment == {"NCCL_P2P_LEVEL": "NVL"}
    assert advise(topology, {}).warnings == ()
    assert "stops P2P short of NV18 links" in advise(topology, {"NCCL_P2P_LEVEL": "LOC"}).warnings[0]
    assert "NCCL_P2P_DISABLE=1 turns off P2P" in advise(topology, {"NCCL_P2P_DISABLE": "1"}).warnings[0]


def test_the_reference_rig_is_told_to_disable_p2p_and_its_profile_is_warned(tmp_path: Path) -> None:
    """Input tried: the reference profile (NCCL_P2P_LEVEL=5) against 8 GPUs whose driver reports P2P `NS`."""
    topology = parse_topology(simulated_nvidia_smi(tmp_path, "topo", "-m"),
                              simulated_nvidia_smi(tmp_path, "topo", "-p2p", "r"),
                              simulated_nvidia_smi(tmp_path, "topo", "-p2p", "w"))
    assert topology.one_line() == "8 GPUs, links PHB, P2P not supported on 28 of 28 pairs"
    reference_env = launch_environment(load_profile(REPO / "inventory/profiles", "glm5-nvfp4").profile)
    advice = advise(topology, reference_env)
    assert advice.environment == {"NCCL_P2P_DISABLE": "1"}
    assert "GPU0-GPU1 (not supported)" in advice.reasons[0] and "and 24 more" in advice.reasons[0]
    assert advice.warnings == ("NCCL_P2P_LEVEL=5 permits P2P where the driver reports it not supported; set "
                               "NCCL_P2P_DISABLE=1 (profile: nccl.p2p_disable: true)",)
    assert advise(topology, {**reference_env, "NCCL_P2P_DISABLE": "1"}).warnings == ()


def test_simulated_p2p_matrix_has_the_real_tools_layout(tmp_path: Path) -> None:
    real = (H200 / "topo-p2p-r.txt").read_text().splitlines()
    simulated = simulated_nvidia_smi(tmp_path, "topo", "-p2p", "r").splitlines()
    assert simulated[0].replace("\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7", "") == real[0]
    assert simulated[9:] == real[3:], "a blank line, then the real tool's legend"


def test_recorded_runs_report_transport_bandwidth_and_verification() -> None:
    nvlink, shm = parse_check_output(recorded("default")), parse_check_output(recorded("p2p-disable"))
    assert nvlink.verified and shm.verified
    assert list(nvlink.transports) == ["P2P/CUMEM"] and list(shm.transports) == ["SHM/direct/direct"]
    assert [s.size_bytes for s in nvlink.sizes] == [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    assert nvlink.sizes[-1].busbw_gbps > 5 * shm.sizes[-1].busbw_gbps, "NVLink P2P beats shared memory"
    assert "all-reduce verified exactly at every size" in nvlink.lines()
    assert "transports: SHM/direct/direct (8 channel links)" in shm.lines()


@pytest.mark.parametrize(("run", "transport"), [("tool-step-default", "P2P/CUMEM"),
                                                 ("tool-step-p2p-disable", "SHM/direct/direct")])
def test_the_tools_own_step_ran_verified_on_real_gpus(run: str, transport: str) -> None:
    """Recorded from check_step's program fed to `python3 -` on the two H200s, as gpu-check runs it on a host."""
    result = parse_check_output(recorded(run))
    assert result.verified and list(result.transports) == [transport] and len(result.sizes) == 5


def test_a_planted_corruption_fails_verification_naming_the_gpus_and_size() -> None:
    corrupt = parse_check_output(recorded("corrupt"))
    assert not corrupt.verified
    lines = corrupt.lines()
    assert "verification failed at 1 MiB: GPU1 (received from GPU0): element 131072: expected 15, got 16" in \
        "\n".join(lines)
    assert lines[-1] == "all-reduce check FAILED"


def test_a_hang_names_the_rank_that_never_entered_the_all_reduce() -> None:
    hang = parse_check_output(recorded("hang"))
    assert not hang.verified and hang.sizes == ()
    assert hang.hung == ("rank 0 (GPU0) did not finish: inside the all-reduce of 1048576 bytes (waiting on a peer)",
                         "rank 1 (GPU1) did not finish: outside any all-reduce, after 0 bytes (never entered the next)")


def test_a_rank_that_fails_is_an_error_and_its_waiting_peer_a_hang() -> None:
    """Recorded: rank 1 raised before its first all-reduce (deadline 300 s; the run ended 15 s after its exit)."""
    run = parse_check_output(recorded("rank-error"))
    assert not run.verified
    assert run.failed == ("rank 1 (GPU1) exited 1 outside any all-reduce, after 0 bytes (never entered the next): "
                          "RuntimeError: planted failure on rank 1",)
    assert run.hung == ("rank 0 (GPU0) did not finish: inside the all-reduce of 1048576 bytes (waiting on a peer)",)
    lines = run.lines()
    assert lines.index(f"error: {run.failed[0]}") < lines.index(f"hang: {run.hung[0]}"), "the cause before its effect"


def test_the_scripts_parsers_read_real_nccl_info_lines() -> None:
    run = recorded("default")
    assert script.parse_transports("\n".join(run["nccl_info"])) == run["transports"]
    assert script.nccl_version("\n".join(run["nccl_info"])) == "2.28.9+cuda13.0"
    assert script.bus_bandwidth(100.0, 8) == pytest.approx(175.0), "nccl-tests: busbw = algbw * 2 (n - 1) / n"


@pytest.mark.parametrize(("world", "rank", "factor"), [(2, 1, 0), (8, 5, 0), (8, 3, 2)])
def test_a_wrong_element_names_the_rank_whose_contribution_is_off(world: int, rank: int, factor: int) -> None:
    """Input tried: rank `rank`'s contribution missing (factor 0) or doubled (factor 2) at one element."""
    index = 12
    unit = index % script.VALUE_PERIOD + 1
    got = ((1 << world) - 1 - (1 << rank) + factor * (1 << rank)) * unit
    assert f"the contribution of rank {rank} is {'missing' if factor == 0 else 'doubled'}" in \
        script.explain_wrong_element(index, got, world)


def test_without_torch_the_check_says_so_and_never_fakes_a_result() -> None:
    """The real step's program, run by a python without torch (this machine's): the report says what is missing."""
    step = check_step(sys.executable, 2, {"NCCL_P2P_DISABLE": "1"}, [1024], 30)
    assert step.argv == (sys.executable, "-") and step.stdin is not None
    done = subprocess.run(step.argv, input=step.stdin, capture_output=True, timeout=120)
    result = parse_check_result(StepResult(step, done.returncode, done.stdout.decode(), done.stderr.decode(), 0), 2)
    assert result.error is not None and result.error.startswith("needs torch with CUDA")
    assert result.lines() == [f"all-reduce not run: {result.error}"] and not result.verified
