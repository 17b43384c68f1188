"""The fusion-sm120 patch set against the real SGLang / FlashInfer wheels, and the patch-set format's refusals.

Expected lines are the gate lines as they stand in the real sglang and flashinfer-python wheels from PyPI.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from deploy_lib.commands.patches import PatchContext, _reused_venv, base_profile, patched_profile
from deploy_lib.deploy.project import Project
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.host_scripts.sglang_options import extract
from deploy_lib.patches import (
    GpuArch,
    PatchConflict,
    PatchRecord,
    PatchSet,
    State,
    VersionRange,
    active_warnings,
    apply,
    audit,
    audit_paths,
    check,
    clear_jit_cache_steps,
    disable,
    distributions,
    enable,
    file_facts,
    files_needed,
    list_patch_sets,
    load_patch_set,
    record_fact,
    refuse_unless_applicable,
    revert,
    select_variants,
    sha256_text,
)
from deploy_lib.release.argv_check import check_argv
from deploy_lib.remote import StepResult
from deploy_lib.remote.readings import ABSENT_OK, Readings
from deploy_lib.store import StoreLayout
from deploy_lib.venvs import InstalledFacts, cache_environment
from sandbox.sim.sglang_sim.upstream import Fusion, InstalledUpstream

# imported lazily below: a plugin imported before it is registered is not rewritten
pytest_plugins = ("helpers.wheelcache",)

ROLE = Path(__file__).resolve().parent.parent / "roles" / "fusion-sm120"
FLASHINFER_MEMBERS = ("flashinfer/*.py", "flashinfer/data/include/flashinfer/comm/*.cuh",
                      "flashinfer/data/csrc/trtllm_*.cu", "*.dist-info/*")
HEADER = "flashinfer/data/include/flashinfer/comm/trtllm_allreduce.cuh"
HEADER_GATE = "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))\n"
HEADER_GATE_LINES = [417, 455, 485, 533, 711, 895, 950, 991, 1053, 1207, 1265, 1335, 1444]  # the 0.6.x header
COMMUNICATOR = "sglang/srt/layers/communicator.py"
ADD_NORM = "sglang/srt/layers/layer_boundary/residual/add_norm.py"
FUSION = "sglang/srt/layers/flashinfer_comm_fusion.py"
JIT = "flashinfer/jit/comm.py"


@dataclass(frozen=True)
class Generation:
    sglang: str
    flashinfer: str
    states: dict[str, State]
    # file -> (lines replaced or deleted, lines after which new lines are inserted), numbered in the wheel's file
    changes: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    @property
    def versions(self) -> dict[str, str]:
        return {"sglang": self.sglang, "flashinfer-python": self.flashinfer}


A, N, X = State.ABSENT, State.NATIVE, State.NOT_IN_VERSION
GENERATIONS = [
    Generation("0.5.9", "0.6.3",
               {"runtime-gate": A, "backend-resolver": X, "preflight-multicast": X, "jit-gate": A, "header-gate": A},
               {COMMUNICATOR: ([95], [67, 73]), JIT: ([61], []), HEADER: (HEADER_GATE_LINES, [])}),
    # the edges of the version ranges: first SGLang with the write-up's gate text, last gated / first native FlashInfer
    Generation("0.5.8.post1", "0.6.16.post4",
               {"runtime-gate": A, "backend-resolver": X, "preflight-multicast": X, "jit-gate": A, "header-gate": A},
               {COMMUNICATOR: ([93], [65, 71]), JIT: ([192], []), HEADER: (HEADER_GATE_LINES, [])}),
    Generation("0.5.20", "0.6.17",
               {"runtime-gate": A, "backend-resolver": A, "preflight-multicast": A, "jit-gate": N, "header-gate": N},
               {COMMUNICATOR: ([195], [98]), FUSION: ([51, *range(285, 301)], [])}),
    Generation("0.5.15.post1", "0.6.12",
               {"runtime-gate": A, "backend-resolver": A, "preflight-multicast": A, "jit-gate": A, "header-gate": A},
               {COMMUNICATOR: ([170], [87, 93]), FUSION: ([49, *range(279, 295)], [23]), JIT: ([181], []),
                HEADER: (HEADER_GATE_LINES, [])}),
    Generation("0.5.23", "0.7.2",
               {"runtime-gate": A, "backend-resolver": A, "preflight-multicast": A, "jit-gate": N, "header-gate": N},
               {ADD_NORM: ([146], [54]), FUSION: ([48, *range(295, 311)], [])}),
]
IDS = [f"sglang-{g.sglang}+flashinfer-{g.flashinfer}" for g in GENERATIONS]


@pytest.fixture(scope="module")
def patch_set() -> PatchSet:
    return load_patch_set(ROLE)


def site_packages(generation: Generation) -> tuple[Path, Path]:
    from helpers.wheelcache import unpacked

    return unpacked("sglang", generation.sglang), unpacked("flashinfer-python", generation.flashinfer,
                                                          members=FLASHINFER_MEMBERS)


def read_site_packages(site_packages: Path, paths: tuple[str, ...]) -> dict[str, str]:
    """The text of those paths under an unpacked wheel (bytes kept exactly); absent ones left out."""
    return {p: (site_packages / p).read_bytes().decode("utf-8") for p in paths if (site_packages / p).is_file()}


def read_files(generation: Generation, paths: tuple[str, ...]) -> dict[str, str]:
    files: dict[str, str] = {}
    for root in site_packages(generation):
        files.update(read_site_packages(root, paths))
    return files


def target_files(patch_set: PatchSet, generation: Generation) -> dict[str, str]:
    return read_files(generation, files_needed(patch_set, generation.versions))


def wheel_member_sha256(path: str, generation: Generation) -> str:
    dist, version = ("sglang", generation.sglang) if path.startswith("sglang/") else \
        ("flashinfer-python", generation.flashinfer)
    from helpers.wheelcache import wheel_path

    with zipfile.ZipFile(wheel_path(dist, version)) as wheel:
        return hashlib.sha256(wheel.read(path)).hexdigest()


def changed_lines(old: str, new: str) -> tuple[list[int], list[int]]:
    """(lines of old replaced or deleted, lines of old after which lines were inserted), 1-based."""
    replaced, inserted_after = [], []
    matcher = difflib.SequenceMatcher(None, old.split("\n"), new.split("\n"), autojunk=False)
    for operation, first, last, _, _ in matcher.get_opcodes():
        if operation in ("replace", "delete"):
            replaced += range(first + 1, last + 1)
        elif operation == "insert":
            inserted_after.append(first)
    return replaced, inserted_after


def states(report) -> dict[str, State]:
    return {t.target: t.state for t in report.targets}


@pytest.mark.wheels
@pytest.mark.parametrize("generation", GENERATIONS, ids=IDS)
def test_enable_changes_exactly_the_gate_lines_and_disable_restores_the_wheel_bytes(patch_set, generation):
    files = target_files(patch_set, generation)
    before = check(patch_set, files, generation.versions, gpu_arch="sm120")
    assert states(before) == generation.states
    assert not before.conflicts

    enabled = enable(patch_set, files, generation.versions, gpu_arch="sm120")
    patched = {**files, **enabled.files}
    assert {path: changed_lines(files[path], text) for path, text in enabled.files.items()} == generation.changes
    record = PatchRecord.from_json(enabled.record.to_json(), "record.json")
    after = check(patch_set, patched, generation.versions, gpu_arch="sm120", record=record)
    applied = {name: State.APPLIED if state is A else state for name, state in generation.states.items()}
    assert states(after) == applied

    restored = disable(patch_set, patched, record)
    assert set(restored) == set(generation.changes)  # native files are not even rewritten with their own text
    for path, text in restored.items():
        assert sha256_text(text) == wheel_member_sha256(path, generation), path


@pytest.mark.wheels
@pytest.mark.parametrize("generation", GENERATIONS, ids=IDS)
def test_the_simulated_server_fuses_only_on_the_patched_files(patch_set, generation, tmp_path):
    """The sandbox's server reads the gates from the installed files (sandbox/sim/sglang_sim/upstream.py)."""
    files = target_files(patch_set, generation)
    enabled = enable(patch_set, files, generation.versions, gpu_arch="sm120")

    def outcome(tree: dict[str, str], root: Path) -> Fusion:
        for path, text in tree.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(text.encode("utf-8"))
        (root / "sglang").mkdir(exist_ok=True)
        upstream = InstalledUpstream(root / "sglang", root / "flashinfer", generation.sglang)
        return upstream.fusion_outcome(fusion_requested=True, compute_major=12)

    assert outcome(files, tmp_path / "base") is not Fusion.FUSED
    assert outcome({**files, **enabled.files}, tmp_path / "patched") is Fusion.FUSED


