"""sglang_options: option extraction from SGLang source (synthetic trees and the real wheels) and argv checking."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.sglang_options import SYNTHETIC, write_tree

from deploy_lib.host_scripts import sglang_options
from deploy_lib.host_scripts.sglang_options import extract
from deploy_lib.profile import load_profile
from deploy_lib.release.argv_check import build_parser, check_argv, find_option
from deploy_lib.release.server_args import sglang_args
from deploy_lib.versions import version_key

pytest_plugins = ("helpers.wheelcache",)  # the sglang_source fixture
EXTRACTOR = Path(sglang_options.__file__)

# ---------------------------------------------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------------------------------------------


def test_versions_order_as_pep440() -> None:
    ordered = ["0.5.5", "0.5.6.dev1", "0.5.6a1", "0.5.6rc2", "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.9",
               "0.5.15", "0.5.15.post1", "0.5.20", "0.5.23", "1.0"]
    assert sorted(reversed(ordered), key=version_key) == ordered
    assert version_key("0.5.0") == version_key("0.5")
    assert version_key("0.5.23+cu128") == version_key("0.5.23")
    assert version_key("0.5.15-post") == version_key("0.5.15.post0")  # PEP 440's implicit post number


@pytest.mark.parametrize("bad", ["", "latest", "0.5.x", "0.5.15-hotfix", "0..5"])
def test_version_rejects_non_versions(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a version"):
        version_key(bad)


# ---------------------------------------------------------------------------------------------------------------
# extraction from a synthetic tree covering every shape the real releases use
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def synthetic(tmp_path: Path) -> dict[str, Any]:
    return extract(write_tree(tmp_path, SYNTHETIC))


def test_extract_reads_versions_from_dist_info(synthetic: dict[str, Any]) -> None:
    assert synthetic["sglang_version"] == "9.9.9.post1"
    assert synthetic["flashinfer_version"] == "0.7.2"


def test_extract_follows_fields_namespaces_and_imported_choices(synthetic: dict[str, Any]) -> None:
    options = synthetic["options"]
    assert options["--tp-size"]["option_strings"] == ["--tp-size", "--tensor-parallel-size"]
    assert options["--tp-size"]["dest"] == "tp_size" and options["--tp-size"]["type"] == "int"
    assert "--not-a-flag" not in options and "--hidden" not in options
    assert options["--attention-backend"]["choices"] == ["fa3", "flashinfer", "triton", "trtllm_mha"]
    assert options["--cuda-graph-backend-decode"]["choices"] == ["disabled", "full"]
    assert options["--load-mode"]["choices"] == ["eager", "lazy"]
    assert options["--cuda-graph-bs"]["nargs"] == "+" and options["--cuda-graph-bs"]["type"] == "int"
    assert options["--enable-metrics"]["action"] == "store_true" and options["--enable-metrics"]["nargs"] == 0
    assert options["--enable-mm"]["option_strings"] == ["--enable-mm", "--no-enable-mm"]
    assert options["--lora-paths"]["nargs"] == "*" and options["--lora-paths"]["type"] == "str"
    assert options["--model-path"]["required"] is True and options["--host"]["required"] is False
    assert list(options).count("--port") == 1 and synthetic["warnings"] == []


def test_extract_resolves_helper_functions_and_reports_the_unresolvable(synthetic: dict[str, Any]) -> None:
    options = synthetic["options"]
    assert options["--reasoning-parser"]["choices"] == ["auto", "glm45", "qwen3"]  # the last return, no plugin
    assert options["--kv-mode"]["choices"] is None
    assert synthetic["unresolved_choices"] == ["--kv-mode"]


def test_extract_reads_custom_actions(synthetic: dict[str, Any]) -> None:
    options = synthetic["options"]
    assert options["--disable-cuda-graph"]["nargs"] == 0 and options["--disable-cuda-graph"]["deprecated"]
    assert options["--old-flag"]["error"] == "use --new-flag"
    assert options["--mono"]["nargs"] is None  # an explicit nargs=None beats the Action's default of 0
    assert options["--ratio"]["deprecated"] is False  # "(deprecated)" inside a help text is not a deprecation
    assert not options["--tp-size"]["deprecated"]


def test_extract_warns_when_a_flag_is_registered_twice(tmp_path: Path) -> None:
    files = dict(SYNTHETIC)
    files["sglang/srt/server_args.py"] += "\n" + textwrap.indent(textwrap.dedent("""
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--port", type=int)
                parser.add_argument("--port", type=str)
    """), "        ")
    result = extract(write_tree(tmp_path, files))
    assert result["warnings"] == ["--port registered twice (argparse would refuse to start); kept the first"]
    assert result["options"]["--port"]["type"] == "int"


def test_extractor_script_finds_the_sglang_its_interpreter_would_import(tmp_path: Path) -> None:
    """Preflight's form: `VENV/bin/python3 - < sglang_options.py`, no directory given, nothing imported."""
    root = write_tree(tmp_path, SYNTHETIC)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-"], input=EXTRACTOR.read_text(), env=env, capture_output=True,
                          text=True, check=True)
    result = json.loads(done.stdout)
    assert (result["sglang_version"], result["flashinfer_version"]) == ("9.9.9.post1", "0.7.2")
    assert result["options"] == json.loads(json.dumps(extract(root)["options"]))
    missing = subprocess.run([sys.executable, "-I", "-"], input=EXTRACTOR.read_text(), capture_output=True,
                             text=True, check=False)
    assert missing.returncode == 1 and "sglang is not installed for" in json.loads(missing.stdout)["error"]


