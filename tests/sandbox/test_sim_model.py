"""The simulated server's pure parts, without the VM: throughput model, config and faults, gate detection on
the files of the real wheels (unpatched and patched copies)."""

from __future__ import annotations

import json
import tomllib
import zipfile
from importlib import resources
from pathlib import Path

import pytest
from helpers.upstream_edits import PREFLIGHT, RESOLVER_0_5_23, RUNTIME, replace
from sglang_sim import startup_texts as texts
from sglang_sim.compile_caches import CacheLayout, CompileCache
from sglang_sim.config import Fault, SimConfig
from sglang_sim.environ import env_bool
from sglang_sim.startup_texts import LogStyle
from sglang_sim.throughput import ThroughputModel
from sglang_sim.upstream import Fusion, InstalledUpstream

from sandbox import wheelhouse

# the simulator's own configuration: the anchors the curve is fitted through
PARAMS = tomllib.loads(resources.files("sglang_sim").joinpath("throughput.toml").read_text())


@pytest.mark.parametrize("anchor", PARAMS["reference"]["anchors"], ids=lambda anchor: str(anchor["concurrency"]))
def test_the_fitted_curve_passes_through_each_configured_anchor(anchor: dict[str, float]) -> None:
    model = ThroughputModel.default()
    assert model.aggregate_tok_s(int(anchor["concurrency"])) == pytest.approx(anchor["output_tok_s"], rel=1e-6)


def test_a_fused_release_on_sm120_makes_its_configured_figure() -> None:
    fused = PARAMS["fusion_sm120"]
    model = ThroughputModel.default()
    assert model.aggregate_tok_s(fused["concurrency"], fused_on_sm120=True) == pytest.approx(fused["output_tok_s"],
                                                                                             rel=1e-6)


def test_more_concurrency_gives_more_total_and_less_per_request() -> None:
    model = ThroughputModel.default()
    assert model.aggregate_tok_s(128) > model.aggregate_tok_s(64)
    assert model.per_request_tok_s(128) < model.per_request_tok_s(64)


def test_power_reaches_about_250_w_per_gpu_at_full_load() -> None:
    model = ThroughputModel.default()
    assert model.power_w(1024) == pytest.approx(250)
    assert model.power_w(0) < model.power_w(64) < model.power_w(1024)


def test_a_fused_release_on_sm120_draws_less_power_as_it_makes_fewer_tokens() -> None:
    model = ThroughputModel.default()
    assert model.power_w(0) < model.power_w(1024, fused_on_sm120=True) < model.power_w(1024)


@pytest.mark.parametrize(("text", "fault"), [
    ("", None), ("oom\n", Fault("oom")), ("die-after 3", Fault("die-after", 3)),
    ("generation-hang", Fault("generation-hang")),
])
def test_fault_file_is_parsed(text: str, fault: Fault | None) -> None:
    assert Fault.parse(text) == fault


@pytest.mark.parametrize("text", ["melt", "die-after", "die-after many"])
def test_bad_fault_file_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Fault.parse(text)


def test_config_file_sets_phases_and_fault_file_wins(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"phases_s": {"weights": 7.5}, "fault": "oom", "gpus": {"count": 4}}))
    fault = tmp_path / "fault"
    fault.write_text("port-in-use\n")
    loaded = SimConfig.load({"SGLANG_SIM_CONFIG": str(config), "SGLANG_SIM_FAULT": str(fault)})
    assert loaded.phases_s["weights"] == 7.5
    assert loaded.has_fault("port-in-use")


def test_config_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"phase_seconds": {}}))
    with pytest.raises(ValueError, match="phase_seconds"):
        SimConfig.load({"SGLANG_SIM_CONFIG": str(config), "SGLANG_SIM_FAULT": str(tmp_path / "none")})


# --- gates, on the real wheels' files --------------------------------------------------------------------

GATE_FILES = (
    "sglang/srt/layers/flashinfer_comm_fusion.py",
    "sglang/srt/layers/layer_boundary/residual/add_norm.py",
    "sglang/srt/layers/communicator.py",
    "sglang/srt/entrypoints/http_server.py",
    "flashinfer/jit/comm.py",
    "sglang/srt/model_executor/model_runner.py",  # which start lines the version logs
    "sglang/srt/environ.py",  # where its caches default to
)


def installed_copy(tmp_path: Path, sglang: str, flashinfer: str) -> InstalledUpstream:
    """The gate, log and cache files of two real wheels, laid out as in site-packages, in a directory to edit."""
    for dist, version in (("sglang", sglang), ("flashinfer-python", flashinfer)):
        with zipfile.ZipFile(wheelhouse.download(dist, version)) as archive:
            for name in set(archive.namelist()) & set(GATE_FILES):
                archive.extract(name, tmp_path)
    return InstalledUpstream(tmp_path / "sglang", tmp_path / "flashinfer", sglang)


@pytest.mark.wheels
def test_unpatched_0_5_23_on_sm120_crashes_in_the_backend_resolver(tmp_path: Path) -> None:
    upstream = installed_copy(tmp_path, "0.5.23", "0.7.2")
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.CRASH_RESOLVER
    assert upstream.fusion_outcome(False, compute_major=12) is Fusion.OFF
    assert upstream.fusion_outcome(True, compute_major=9) is Fusion.FUSED
    assert upstream.has_ready_endpoint