@pytest.mark.wheels
def test_a_hand_edited_gate_is_a_conflict_that_shows_the_lines_and_nothing_is_patched(patch_set):
    generation = GENERATIONS[4]
    files = target_files(patch_set, generation)
    edited = files[ADD_NORM].replace("(_is_sm90_supported or _is_sm100_supported)\n",
                                     "(_is_sm90_supported or _is_sm100_supported or True)\n")
    hand_edited = {**files, ADD_NORM: edited}

    report = check(patch_set, hand_edited, generation.versions, gpu_arch="sm120")
    [conflict] = report.conflicts
    assert conflict.target == "runtime-gate" and conflict.file == ADD_NORM
    assert re.search(r"^\s+146\s+\(_is_sm90_supported or _is_sm100_supported or True\)$", conflict.detail, re.M)
    with pytest.raises(PatchConflict, match="runtime-gate"):
        enable(patch_set, hand_edited, generation.versions, gpu_arch="sm120")
    variant = select_variants(patch_set, generation.versions)["runtime-gate"]
    with pytest.raises(PatchConflict, match="conflict, not absent; nothing written"):
        apply(variant, edited)


@pytest.mark.wheels
def test_our_text_without_our_record_or_changed_after_patching_is_a_conflict(patch_set):
    generation = GENERATIONS[3]
    files = target_files(patch_set, generation)
    enabled = enable(patch_set, files, generation.versions, gpu_arch="sm120")
    patched = {**files, **enabled.files}

    unrecorded = check(patch_set, patched, generation.versions, gpu_arch="sm120")
    assert {t.target for t in unrecorded.conflicts} == set(generation.states)
    assert "no record says sglang-deploy wrote it" in unrecorded.conflicts[0].detail
    with pytest.raises(PatchConflict):
        enable(patch_set, patched, generation.versions, gpu_arch="sm120")  # never patched twice

    touched = {**patched, COMMUNICATOR: patched[COMMUNICATOR] + "# local change\n"}
    report = check(patch_set, touched, generation.versions, gpu_arch="sm120", record=enabled.record)
    assert [t.target for t in report.conflicts] == ["runtime-gate"]
    assert "has changed since" in report.conflicts[0].detail
    with pytest.raises(PatchConflict, match="is not what sglang-deploy wrote"):
        disable(patch_set, touched, enabled.record)