def test_extractor_script_reports_a_missing_sglang_as_json(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-I", "-S", str(EXTRACTOR), str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1
    assert "server_args.py not found" in json.loads(done.stdout)["error"]


# ---------------------------------------------------------------------------------------------------------------
# check_argv on a hand-written option table, with argparse itself as the second opinion
# ---------------------------------------------------------------------------------------------------------------


def opt(*strings: str, nargs: Any = None, action: str = "store", choices: list[Any] | None = None,
        type: str | None = "str", required: bool = False, deprecated: bool = False, error: str | None = None
        ) -> dict[str, Any]:
    return {"option_strings": list(strings), "dest": strings[0].lstrip("-").replace("-", "_"), "action": action,
            "nargs": nargs, "choices": choices, "type": type, "required": required, "deprecated": deprecated,
            "error": error}


TABLE = {o["option_strings"][0]: o for o in [
    opt("--model-path", "--model", required=True),
    opt("--tp-size", "--tensor-parallel-size", type="int"),
    opt("--attention-backend", choices=["flashinfer", "triton"]),
    opt("--dsa-decode-backend", choices=["trtllm", "fa3"]),
    opt("--disable-radix-cache", nargs=0, action="store_true", type=None),
    opt("--disable-cuda-graph", nargs=0, action="DeprecatedStoreTrueAction", type=None, deprecated=True),
    opt("--old-flag", nargs=0, action="DeprecatedAction", type=None, error="use --new-flag instead"),
    opt("--cuda-graph-bs", nargs="+", type="int"),
    opt("--temperature", type="float"),
    opt("--enable-metrics", nargs=0, action="store_true", type=None),
    opt("--enable-mixed-chunk", nargs=0, action="store_true", type=None),
]}
OK = ["--model-path", "m"]

CASES: list[tuple[list[str], list[tuple[str, str]]]] = [
    ([*OK, "--tp-size", "8", "--attention-backend", "triton", "--disable-radix-cache"], []),
    ([*OK, "--tensor-parallel-size=8", "--cuda-graph-bs", "1", "2", "4", "--temperature", "-0.5"], []),
    (["--model", "m"], []),
    ([*OK, "--nsa-decode-backend", "trtllm"], [("unrecognized", "--nsa-decode-backend")]),
    ([*OK, "--tp", "8"], [("abbreviation", "--tp")]),
    ([*OK, "--enable-m", "--tp-size", "8"], [("ambiguous", "--enable-m")]),
    ([*OK, "--attention-backend", "nope"], [("invalid-choice", "nope")]),
    ([*OK, "--dsa-decode-backend=flashmla"], [("invalid-choice", "flashmla")]),
    ([*OK, "--tp-size", "eight"], [("invalid-type", "eight")]),
    ([*OK, "--tp-size"], [("missing-value", "--tp-size")]),
    ([*OK, "--tp-size", "--disable-radix-cache"], [("missing-value", "--tp-size")]),
    ([*OK, "--cuda-graph-bs"], [("missing-value", "--cuda-graph-bs")]),
    ([*OK, "--disable-radix-cache", "true"], [("unexpected-value", "true")]),
    ([*OK, "--disable-radix-cache=1"], [("unexpected-value", "--disable-radix-cache=1")]),
    ([*OK, "stray"], [("unrecognized", "stray")]),
    (["--tp-size", "8"], [("required", "--model-path")]),
    ([*OK, "--old-flag"], [("refused", "--old-flag")]),
    ([*OK, "--tp-size", "4", "--tp-size", "8"], [("duplicate", "--tp-size")]),
    ([*OK, "--help"], [("help", "--help")]),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(c[0][2:]) or "minimal" for c in CASES])