@pytest.mark.wheels
def test_0_5_23_with_every_sglang_gate_patched_is_fused_on_sm120(tmp_path: Path) -> None:
    upstream = installed_copy(tmp_path, "0.5.23", "0.7.2")
    replace(upstream.fusion_module, RESOLVER_0_5_23)
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.SKIPPED  # preflight (f) still probes
    replace(upstream.fusion_module, PREFLIGHT)
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.NO_OP  # runtime gate (a) still gated
    replace(upstream.runtime_gate_module, RUNTIME)
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.FUSED


@pytest.mark.wheels
def test_0_5_9_is_a_silent_no_op_until_patched_then_hits_the_flashinfer_jit_gate(tmp_path: Path) -> None:
    upstream = installed_copy(tmp_path, "0.5.9", "0.6.3")
    assert not upstream.has_ready_endpoint
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.NO_OP
    replace(upstream.runtime_gate_module, RUNTIME)
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.CRASH_JIT
    # only the line of gen_trtllm_comm_module (the first in comm.py on 0.6.3), as the patch does
    replace(upstream.jit_module, ("supported_major_versions=[9, 10]\n", "supported_major_versions=[9, 10, 12]\n"))
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.FUSED


@pytest.mark.wheels
def test_0_5_15_with_its_resolver_patched_hits_the_flashinfer_jit_gate(tmp_path: Path) -> None:
    upstream = installed_copy(tmp_path, "0.5.15.post1", "0.6.12")
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.CRASH_RESOLVER
    replace(upstream.fusion_module, ("if not (is_sm90_supported() or is_sm100_supported()):",
                                     "if not (is_sm90_supported() or is_sm100_supported() or is_sm120_supported()):"))
    replace(upstream.fusion_module, PREFLIGHT)
    assert upstream.fusion_outcome(True, compute_major=12) is Fusion.CRASH_JIT


# --- start lines and compile caches, per version, on the real wheels' files -------------------------------------


@pytest.mark.wheels
def test_0_5_9_logs_its_own_start_lines_and_0_5_23_its_own(tmp_path: Path) -> None:
    """0.5.9 names the capture `Capture cuda graph`, logs the dtype at the weights' end and ends each update of the
    shards' bar with a newline; 0.5.23 logs the target decode capture, the quantization, and one bar line."""
    old = LogStyle.of(installed_copy(tmp_path / "old", "0.5.9", "0.6.3").sglang_dir)
    new = LogStyle.of(installed_copy(tmp_path / "new", "0.5.23", "0.7.2").sglang_dir)
    assert (old, new) == (LogStyle.V0_5_9, LogStyle.V0_5_23)
    assert texts.capture_decode_begin(old, "full", 1024) == \
        "Capture cuda graph begin. This can take up to several minutes. avail mem=1.00 GB"
    assert texts.capture_decode_begin(new, "full", 1024).startswith("Capture target decode CUDA graph begin. ")
    assert texts.capture_decode_end(old, 8, 2.5, 512, 1024) == \
        "Capture cuda graph end. Time elapsed: 2.50 s. mem usage=0.50 GB. avail mem=1.00 GB."
    assert ", dtype=torch.bfloat16, " in texts.load_weight_end(old, 1.0, "X", "modelopt_fp4", 1024, 512)
    assert ", quant=modelopt_fp4, " in texts.load_weight_end(new, 1.0, "X", "modelopt_fp4", 1024, 512)
    assert texts.shard_progress(old, 1, 2, 3.0) == \
        "\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03,  3.00s/it]\n"
    assert texts.shard_progress(new, 0, 2, 0.0) == \
        "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"


@pytest.mark.wheels
def test_each_version_finds_its_compile_caches_where_sglang_does(tmp_path: Path) -> None:
    """0.5.23 puts Triton, DeepGEMM and FlashInfer under SGLANG_CACHE_DIR when their own variables are unset; 0.5.9
    leaves them at their own defaults in the home directory; a variable set wins in both."""
    home = Path.home()
    new = CacheLayout.of(installed_copy(tmp_path / "new", "0.5.23", "0.7.2").sglang_dir)
    old = CacheLayout.of(installed_copy(tmp_path / "old", "0.5.9", "0.6.3").sglang_dir)
    under = {"SGLANG_CACHE_DIR": "/c"}
    assert [new.directory(cache, under) for cache in CompileCache] == [Path("/c/deep_gemm"), Path("/c/triton")]
    assert new.flashinfer_base(under) == Path("/c")
    assert [old.directory(cache, under) for cache in CompileCache] == [home / ".cache/deep_gemm",
                                                                       home / ".triton/cache"]
    assert old.flashinfer_base(under) == home
    own = {"SGLANG_DG_CACHE_DIR": "/dg", "TRITON_CACHE_DIR": "/t"}
    for layout in (old, new):
        assert [layout.directory(cache, own) for cache in CompileCache] == [Path("/dg"), Path("/t")]


@pytest.mark.parametrize(("value", "on"), [("false", False), ("0", False), ("N", False), ("TRUE", True),
                                           ("y", True), ("maybe", True), (None, True)])
def test_an_sglang_boolean_reads_as_envbool_does(value: str | None, on: bool) -> None:
    environ = {} if value is None else {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": value}
    assert env_bool(environ, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True) is on