@pytest.mark.wheels
def test_native_flashinfer_is_never_rewritten(patch_set):
    generation = GENERATIONS[4]
    files = target_files(patch_set, generation)
    variants = select_variants(patch_set, generation.versions)
    for name, path in (("jit-gate", JIT), ("header-gate", HEADER)):
        assert revert(variants[name], files[path], sha256_text(files[path])) == files[path]
        with pytest.raises(PatchConflict, match="native upstream"):
            revert(variants[name], files[path], "0" * 64)
        with pytest.raises(PatchConflict, match="native, not absent"):
            apply(variants[name], files[path])
    enabled = enable(patch_set, files, generation.versions, gpu_arch="sm120")
    assert not {JIT, HEADER} & set(enabled.files)
    assert {s.target for s in enabled.record.steps} == {"runtime-gate", "backend-resolver", "preflight-multicast"}


@pytest.mark.wheels
def test_audit_lists_the_bounds_an_sm120_build_meets(patch_set):
    new, old = GENERATIONS[4], GENERATIONS[0]
    report = audit(patch_set, read_files(new, audit_paths(patch_set)))
    found = {(b.file, b.line): b for b in report.bounds}
    assert found[(ADD_NORM, 146)].text.strip() == "(_is_sm90_supported or _is_sm100_supported)"
    assert found[(ADD_NORM, 146)].on["sm120"] is False
    assert found[(FUSION, 48)].on["sm120"] is False
    assert found[(JIT, 198)].on["sm120"] is True  # upstream [9, 10, 12]
    assert (JIT, 47) not in found  # the MNNVL module's [9, 10] is another module: outside the scanned function
    assert COMMUNICATOR in report.missing and ADD_NORM in report.scanned

    old_report = audit(patch_set, read_files(old, audit_paths(patch_set)))
    header_bounds = [b for b in old_report.bounds if b.file == HEADER and "__CUDA_ARCH__ < 1200" in b.text]
    assert [b.line for b in header_bounds] == HEADER_GATE_LINES
    assert all(b.on["sm120"] is False for b in header_bounds)
    assert any(line.startswith(f"{HEADER}:417: [FALSE on sm120]") for line in old_report.summary_lines())
    assert ("sglang/srt/server_args.py", 1691) in {(b.file, b.line) for b in old_report.bounds}  # the auto-enable


