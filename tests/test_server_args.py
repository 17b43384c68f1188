"""server_args: profile -> SGLang argv per version; checked against the real parsers of the released wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.launcher_run import argv_printer, launched_argv
from helpers.server_args import with_changes

from deploy_lib.errors import ConfigError
from deploy_lib.host_scripts.sglang_options import extract
from deploy_lib.profile import Profile, SecretRef, load_profile
from deploy_lib.release.argv_check import build_parser, check_argv, find_option
from deploy_lib.release.model import build_release
from deploy_lib.release.server_args import (
    API_KEY_ENV,
    API_KEY_LAUNCHER,
    launch_argv,
    launch_environment,
    secret_environment,
    sglang_args,
    spelling,
)
from deploy_lib.store import StoreLayout
from deploy_lib.versions import SPELLINGS, version_key

pytest_plugins = ("helpers.wheelcache",)  # the sglang_source fixture
PROFILES = Path(__file__).resolve().parent.parent / "inventory" / "profiles"


def reference(name: str = "glm5-nvfp4") -> Profile:
    return load_profile(PROFILES, name).profile


# The hand-written launch of issue 2, with `--model` and the abbreviation `--tp` written out in full.
HAND_059 = (
    "--model-path lukealonso/GLM-5-NVFP4 --served-model-name glm-5 --reasoning-parser glm45 --tool-call-parser glm47 "
    "--trust-remote-code --tp-size 8 --mem-fraction-static 0.92 --max-running-requests 1024 --kv-cache-dtype auto "
    "--quantization modelopt_fp4 --attention-backend flashinfer --fp8-gemm-backend cutlass "
    "--nsa-decode-backend trtllm --nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass "
    "--disable-cuda-graph --disable-radix-cache --host 0.0.0.0 --port 8000"
).split()
# The one difference the reference profile makes (issue 42): SGLang's metrics on, so the watch and `workload` can read
# /metrics; before 0.5.15 the length histograms need --collect-tokens-histogram too. Written before --host.
METRICS_059 = ["--enable-metrics", "--collect-tokens-histogram"]
METRICS_0523 = ["--enable-metrics"]


def with_metrics(hand: list[str], metrics: list[str]) -> list[str]:
    at = hand.index("--host")
    return hand[:at] + metrics + hand[at:]


def test_reference_profile_renders_the_users_command_plus_metrics_on_059() -> None:
    argv = launch_argv(reference(), "0.5.9")
    assert argv[:3] == ("/root/ml-env/bin/python3", "-m", "sglang.launch_server")
    assert list(argv[3:]) == with_metrics(HAND_059, METRICS_059)
    assert launch_environment(reference()) == {
        "NCCL_P2P_LEVEL": "5", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8", "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "8", "SAFETENSORS_FAST_GPU": "1", "CUDA_HOME": "/usr/local/cuda-12.8",
        # what `source /root/ml-env/bin/activate` gave the hand-run server
        "PATH": "/root/ml-env/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": "/root/ml-env"}


def test_a_profile_path_follows_the_venvs_bin_once() -> None:
    """Input tried: env.PATH that already names the venv's bin/ (as an activated shell's PATH does)."""
    profile = with_changes(reference(), env={"PATH": "/root/ml-env/bin:/opt/tools/bin:/usr/bin"})
    assert launch_environment(profile)["PATH"] == "/root/ml-env/bin:/opt/tools/bin:/usr/bin"


def test_reference_profile_on_0523_uses_the_renamed_flags() -> None:
    args = sglang_args(reference(), "0.5.23")
    text = " ".join(args)
    assert "--dsa-decode-backend trtllm --dsa-prefill-backend trtllm" in text
    assert "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled" in text
    assert not any(a.startswith("--nsa-") or a == "--disable-cuda-graph" or a == "--tp" for a in args)
    # everything else is the same flag, in the same place, and metrics need no histogram flag any more
    assert [a for a in args if a.startswith("--") and "dsa" not in a and "cuda-graph" not in a] == [
        a for a in with_metrics(HAND_059, METRICS_0523) if a.startswith("--") and "nsa" not in a
        and "cuda-graph" not in a]


@pytest.mark.parametrize(("version", "uses"), [
    ("0.5.9", "--nsa-decode-backend"), ("0.5.14", "--nsa-decode-backend"), ("0.5.15rc1", "--nsa-decode-backend"),
    ("0.5.15", "--dsa-decode-backend"), ("0.5.15.post1", "--dsa-decode-backend"), ("0.5.23", "--dsa-decode-backend"),
])
def test_dsa_rename_boundary(version: str, uses: str) -> None:
    assert uses in sglang_args(reference(), version)


@pytest.mark.parametrize(("version", "fusion"), [
    ("0.5.9", ["--enable-flashinfer-allreduce-fusion"]),
    ("0.5.15.post1", ["--flashinfer-allreduce-fusion-backend", "auto"]),
    ("0.5.23", ["--flashinfer-allreduce-fusion-backend", "auto"]),
])
def test_allreduce_fusion_is_spelled_per_version_and_absent_when_off(version: str, fusion: list[str]) -> None:
    on = list(sglang_args(reference("glm5-nvfp4-fusion"), version))
    off = list(sglang_args(reference(), version))
    at = on.index(fusion[0])
    assert on[at:at + len(fusion)] == fusion and on[:at] + on[at + len(fusion):] == off
    assert not any("allreduce" in a for a in off)


def test_fp8_gemm_backend_is_refused_before_it_existed() -> None:
    with pytest.raises(ConfigError) as refused:
        sglang_args(reference(), "0.5.6.post1")
    assert "backends.fp8_gemm: --fp8-gemm-backend does not exist in SGLang 0.5.6.post1 (first in 0.5.6.post2)" in str(
        refused.value)
    assert "--fp8-gemm-backend" in sglang_args(reference(), "0.5.6.post2")
    without = with_changes(reference(), backends={"fp8_gemm": None})
    assert "--fp8-gemm-backend" not in sglang_args(without, "0.5.5.post3")


@pytest.mark.parametrize("bad", ["", "latest", "0.5.x"])
def test_version_must_be_a_version(bad: str) -> None:
    with pytest.raises(ConfigError, match="SGLang version"):
        sglang_args(reference(), bad)


def test_optional_settings_reach_argv_only_when_set() -> None:
    profile = with_changes(
        reference(),
        parallel={"tp": 4, "pp": 2, "dp": 1, "nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"},
        features={"cuda_graph": True, "radix_cache": True, "allreduce_fusion": False, "metrics": True},
        memory={"mem_fraction_static": None, "max_running_requests": None, "chunked_prefill_size": 8192},
    )
    text = " ".join(sglang_args(profile, "0.5.23"))
    assert "--tp-size 4 --pp-size 2 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:5000" in text
    assert "--dp-size" not in text and "--mem-fraction-static" not in text and "--max-running-requests" not in text
    assert "--chunked-prefill-size 8192" in text and "--enable-metrics" in text
    assert "cuda-graph" not in text and "--disable-radix-cache" not in text


def test_extra_args_come_last_and_verbatim() -> None:
    profile = with_changes(reference(), extra_args=["--log-level", "debug", "--json-model-override-args={\"a\": 1}"])
    assert sglang_args(profile, "0.5.23")[-3:] == ("--log-level", "debug", "--json-model-override-args={\"a\": 1}")


def test_every_spelling_cites_its_source_and_is_ordered() -> None:
    for setting, spellings in SPELLINGS.items():
        assert all(s.source for s in spellings), setting
        assert [version_key(s.since) for s in spellings] == sorted(version_key(s.since) for s in spellings)
    assert spelling("fp8_gemm", "0.5.6") is None


# ---------------------------------------------------------------------------------------------------------------
# the API key: never in argv, delivered by the launcher from the environment file
# ---------------------------------------------------------------------------------------------------------------

SECRET = "sk-test-0123456789"


def keyed() -> Profile:
    return with_changes(reference(), server={"api_key": {"env": "MY_LOCAL_KEY"}})


def test_api_key_is_never_in_argv() -> None:
    argv = launch_argv(keyed(), "0.5.23")
    assert argv[:3] == ("/root/ml-env/bin/python3", "-c", API_KEY_LAUNCHER)
    assert argv[3:] == sglang_args(reference(), "0.5.23")
    assert not any("api-key" in a or "MY_LOCAL_KEY" in a for a in argv[3:])
    assert secret_environment(keyed()) == {API_KEY_ENV: SecretRef(env="MY_LOCAL_KEY")}
    assert secret_environment(reference()) == {}


def test_api_key_and_a_secret_of_the_same_name_clash() -> None:
    profile = with_changes(keyed(), secrets={API_KEY_ENV: {"file": "/root/key"}})
    with pytest.raises(ConfigError, match=f"secrets.{API_KEY_ENV}"):
        secret_environment(profile)


FAKE_LAUNCH_SERVER = """
import json, os, sys
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump({"name": __name__, "argv": sys.argv[1:], "env_key": os.environ.get("SGLANG_API_KEY"),
               "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0")}, out)
