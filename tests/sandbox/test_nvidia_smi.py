"""The nvidia-smi stand-in, run locally: the real tool's formats, per-guest GPU config, the sim's load."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from sandbox import manage

TOOL = manage.SANDBOX_DIR / "nvidia-smi"
FIELDS = ("index,name,uuid,compute_cap,memory.total,memory.used,power.draw,power.limit,utilization.gpu,"
          "driver_version")


def nvidia_smi(tmp_path: Path, *args: str, config: dict | None = None) -> subprocess.CompletedProcess[str]:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"state_dir": str(tmp_path / "state"), **(config or {})}))
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          env={**os.environ, "SGLANG_SIM_CONFIG": str(config_file)}, check=False)


def query(tmp_path: Path, fmt: str = "csv", config: dict | None = None) -> list[dict[str, str]]:
    result = nvidia_smi(tmp_path, f"--query-gpu={FIELDS}", f"--format={fmt}", config=config)
    assert result.returncode == 0, result.stdout
    return list(csv.DictReader(io.StringIO(result.stdout), skipinitialspace=True))


def test_default_host_is_eight_rtx_pro_6000_sm120(tmp_path: Path) -> None:
    rows = query(tmp_path)
    assert len(rows) == 8
    assert {row["name"] for row in rows} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {row["compute_cap"] for row in rows} == {"12.0"}
    assert rows[0]["memory.total [MiB]"] == "97887 MiB"
    assert rows[0]["power.limit [W]"] == "600.00 W"
    assert len({row["uuid"] for row in rows}) == 8


def test_noheader_nounits_gives_bare_values(tmp_path: Path) -> None:
    result = nvidia_smi(tmp_path, "--query-gpu=index,memory.total,power.limit", "--format=csv,noheader,nounits")
    assert result.stdout.splitlines()[0] == "0, 97887, 600.00"


def test_gpu_count_and_model_are_configurable(tmp_path: Path) -> None:
    rows = query(tmp_path, config={"gpus": {"model": "h100", "count": 4}})
    assert len(rows) == 4
    assert {row["compute_cap"] for row in rows} == {"9.0"}


def test_list_and_topology_formats(tmp_path: Path) -> None:
    listing = nvidia_smi(tmp_path, "-L").stdout.splitlines()
    assert listing[0].startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-")
    topology = nvidia_smi(tmp_path, "topo", "-m").stdout.splitlines()
    # the header as the real tool prints it (tests/data/gpu_check/h200x2-2026-11-30/topo-m.txt), underline and all
    assert topology[0] == "\t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(8)) + \
        "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert topology[1].split("\t")[1:3] == [" X ", "PHB"]


def test_unknown_field_is_refused_like_the_real_tool(tmp_path: Path) -> None:
    result = nvidia_smi(tmp_path, "--query-gpu=index,flux", "--format=csv")
    assert result.returncode == 2
    assert 'Field "flux" is not a valid field to query.' in result.stdout


def test_memory_and_power_follow_a_running_simulated_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "30000.json").write_text(json.dumps(
        {"pid": os.getpid(), "gpus": [0, 1], "memory_used_mib": 86000, "power_w": 250.0, "util_pct": 100}))
    (state / "30001.json").write_text(json.dumps(  # a server that is gone no longer counts
        {"pid": 2**22 + 7, "gpus": [2], "memory_used_mib": 1000, "power_w": 100.0, "util_pct": 50}))
    rows = query(tmp_path, "csv,nounits")
    assert rows[0]["memory.used [MiB]"] == "86000"
    assert rows[1]["power.draw [W]"] == "250.00"
    assert rows[1]["utilization.gpu [%]"] == "100"
    assert rows[2]["memory.used [MiB]"] == "0"