# ---------------------------------------------------------------------------------------------------------------
# Without wheels: version ranges, refusals, warnings, JIT cache, bad patch-set files.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "inside", "outside"), [
    (">=0.5.8.post1,<0.5.16", ["0.5.8.post1", "0.5.9", "0.5.15.post1"], ["0.5.8", "0.5.16", "0.5.16rc1"]),
    (">=0.6.17,<0.7.5", ["0.6.17", "0.7.2.post1", "0.7.4"], ["0.6.16.post4", "0.7.5"]),
    ("==0.5.23", ["0.5.23", "0.5.23.0"], ["0.5.23.post1"]),
])
def test_version_ranges_order_versions_like_pep_440(spec, inside, outside):
    version_range = VersionRange.parse(spec)
    assert all(version_range.contains(v) for v in inside)
    assert not any(version_range.contains(v) for v in outside)


def test_patch_sets_are_listed_from_the_roles():
    assert [p.name for p in list_patch_sets(ROLE.parent)] == ["fusion-sm120", "nsa-aliases"]


def test_unknown_versions_are_refused_naming_the_known_ranges(patch_set):
    with pytest.raises(ConfigError) as caught:
        select_variants(patch_set, {"sglang": "0.5.17", "flashinfer-python": "0.7.5"})
    message = str(caught.value)
    assert "runtime-gate: no variant for sglang 0.5.17" in message
    assert ">=0.5.8.post1,<0.5.16; >=0.5.20,<0.5.21; >=0.5.23,<0.5.24" in message
    assert "jit-gate: no variant for flashinfer-python 0.7.5" in message


def test_multi_node_and_other_gpus_are_refused(patch_set):
    versions = {"sglang": "0.5.23", "flashinfer-python": "0.7.2"}
    with pytest.raises(ConfigError, match=r"single-node only .* 2 nodes"):
        check(patch_set, {}, versions, gpu_arch="sm120", nnodes=2)
    with pytest.raises(PreflightError, match=r"the GPUs are sm100: .* nothing to patch"):
        check(patch_set, {}, versions, gpu_arch="sm100")


def test_a_venv_patched_by_another_set_is_refused(patch_set):
    """Input tried: the record of a venv patched by another set; enabling or disabling this one there would take the
    other set's patches away."""
    record = PatchRecord(patch_set="nsa-aliases", versions={"sglang": "0.5.23"}, base_venv="abc123")
    with pytest.raises(PreflightError, match="the venv is patched by nsa-aliases, not fusion-sm120"):
        check(patch_set, {}, {"sglang": "0.5.23", "flashinfer-python": "0.7.2"}, gpu_arch="sm120", record=record)


