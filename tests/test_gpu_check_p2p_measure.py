"""The per-pair copy measurement's report, on the script's output recorded on the lent one-GPU H200
(tests/data/p2p/h200-1gpu-2026-12-01/measure-*.json: no pair, the device-local copy, and a planted wrong element).
A peer pair could not be recorded (no multi-GPU machine was lent): the pair lines are checked on the loopback's
fields, which the script fills the same way for a pair."""

from __future__ import annotations

import json
from pathlib import Path

from deploy_lib.gpu_check.p2p.measure import SCRIPT_SOURCE, measure_step, parse_measure_output, parse_measure_result
from deploy_lib.host_scripts import p2p_measure
from deploy_lib.remote import StepResult

H200_VM = Path(__file__).resolve().parent / "data/p2p/h200-1gpu-2026-12-01"


def recorded(name: str) -> dict:
    return json.loads((H200_VM / name).read_text())


def test_one_gpu_has_no_pair_to_measure():
    assert parse_measure_output(recorded("measure-default.json")).lines() == [
        "P2P measurement: 1 GPU, no pair to measure"]


def test_the_device_local_copy_on_the_h200():
    (pair,) = parse_measure_output(recorded("measure-loopback.json")).pairs
    assert pair.loopback and not pair.wrong and [size for size, _ in pair.gbps] == [1 << 20, 64 << 20, 256 << 20]
    assert pair.line().startswith("GPU0 (device-local copy): 1 MiB 65.7 GB/s, 64 MiB 1671.2 GB/s, 256 MiB 1997.9 GB/s")
    assert pair.line().endswith("4-byte copy 15.3 us; every element as sent")


def test_a_planted_wrong_element_is_named_with_its_size_and_index():
    (pair,) = parse_measure_output(recorded("measure-loopback-planted.json")).pairs
    assert pair.wrong == ("64 MiB: element 8388608 expected 58720256, got 58720257 (1 wrong)",)
    assert "WRONG: 64 MiB: element 8388608" in pair.line()


def test_a_peer_pair_line_says_whether_torch_saw_peer_access():
    payload = recorded("measure-loopback.json")
    payload["pairs"][0].update(src=0, dst=1, loopback=False, peer_access=False)  # the same fields, as a pair
    (pair,) = parse_measure_output(payload).pairs
    assert pair.line().startswith("GPU0 -> GPU1, no peer access (via host): 1 MiB 65.7 GB/s")


def test_the_step_sends_the_committed_script_and_reads_failures():
    step = measure_step("/opt/ml-env/bin/python3", loopback=True)
    assert step.argv == ("timeout", "--kill-after=10", "240", "/opt/ml-env/bin/python3", "-")
    assert step.stdin.decode().startswith(SCRIPT_SOURCE)
    assert step.stdin.decode().endswith("run_measure_and_print('{\"sizes\": [1048576, 67108864, 268435456], "
                                        "\"loopback\": true}')\n")
    assert parse_measure_result(StepResult(step, 127, "", "", 0.0)).error.startswith("the release's venv has no python")
    assert parse_measure_result(StepResult(step, 0, '{"error": "needs torch with CUDA (No module named torch)"}\n',
                                           "", 0.0)).lines() == [
        "P2P measurement not run: needs torch with CUDA (No module named torch)"]
    assert "printed no result" in parse_measure_result(StepResult(step, 1, "", "Traceback ...", 0.0)).error


def test_the_script_without_torch_says_so(monkeypatch):
    # this machine's test venv has no torch: the script's own answer, not a guess
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert p2p_measure.run_measure({}) == {"error": "needs torch with CUDA (No module named 'torch')"}