def test_check_argv_finds_what_argparse_rejects(argv: list[str], expected: list[tuple[str, str]]) -> None:
    problems = check_argv(TABLE, argv)
    assert [(p.kind, p.arg) for p in problems if p.severity == "error"] == expected
    argparse_accepts = _argparse_accepts(build_parser(TABLE), argv)
    # argparse itself takes abbreviations and repeated flags; we refuse them on purpose, everything else agrees.
    if {kind for kind, _ in expected} <= {"abbreviation", "duplicate"}:
        assert argparse_accepts
    else:
        assert not argparse_accepts


def _argparse_accepts(parser: argparse.ArgumentParser, argv: list[str]) -> bool:
    try:
        parser.parse_args(argv)
    except SystemExit:
        return False
    return True


def test_check_argv_messages_name_the_flag_and_the_fix() -> None:
    unknown, = check_argv(TABLE, [*OK, "--nsa-decode-backend", "trtllm"])
    assert unknown.message == "unrecognized arguments: --nsa-decode-backend trtllm (did you mean --dsa-decode-backend?)"
    abbreviation, = check_argv(TABLE, [*OK, "--tp", "8"])
    assert "abbreviation of --tp-size" in abbreviation.message
    choice, = check_argv(TABLE, [*OK, "--attention-backend", "nope"])
    assert choice.message == "argument --attention-backend: invalid choice: 'nope' (choose from 'flashinfer', 'triton')"


def test_check_argv_reports_deprecated_flags_as_warnings() -> None:
    problems = check_argv(TABLE, [*OK, "--disable-cuda-graph"])
    assert [(p.kind, p.severity) for p in problems] == [("deprecated", "warning")]


def test_check_argv_leaves_unresolved_choices_unchecked() -> None:
    table = {**TABLE, "--kv-mode": opt("--kv-mode", choices=None)}
    assert check_argv(table, [*OK, "--kv-mode", "anything"]) == []


# ---------------------------------------------------------------------------------------------------------------
# the real wheels
# ---------------------------------------------------------------------------------------------------------------

VERSIONS = ["0.5.9", "0.5.15.post1", "0.5.20", "0.5.23"]


@pytest.fixture(scope="session")
def options_of(sglang_source: Callable[[str], Path]) -> Callable[[str], dict[str, Any]]:
    cache: dict[str, dict[str, Any]] = {}

    def get(version: str) -> dict[str, Any]:
        if version not in cache:
            cache[version] = extract(sglang_source(version))
        return cache[version]

    return get


@pytest.mark.wheels
@pytest.mark.parametrize("version", VERSIONS)
def test_real_wheel_extracts_cleanly(options_of: Callable[[str], dict[str, Any]], version: str) -> None:
    result = options_of(version)
    assert result["sglang_version"] == version
    assert result["warnings"] == []
    # Only the canary's enum comprehension stays unchecked; the parser choices (registries) resolve.
    assert set(result["unresolved_choices"]) <= {"--kv-canary-real-data"}
    assert "glm47" in find_option(result["options"], "--tool-call-parser")["choices"]
    assert "glm45" in find_option(result["options"], "--reasoning-parser")["choices"]