@pytest.mark.parametrize(("arch", "line", "is_python", "expected"), [
    ("sm120", "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))", False, False),
    ("sm90", "#if (defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && (__CUDA_ARCH__ < 1200))", False, True),
    ("sm100", "  if (SM == 90 || SM == 100) {", False, True),
    ("sm121", "    supported_major_versions=[9, 10, 12]", True, True),
    ("sm120", "if _is_sm90_supported or _is_sm100_supported:", True, False),
    ("sm100", "if _is_sm90_supported or _is_sm100_supported:", True, True),
    ("sm120", "if is_blackwell_supported() and is_sm12x():", True, True),
    ("sm100", "if is_blackwell_supported() and is_sm12x():", True, False),
    ("sm90", "major, _ = torch.cuda.get_device_capability()", True, None),
])
def test_the_audit_evaluates_bounds_for_the_architecture_named(arch, line, is_python, expected):
    assert GpuArch.parse(arch).evaluate(line, is_python) == (True, expected)


def test_warnings_follow_the_installed_versions(patch_set):
    old = active_warnings(patch_set, {"sglang": "0.5.9", "flashinfer-python": "0.6.3"})
    assert any("FlashInfer 0.6.3 is patched gate-only" in w and ">= 0.6.17" in w for w in old)
    new = active_warnings(patch_set, {"sglang": "0.5.23", "flashinfer-python": "0.7.2",
                                      "flashinfer-jit-cache": "0.7.2"})
    assert not any("gate-only" in w for w in new)
    assert any("flashinfer-jit-cache 0.7.2 is installed" in w for w in new)


def test_jit_cache_steps_delete_only_the_patched_module_of_that_version(patch_set):
    base = PurePosixPath("/opt/sglang-deploy/sglang/cache/abc123")
    [step] = clear_jit_cache_steps(patch_set, base, {"flashinfer-python": "0.6.3"})
    root = "/opt/sglang-deploy/sglang/cache/abc123/.cache/flashinfer/0.6.3"
    assert step.argv == ("find", root, "-mindepth", "3", "-maxdepth", "3", "-type", "d",
                         "-path", f"{root}/*/cached_ops/trtllm_comm", "-prune", "-exec", "rm", "-rf", "--", "{}", "+")


def test_host_files_travel_byte_exact_and_a_missing_one_is_a_fact(patch_set):
    site = PurePosixPath("/opt/sglang-deploy/sglang/venvs/abc123/lib/python3.11/site-packages")
    facts = file_facts({path: site / path for path in (JIT, HEADER)})
    assert facts[JIT].step.argv == ("base64", "-w", "0", "--", f"{site}/{JIT}") and facts[JIT].step.ok == ABSENT_OK
    text = "line one\r\nno newline at the end, and a tab\t"
    found = Readings([StepResult(facts[JIT].step, 0, base64.b64encode(text.encode()).decode() + "\n", "", 0.0),
                      StepResult(facts[HEADER].step, 1, "", f"base64: {site}/{HEADER}: No such file or directory\n",
                                 0.0)])
    assert (found.value(facts[JIT]), found.value(facts[HEADER])) == (text, None)
    latin1 = Readings([StepResult(facts[JIT].step, 0, base64.b64encode("caf\xe9".encode("latin-1")).decode(), "", 0)])
    with pytest.raises(PatchConflict, match=f"{JIT}: cannot read it as UTF-8 text"):
        latin1.value(facts[JIT])


def test_the_record_of_a_venv_is_read_as_a_fact_and_a_bad_one_names_its_file():
    venv = PurePosixPath("/opt/sglang-deploy/sglang/venvs/abc123")
    fact = record_fact(venv)
    assert fact.step.argv == ("cat", "--", f"{venv}/sglang-deploy-patches.json") and fact.step.ok == ABSENT_OK
    record = PatchRecord(patch_set="nsa-aliases", versions={"sglang": "0.5.23"}, base_venv="def456")
    assert Readings([StepResult(fact.step, 0, record.to_json(), "", 0.0)]).value(fact) == record
    assert Readings([StepResult(fact.step, 1, "", "No such file or directory", 0.0)]).value(fact) is None
    with pytest.raises(ConfigError, match=rf"{venv}/sglang-deploy-patches.json: patch_set: Field required"):
        Readings([StepResult(fact.step, 0, '{"versions": {}}', "", 0.0)]).value(fact)