"""


def _run_launcher(tmp_path: Path, env_key: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "PROBE_OUT": str(tmp_path / "probe.json")}
    if env_key is not None:
        env[API_KEY_ENV] = env_key
    argv = launch_argv(keyed(), "0.5.23")
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, check=False,
                          cwd=tmp_path)


def test_launcher_hands_the_key_to_sglang_without_exposing_it(tmp_path: Path) -> None:
    done = _run_launcher(tmp_path, SECRET)
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "probe.json").read_text())
    assert seen["name"] == "__main__"  # run as `python -m sglang.launch_server` would
    assert seen["argv"] == [*sglang_args(reference(), "0.5.23"), "--api-key", SECRET]
    assert seen["env_key"] is None  # removed before SGLang (and its child processes) start
    assert SECRET not in " ".join(seen["cmdline"])  # /proc/PID/cmdline, what `ps` shows


def test_launcher_refuses_to_start_without_the_key(tmp_path: Path) -> None:
    done = _run_launcher(tmp_path, None)
    assert done.returncode == 1
    assert f"{API_KEY_ENV} is not set in the environment file" in done.stderr
    assert not (tmp_path / "probe.json").exists()


def test_launcher_code_survives_unit_file_quoting() -> None:
    assert not any(c in API_KEY_LAUNCHER for c in '$%"\\\n')


# ---------------------------------------------------------------------------------------------------------------
# against the real parsers of the released wheels
# ---------------------------------------------------------------------------------------------------------------

VERSIONS = ["0.5.9", "0.5.15", "0.5.15.post1", "0.5.20", "0.5.23"]


@pytest.mark.wheels
@pytest.mark.parametrize("profile_name", ["glm5-nvfp4", "glm5-nvfp4-fusion"])
@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_argv_is_accepted_by_that_versions_parser(real_options: Callable[[str], dict[str, Any]],
                                                           version: str, profile_name: str, tmp_path: Path) -> None:
    """The arguments the release's launcher, run by /bin/sh, gives the venv's python (a stand-in printing them)."""
    options = real_options(version)
    venv = tmp_path / "venv"
    release = build_release(load_profile(PROFILES, profile_name), StoreLayout("sglang"), version, {}, venv=str(venv))
    argv_printer(venv / "bin" / "python3")
    launched = launched_argv(str(release.launcher_text), tmp_path)
    assert launched[:3] == (str(venv / "bin" / "python3"), "-m", "sglang.launch_server")
    args = list(launched[3:])
    assert check_argv(options, args) == []  # not even a deprecation warning
    parsed = vars(build_parser(options).parse_args(args))
    dest = {flag: find_option(options, flag)["dest"] for flag in ("--tp-size", "--model-path")}
    assert parsed[dest["--tp-size"]] == 8 and parsed[dest["--model-path"]] == "lukealonso/GLM-5-NVFP4"
    decode = "nsa_decode_backend" if version_key(version) < version_key("0.5.15") else "dsa_decode_backend"
    assert parsed[decode] == "trtllm"


@pytest.mark.wheels
def test_the_users_command_as_written_fails_on_0523(real_options: Callable[[str], dict[str, Any]]) -> None:
    """0.5.20+: `error: unrecognized arguments: --nsa-decode-backend trtllm --nsa-prefill-backend trtllm`."""
    options = real_options("0.5.23")
    as_written = [("--model" if a == "--model-path" else "--tp" if a == "--tp-size" else a) for a in HAND_059]
    problems = check_argv(options, as_written)
    assert [(p.kind, p.arg) for p in problems if p.severity == "error"] == [
        ("abbreviation", "--tp"), ("unrecognized", "--nsa-decode-backend"), ("unrecognized", "--nsa-prefill-backend")]
    assert problems[1].message.startswith("unrecognized arguments: --nsa-decode-backend trtllm")
    assert "did you mean --dsa-decode-backend?" in problems[1].message
    with pytest.raises(SystemExit):
        build_parser(options).parse_args(as_written)


@pytest.mark.wheels
def test_a_bad_choice_is_caught(real_options: Callable[[str], dict[str, Any]]) -> None:
    args = [*sglang_args(reference(), "0.5.23"), "--attention-backend", "flashinfer2"]
    problems = check_argv(real_options("0.5.23"), args)
    assert [(p.kind, p.arg) for p in problems] == [("invalid-choice", "flashinfer2"),
                                                   ("duplicate", "--attention-backend")]


@pytest.mark.wheels
def test_a_version_too_old_for_the_profile_is_caught_at_preflight(sglang_source: Callable[[str], Path]) -> None:
    """0.5.6.post1 predates the glm47 tool parser and the trtllm NSA kernels (its srt/server_args.py)."""
    options = extract(sglang_source("0.5.6.post1"))["options"]
    args = sglang_args(with_changes(reference(), backends={"fp8_gemm": None}), "0.5.6.post1")
    problems = check_argv(options, args)
    assert [(p.kind, p.arg) for p in problems] == [
        ("invalid-choice", "glm47"), ("invalid-choice", "trtllm"), ("invalid-choice", "trtllm")]