@pytest.mark.wheels
def test_real_wheel_0523_matches_its_parser(options_of: Callable[[str], dict[str, Any]]) -> None:
    """Facts read from the real 0.5.23 parser, ServerArgs.add_cli_args (532 options with -h)."""
    options = options_of("0.5.23")["options"]
    assert len(options) == 531
    assert find_option(options, "--fp8-gemm-backend")["choices"] == [
        "aiter", "auto", "cutlass", "deep_gemm", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_deepgemm",
        "flashinfer_trtllm", "triton"]
    assert find_option(options, "--fp8-gemm-backend")["dest"] == "fp8_gemm_runner_backend"
    assert find_option(options, "--dsa-decode-backend")["choices"] == [
        "aiter", "fa3", "flashinfer_sparse_mla", "flashmla_auto", "flashmla_kv", "flashmla_sparse",
        "flashmla_sparse_q8", "intel_xpu", "tilelang", "triton", "trtllm"]
    assert find_option(options, "--dsa-prefill-backend")["choices"] == sorted(
        find_option(options, "--dsa-decode-backend")["choices"] + ["triton_sparse_mla"])
    assert find_option(options, "--kv-cache-dtype")["choices"] == [
        "auto", "bf16", "bfloat16", "fp4_mx_block16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4"]
    assert find_option(options, "--flashinfer-allreduce-fusion-backend")["choices"] == [
        "auto", "cutedsl", "mnnvl", "trtllm"]
    assert find_option(options, "--cuda-graph-backend-decode")["choices"] == ["breakable", "disabled", "full"]
    assert len(find_option(options, "--attention-backend")["choices"]) == 25
    assert find_option(options, "--model")["dest"] == "model_path"
    assert find_option(options, "--tp-size")["option_strings"] == ["--tp-size", "--tensor-parallel-size"]
    assert find_option(options, "--nsa-decode-backend") is None
    assert find_option(options, "--disable-cuda-graph")["deprecated"]
    assert find_option(options, "--enable-flashinfer-allreduce-fusion")["deprecated"]


@pytest.mark.wheels
def test_real_wheel_059_matches_its_parser(options_of: Callable[[str], dict[str, Any]]) -> None:
    options = options_of("0.5.9")["options"]
    assert find_option(options, "--nsa-decode-backend")["choices"] == [
        "aiter", "fa3", "flashmla_auto", "flashmla_kv", "flashmla_sparse", "tilelang", "trtllm"]
    assert find_option(options, "--fp8-gemm-backend")["choices"] == [
        "aiter", "auto", "cutlass", "deep_gemm", "flashinfer_deepgemm", "flashinfer_trtllm", "triton"]
    assert find_option(options, "--kv-cache-dtype")["choices"] == [
        "auto", "bf16", "bfloat16", "fp4_e2m1", "fp8_e4m3", "fp8_e5m2"]
    assert find_option(options, "--dsa-decode-backend") is None
    assert not find_option(options, "--disable-cuda-graph")["deprecated"]


@pytest.mark.wheels
def test_extractor_runs_standalone_on_the_stdlib(sglang_source: Callable[[str], Path],
                                                 options_of: Callable[[str], dict[str, Any]]) -> None:
    """As preflight runs it on the host: `python3 - SITE_PACKAGES` with the file on stdin, no site-packages."""
    root = sglang_source("0.5.23")
    by_path = subprocess.run([sys.executable, "-I", "-S", str(EXTRACTOR), str(root)], capture_output=True,
                             text=True, check=True)
    by_stdin = subprocess.run([sys.executable, "-I", "-S", "-", str(root)], input=EXTRACTOR.read_text(),
                              capture_output=True, text=True, check=True)
    assert by_path.stdout == by_stdin.stdout
    assert json.loads(by_path.stdout) == json.loads(json.dumps(options_of("0.5.23")))


@pytest.mark.wheels
def test_check_argv_agrees_with_argparse_on_every_prefix_of_the_reference_flags(
        options_of: Callable[[str], dict[str, Any]]) -> None:
    """On the real 0.5.23 table (559 option strings), each shortened flag is either a unique prefix (argparse takes
    it, we flag the abbreviation), ambiguous, or unknown; check_argv and argparse must agree on which."""
    options = options_of("0.5.23")["options"]
    parser = build_parser(options)
    profiles = Path(__file__).resolve().parent.parent / "inventory" / "profiles"
    base = list(sglang_args(load_profile(profiles, "glm5-nvfp4-fusion").profile, "0.5.23"))
    kinds_seen: set[str] = set()
    for at, flag in enumerate(base):
        for cut in range(3, len(flag) if flag.startswith("--") else 0):
            argv = [*base[:at], flag[:cut], *base[at + 1:]]
            errors = {p.kind for p in check_argv(options, argv) if p.severity == "error"}
            kinds_seen |= errors
            assert _argparse_accepts(parser, argv) == (errors <= {"abbreviation"}), argv
    assert {"abbreviation", "ambiguous"} <= kinds_seen