def test_a_bad_record_is_a_config_error():
    with pytest.raises(ConfigError, match=r"record\.json: steps\.0\.sha256_after: Field required"):
        PatchRecord.from_json('{"patch_set": "x", "versions": {}, "steps": [{"target": "a", "file": "f", '
                              '"sha256_before": "0"}]}', "record.json")


def _edit(relative: str, old: str, new: str):
    def mutate(role: Path) -> None:
        path = role / relative
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return mutate


BAD_PATCH_SETS = [
    ("malformed-yaml", "targets/jit-gate.yaml", _edit("targets/jit-gate.yaml", "package: flashinfer-python",
                                                      "package: [flashinfer-python"), "invalid YAML"),
    ("unknown-key", "targets/header-gate.yaml", _edit("targets/header-gate.yaml", "        count: 13",
                                                      "        count: 13\n        replace_all: true"),
     "variants.0.edits.0.replace_all: unknown key"),
    ("overlapping-ranges", "targets/runtime-gate.yaml",
     _edit("targets/runtime-gate.yaml", '">=0.5.20,<0.5.21"', '">=0.5.15,<0.5.21"'),
     "variants: versions of variants 0 ('>=0.5.8.post1,<0.5.16') and 1 ('>=0.5.15,<0.5.21') overlap"),
    ("empty-gated-text", "targets/header-gate.yaml",
     _edit("targets/header-gate.yaml", f"      - gated: |\n          {HEADER_GATE}", '      - gated: ""\n'),
     "variants.0.edits.0.gated: text is empty"),
    ("bad-range", "targets/jit-gate.yaml", _edit("targets/jit-gate.yaml", '">=0.6.17,<0.7.5"', '"~=0.6.17"'),
     "variants.1.versions"),
    ("unknown-meta-key", "meta.yaml", _edit("meta.yaml", "single_node_only:", "single_node:"),
     "single_node: unknown key"),
    ("unknown-feature", "meta.yaml", _edit("meta.yaml", "enables_feature: allreduce_fusion", "enables_feature: fusion"),
     "enables_feature: 'fusion' is not a profile feature; features: cuda_graph, radix_cache, allreduce_fusion"),
    ("package-not-in-meta", "targets/jit-gate.yaml",
     _edit("meta.yaml", "packages: [sglang, flashinfer-python]", "packages: [sglang]"),
     "package: 'flashinfer-python' is not one of the packages in"),
    ("audit-without-architecture", "meta.yaml", _edit("meta.yaml", "applies_to: [sm120]\n", ""),
     "audit evaluates architecture bounds for applies_to"),
    ("missing-target-file", "meta.yaml", _edit("meta.yaml", "  - header-gate\n", "  - header-gate\n  - auto-enable\n"),
     "targets: 'auto-enable' has no file"),
]


@pytest.mark.parametrize(("bad_file", "mutate", "expected"), [case[1:] for case in BAD_PATCH_SETS],
                         ids=[case[0] for case in BAD_PATCH_SETS])
def test_a_bad_patch_set_names_the_file_and_the_key(tmp_path, bad_file, mutate, expected):
    role = tmp_path / "fusion-sm120"
    shutil.copytree(ROLE, role)
    mutate(role)
    with pytest.raises(ConfigError) as caught:
        load_patch_set(role)
    message = str(caught.value)
    assert str(role / bad_file) in message
    assert expected in message


def test_the_profile_of_a_patched_release_can_be_enabled_and_disabled_again() -> None:
    """Input tried: the profile recorded by a patched release (fusion on, name `glm5-nvfp4+fusion-sm120`), which
    patch-fusion now takes by default from the host's current release."""
    patch_set = load_patch_set(ROLE)
    plain = Project(ROLE.parent.parent).profile("glm5-nvfp4")
    patched = patched_profile(plain, patch_set)
    assert (patched.name, patched.profile.features.allreduce_fusion) == ("glm5-nvfp4+fusion-sm120", True)
    assert patched_profile(patched, patch_set) == patched
    assert base_profile(patched, patch_set) == plain


