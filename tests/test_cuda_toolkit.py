"""The CUDA toolkit fact and FlashInfer's SM 12.x toolkit rule, checked against the real flashinfer-python wheels:
their own flashinfer/compilation_context.py runs here (torch and nvcc stubbed) and must agree with our verdict."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.deploy_plan import PROJECT, facts, target
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress

from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import patches as on_host
from deploy_lib.commands.deploy import Options
from deploy_lib.deploy.plan import plan_deploy
from deploy_lib.deploy.preflight import preflight
from deploy_lib.errors import PreflightError
from deploy_lib.facts.cuda_toolkit import (
    FACT_NVCC,
    FACT_VERSION_JSON,
    CudaToolkit,
    describe,
    parse_toolkit,
    sm12x_problem,
    toolkit_steps,
)
from deploy_lib.patches import find_patch_set
from deploy_lib.remote import Put, Step, StepResult

pytest_plugins = ("helpers.wheelcache",)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
# version.json of a CUDA 12.8 Update 1 toolkit and nvcc's banner, as the toolkits ship them
VERSION_JSON_128 = '{\n   "cuda" : {\n      "name" : "CUDA SDK",\n      "version" : "12.8.1"\n   },\n' \
                   '   "cuda_nvcc" : {\n      "name" : "CUDA NVCC",\n      "version" : "12.8.93"\n   }\n}\n'
NVCC_129 = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Tue_May_27_02:21:03_PDT_2025\nCuda compilation tools, release 12.9, V12.9.86\n"
            "Build cuda_12.9.r12.9/compiler.36037853_0\n")
TOOLKIT_128 = CudaToolkit("/usr/local/cuda-12.8", "12.8", "/usr/local/cuda-12.8/version.json")
WHEEL_VERSIONS = ("0.6.3", "0.6.12", "0.6.17", "0.7.2", "0.7.4")


def result(name: str, code: int, stdout: str = "") -> StepResult:
    return StepResult(Step(name, ("true",)), code, stdout, "", 0.0)


def test_the_version_is_read_from_version_json_else_from_nvcc() -> None:
    home = "/usr/local/cuda-12.8"
    assert [s.argv for s in toolkit_steps(home)] == [("cat", "--", f"{home}/version.json"),
                                                     (f"{home}/bin/nvcc", "--version")]
    both = {FACT_VERSION_JSON: result(FACT_VERSION_JSON, 0, VERSION_JSON_128),
            FACT_NVCC: result(FACT_NVCC, 0, NVCC_129)}
    assert parse_toolkit(home, both) == CudaToolkit(home, "12.8", f"{home}/version.json")
    only_nvcc = {FACT_VERSION_JSON: result(FACT_VERSION_JSON, 1), FACT_NVCC: result(FACT_NVCC, 0, NVCC_129)}
    assert parse_toolkit(home, only_nvcc) == CudaToolkit(home, "12.9", f"{home}/bin/nvcc --version")
    broken_json = {FACT_VERSION_JSON: result(FACT_VERSION_JSON, 0, "{not json"), FACT_NVCC: result(FACT_NVCC, 127)}
    none = parse_toolkit(home, broken_json)
    assert none.version is None and "neither" in none.source
    assert "unknown" in describe("0.6.12", "12.0", none, {})


@pytest.mark.parametrize(("flashinfer", "refused"), [
    ("0.6.3", False), ("0.6.6", False), ("0.6.7", True), ("0.6.12", True), ("0.6.17", True), ("0.7.0.post1", True),
    ("0.7.1", False), ("0.7.2", False), ("0.7.4", False)])
def test_cuda_128_on_sm120_per_flashinfer_version(flashinfer: str, refused: bool) -> None:
    problem = sm12x_problem(flashinfer, "12.0", TOOLKIT_128, {})
    assert (problem is not None) == refused
    if refused:
        assert f"FlashInfer {flashinfer} needs CUDA >= 12.9" in problem and "is CUDA 12.8" in problem
    assert sm12x_problem(flashinfer, "12.0", TOOLKIT_128, {"FLASHINFER_CUDA_ARCH_LIST": "9.0a 12.0a"}) is None
    assert sm12x_problem(flashinfer, "12.0", replace(TOOLKIT_128, version="12.9"), {}) is None
    assert sm12x_problem(flashinfer, "9.0", TOOLKIT_128, {}) is None, "only SM 12.x GPUs are concerned"


def run_real_compilation_context(source: Path, toolkit: str, environ: dict[str, str],
                                 monkeypatch: pytest.MonkeyPatch) -> set[tuple[int, str]]:
    """TARGET_CUDA_ARCHS of the wheel's own CompilationContext on 8 SM 12.0 GPUs with nvcc `toolkit`."""
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(device_count=lambda: 8, get_device_capability=lambda device: (12, 0))  # type: ignore[attr-defined]
    cpp_ext = types.ModuleType("flashinfer.jit.cpp_ext")

    def is_cuda_version_at_least(version: str) -> bool:
        return tuple(map(int, toolkit.split("."))) >= tuple(map(int, version.split(".")))

    cpp_ext.is_cuda_version_at_least = is_cuda_version_at_least  # type: ignore[attr-defined]
    for name, module in (("torch", torch), ("flashinfer", types.ModuleType("flashinfer")),
                         ("flashinfer.jit", types.ModuleType("flashinfer.jit")), ("flashinfer.jit.cpp_ext", cpp_ext)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    namespace: dict[str, object] = {"__name__": "flashinfer.compilation_context"}
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # the wheel's module; torch and nvcc stubbed
    return namespace["CompilationContext"]().TARGET_CUDA_ARCHS  # type: ignore[operator,no-any-return]


@pytest.mark.wheels
@pytest.mark.parametrize("flashinfer", WHEEL_VERSIONS)
def test_our_rule_agrees_with_the_real_wheels_compilation_context(flashinfer: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers.wheelcache import unpacked

    source = unpacked("flashinfer-python", flashinfer, members=("flashinfer/compilation_context.py",)) \
        / "flashinfer" / "compilation_context.py"
    verdicts = {}
    for toolkit in ("12.8", "12.9"):
        for environ in ({}, {"FLASHINFER_CUDA_ARCH_LIST": "12.0a"}):
            archs = run_real_compilation_context(source, toolkit, environ, monkeypatch)
            real_accepts = any(major == 12 for major, _ in archs)
            ours = sm12x_problem(flashinfer, "12.0", replace(TOOLKIT_128, version=toolkit), environ) is None
            assert ours == real_accepts, (toolkit, environ, archs)
            verdicts[(toolkit, bool(environ))] = real_accepts
    # what the issue reported, seen in the wheels themselves: 0.6.12 and 0.6.17 refuse 12.8 without the arch list
    assert verdicts[("12.8", False)] == (flashinfer not in ("0.6.12", "0.6.17"))
    assert verdicts[("12.8", True)] and verdicts[("12.9", False)]


def fusion_plan(environ_env: dict[str, str] | None = None):
    loaded = PROJECT.profile("glm5-nvfp4-fusion")
    if environ_env:
        profile = loaded.profile.model_copy(update={"env": {**loaded.profile.env, **environ_env}})
        loaded = loaded.model_copy(update={"profile": profile})
    host = replace(facts(), sglang=replace(facts().sglang, flashinfer_version="0.6.12"), cuda_toolkit=TOOLKIT_128)
    plan = plan_deploy(loaded, target(), host, {}, False, NOW)
    return loaded, plan, replace(host, sglang=replace(host.sglang, options=facts(plan.release.args).sglang.options))


def test_preflight_refuses_a_fusion_release_flashinfer_cannot_build_with_this_toolkit() -> None:
    """Input tried: glm5-nvfp4-fusion (CUDA_HOME=/usr/local/cuda-12.8) on SM120 with FlashInfer 0.6.12."""
    loaded, plan, host = fusion_plan()
    with pytest.raises(PreflightError) as caught:
        preflight(plan, loaded, target(), host)
    assert caught.value.exit_code == 3
    message, hint = str(caught.value.message), caught.value.hint or ""
    assert "FlashInfer 0.6.12 needs CUDA >= 12.9" in message and "/usr/local/cuda-12.8 is CUDA 12.8" in message
    assert "CUDA >= 12.9 toolkit" in hint and "FLASHINFER_CUDA_ARCH_LIST: '12.0a'" in hint


def test_preflight_accepts_the_arch_list_fix_and_ignores_releases_without_fusion() -> None:
    loaded, plan, host = fusion_plan({"FLASHINFER_CUDA_ARCH_LIST": "12.0a"})
    preflight(plan, loaded, target(), host)
    plain = PROJECT.profile("glm5-nvfp4")
    plain_plan = plan_deploy(plain, target(), host, {}, False, NOW)
    preflight(plain_plan, plain, target(), replace(host, sglang=replace(
        host.sglang, options=facts(plain_plan.release.args).sglang.options)))


def patch_host(flashinfer: str, version_json: str | None) -> FakeRemote:
    """A host whose current venv has SGLang 0.5.15.post1 and `flashinfer`, 8 SM120 GPUs, a toolkit at CUDA_HOME."""
    remote = FakeRemote()
    remote.reply(lambda step: step.name.startswith("store facts"), exit_code=1)  # an empty release store
    remote.reply("store facts: clock", stdout="1764500000\n")
    remote.reply(lambda step: isinstance(step, Step) and step.argv[0] == "nvidia-smi", stdout="\n".join(
        f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 0, 30.0, 600.0, 0, 580.95"
        for i in range(8)))
    site = "/root/ml-env/lib/python3.11/site-packages"
    remote.reply("patch facts: venv", stdout=json.dumps({  # what venvs.INSTALLED_FACTS_SCRIPT prints
        "purelib": site, "versions": {"sglang": "0.5.15.post1", "flashinfer-python": flashinfer},
        "origins": {}, "roots": {"sglang": site, "flashinfer": site}}))
    remote.reply("patch facts: record", exit_code=1)
    remote.reply(lambda step: isinstance(step, Step) and step.argv[0] == "base64", exit_code=1)
    remote.reply(FACT_VERSION_JSON, exit_code=0 if version_json else 1, stdout=version_json or "")
    remote.reply(FACT_NVCC, exit_code=127)
    return remote


def test_patch_fusion_check_and_audit_report_the_toolkit_and_enable_refuses_before_any_change() -> None:
    patch_set = find_patch_set(ROLES_DIR, "fusion-sm120")
    base = PROJECT.profile("glm5-nvfp4")
    remote = patch_host("0.6.12", VERSION_JSON_128)
    report = on_host.check(remote, patch_set, base, target())
    assert report.toolkit is not None and report.toolkit.startswith("CUDA toolkit: REFUSED: FlashInfer 0.6.12 needs")
    assert report.toolkit in report.summary_lines()
    audit = on_host.audit(remote, patch_set, base, target())
    assert audit.toolkit == report.toolkit and audit.toolkit in audit.summary_lines()
    with pytest.raises(PreflightError) as caught:
        on_host.enable(remote, patch_set, base, on_host.patched_profile(base, patch_set), target(),
                        RecordingProgress(), Options())
    assert caught.value.exit_code == 3 and "CUDA 12.8" in caught.value.message
    # reads run as root too (a venv under /root): "only reads" is nothing put but the lock's owner, no venv step
    assert not any((isinstance(step, Put) and step.dest.name != "owner.json") or step.name.startswith("venv ")
                   for batch in remote.batches for step in batch), "only reads ran: no venv made, nothing written"
    fine = on_host.check(patch_host("0.7.2", VERSION_JSON_128), patch_set, base, target())
    assert fine.toolkit == ("CUDA toolkit: CUDA 12.8 at /usr/local/cuda-12.8 (/usr/local/cuda-12.8/version.json): "
                            "FlashInfer 0.7.2 accepts it for sm120")