# ---------------------------------------------------------------------------------------------------------------
# nsa-aliases: a second patch set, for SGLang only, any GPU, no feature: the --nsa-* spellings of 0.5.15 - 0.5.19
# as deprecated aliases again on 0.5.20 - 0.5.23 (upstream removed them in 0.5.20).
# ---------------------------------------------------------------------------------------------------------------

NSA_ROLE = ROLE.parent / "nsa-aliases"
SERVER_ARGS = "sglang/srt/server_args.py"
SEED_FLAGS = ["--model-path", "/models/glm-5", "--nsa-decode-backend", "trtllm", "--nsa-prefill-backend", "trtllm"]
# version -> the state, and the lines of the wheel's server_args.py after which the import and the aliases go
NSA_GENERATIONS = {
    "0.5.8.post1": (N, []), "0.5.9": (N, []), "0.5.15": (N, []), "0.5.15.post1": (N, []), "0.5.19": (N, []),
    "0.5.20": (A, [53, 415]), "0.5.21": (A, [36, 352]), "0.5.22": (A, [36, 428]), "0.5.23": (A, [36, 442]),
}


@pytest.fixture(scope="module")
def nsa_aliases() -> PatchSet:
    return load_patch_set(NSA_ROLE)


def unpacked_sglang(version: str) -> Path:
    from helpers.wheelcache import unpacked

    return unpacked("sglang", version)


@pytest.mark.wheels
@pytest.mark.parametrize("version", list(NSA_GENERATIONS))
def test_nsa_aliases_insert_only_the_aliases_and_disable_restores_the_wheel_bytes(nsa_aliases, version, tmp_path):
    state, inserted_after = NSA_GENERATIONS[version]
    versions = {"sglang": version}
    root = unpacked_sglang(version)
    files = read_site_packages(root, files_needed(nsa_aliases, versions))
    assert states(check(nsa_aliases, files, versions, gpu_arch="sm90")) == {"deprecated-aliases": state}

    enabled = enable(nsa_aliases, files, versions, gpu_arch="sm120")  # any GPU: the set names no architecture
    assert {path: changed_lines(files[path], text) for path, text in enabled.files.items()} == (
        {SERVER_ARGS: ([], inserted_after)} if inserted_after else {})
    record = PatchRecord.from_json(enabled.record.to_json(), "record.json")
    after = check(nsa_aliases, {**files, **enabled.files}, versions, gpu_arch="sm120", record=record)
    assert states(after) == {"deprecated-aliases": State.APPLIED if state is A else state}
    restored = disable(nsa_aliases, {**files, **enabled.files}, record)
    generation = Generation(version, "", {})
    assert {path: sha256_text(text) for path, text in restored.items()} == {
        path: wheel_member_sha256(path, generation) for path in enabled.files}


@pytest.mark.wheels
@pytest.mark.parametrize("version", [v for v, (state, _) in NSA_GENERATIONS.items() if state is A])
def test_the_patched_sglang_accepts_the_seeds_nsa_flags_as_upstreams_deprecated_aliases(nsa_aliases, version,
                                                                                         tmp_path):
    """SGLang's own options, read from the patched file as preflight reads them
    (deploy_lib/host_scripts/sglang_options.py): unrecognized before, deprecated aliases of the --dsa-* flags (same
    dest, same choices) after."""
    versions = {"sglang": version}
    root = unpacked_sglang(version)
    files = read_site_packages(root, files_needed(nsa_aliases, versions))
    enabled = enable(nsa_aliases, files, versions, gpu_arch="sm120")
    patched = tmp_path / "site-packages"
    shutil.copytree(root, patched)
    (patched / SERVER_ARGS).write_bytes(enabled.files[SERVER_ARGS].encode("utf-8"))

    before, after = extract(root)["options"], extract(patched)["options"]
    assert [p.kind for p in check_argv(before, SEED_FLAGS)] == ["unrecognized", "unrecognized"]
    assert {(p.kind, p.severity) for p in check_argv(after, SEED_FLAGS)} == {("deprecated", "warning")}
    for stage in ("prefill", "decode"):
        alias, canonical = after[f"--nsa-{stage}-backend"], after[f"--dsa-{stage}-backend"]
        assert (alias["dest"], alias["action"], alias["deprecated"]) == (
            canonical["dest"], "DeprecatedAliasStoreAction", True)
        assert alias["choices"] == canonical["choices"] and "trtllm" in alias["choices"]
    assert [p.kind for p in check_argv(after, ["--model-path", "/m", "--nsa-decode-backend", "nsa"])] == [
        "deprecated", "invalid-choice"]


def test_a_patch_set_without_a_feature_renames_the_release_and_changes_no_setting(nsa_aliases):
    plain = Project(ROLE.parent.parent).profile("glm5-nvfp4")
    patched = patched_profile(plain, nsa_aliases)
    assert patched.name == "glm5-nvfp4+nsa-aliases" and patched.profile == plain.profile
    assert base_profile(patched, nsa_aliases) == plain


def test_nsa_aliases_name_no_gpu_and_refuse_versions_they_were_not_checked_on(nsa_aliases):
    assert refuse_unless_applicable(nsa_aliases, "sm90", nnodes=2) is None
    with pytest.raises(ConfigError, match=r"no variant for sglang 0\.5\.12 \(known: >=0\.5\.8\.post1,<0\.5\.10; "
                                          r">=0\.5\.15,<0\.5\.20; >=0\.5\.20,<0\.5\.22; >=0\.5\.23,<0\.5\.24; "
                                          r">=0\.5\.22,<0\.5\.23\)"):
        select_variants(nsa_aliases, {"sglang": "0.5.12"})


def test_a_patch_set_reads_the_versions_of_its_own_distributions(patch_set: PatchSet, nsa_aliases: PatchSet) -> None:
    """Its packages, what its warnings name and its JIT cache's distribution; torch, which neither set names, not."""
    assert distributions(patch_set) == ("flashinfer-jit-cache", "flashinfer-python", "sglang")
    assert distributions(nsa_aliases) == ("sglang",)


@pytest.mark.wheels
@pytest.mark.parametrize("generation", GENERATIONS, ids=IDS)
def test_a_venv_this_set_patched_already_serves_the_next_release_as_it_is(patch_set, generation):
    """A sweep's candidates on one patch set run one after another, so the second finds the current release on the
    set's patched venv; enabling the set again there conflicted (`nothing written: these targets are in neither the
    upstream nor the patched state`): it needs the record to know its own patched files."""
    files = target_files(patch_set, generation)
    enabled = enable(patch_set, files, generation.versions, gpu_arch="sm120")
    patched = {**files, **enabled.files}
    record = PatchRecord.from_json(enabled.record.to_json(), "record.json")
    layout = StoreLayout("sglang")
    installed = InstalledFacts(PurePosixPath("/x"), PurePosixPath("/x"), generation.versions, {}, {})
    venv_hash = "0123456789abcdef"
    context = PatchContext(layout=layout, venv=layout.venvs / venv_hash, venv_hash=venv_hash, installed=installed,
                           gpu_arch="sm120", compute_cap="12.0", files=patched, record=record, toolkit=None,
                           environment={})
    loaded = patched_profile(Project(ROLE.parent.parent).profile("glm5-nvfp4"), patch_set)
    report, venv = _reused_venv(patch_set, loaded, context, venv_hash)
    assert venv.path == str(layout.venvs / venv_hash) and not report.conflicts
    assert venv.environment == cache_environment(layout, venv_hash), "its own caches, warm from the last release"
    with pytest.raises(PatchConflict, match="neither the upstream nor the patched state"):
        enable(patch_set, patched, generation.versions, gpu_arch="sm120")
