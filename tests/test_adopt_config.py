"""`invoke adopt` of a server SGLang's docs launch from a YAML file (`--config FILE`): the file read on the host,
merged as SGLang 0.5.23 merges it (checked against the wheel's own ConfigArgumentMerger), the adopted profile
rendering the same launch as one adopted from flags."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.adopt import HAND_0523, hand, reference_as_hand_launched
from helpers.fake_remote import FakeRemote

from deploy_lib.commands.adopt import _config_merged
from deploy_lib.errors import PreflightError
from deploy_lib.facts.hand_process import adopt_profile, split_launch
from deploy_lib.facts.sglang_config import STEP_CONFIG, config_arguments, config_path
from deploy_lib.release.server_args import sglang_args

pytest_plugins = ("helpers.wheelcache",)
# The reference launch split as SGLang's docs show it: most options in the file, a few on the command line; the
# file's tp-size 4 is overridden by `--tp 8` on the command line (command-line flags win).
SERVER_YAML = """\
model-path: lukealonso/GLM-5-NVFP4
served-model-name: glm-5
reasoning-parser: glm45
tool-call-parser: glm47
trust-remote-code: true
tp-size: 4
mem-fraction-static: 0.92
max-running-requests: 1024
kv-cache-dtype: auto
quantization: modelopt_fp4
attention-backend: flashinfer
fp8-gemm-backend: cutlass
dsa-decode-backend: trtllm
dsa-prefill-backend: trtllm
moe-runner-backend: flashinfer_cutlass
disable-radix-cache: true
enable-metrics: false
"""
HAND_CONFIG = ["python", "-m", "sglang.launch_server", "--config", "configs/server.yaml", "--tp", "8",
               "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
               "--host", "0.0.0.0", "--port", "8000"]
CONFIG_ON_HOST = "/root/configs/server.yaml"  # the process runs in /root (test_adopt.hand)


def upstream_merger(sglang_source: Callable[[str], Path], version: str, records: dict[str, Any],
                    every_action: bool = False) -> Any:
    """SGLang's own ConfigArgumentMerger from the wheel, over a parser with the wheel's store and store_true
    options (its module imports only the standard library and yaml); `every_action`: its other options too, each
    an argparse.Action subclass of its recorded name and nargs, as SGLang's own are."""
    path = sglang_source(version) / "sglang" / "srt" / "utils" / "server_args_config_parser.py"
    if not path.exists():
        path = path.parent.parent / path.name  # srt/ before 0.5.19
    spec = importlib.util.spec_from_file_location("sglang_config_parser", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = argparse.ArgumentParser()
    for record in records.values():
        strings = record["option_strings"]
        if record["action"] in ("store", "store_true"):
            parser.add_argument(*strings, dest=record["dest"], action=record["action"])
        elif not every_action or "--config" in strings:
            continue
        elif record["action"] == "BooleanOptionalAction":
            parser.add_argument(*[s for s in strings if not s.startswith("--no-")], dest=record["dest"],
                                action=argparse.BooleanOptionalAction)
        else:
            action = type(record["action"], (argparse.Action,), {"__call__": lambda *_: None})
            parser.add_argument(*strings, dest=record["dest"], action=action, nargs=record["nargs"])
    return module.ConfigArgumentMerger(parser)


@pytest.mark.wheels
@pytest.mark.parametrize("text", [SERVER_YAML, "tp_size: 2\nenable_metrics: true\ncuda-graph-bs-decode: [1, 2]\n"
                                               "json-model-override-args: {x: 1}\nchunked-prefill-size: null\n"
                                               "trust-remote-code: false\n", ""])
@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_files_arguments_are_those_sglangs_own_merger_makes(options, sglang_source, text: str,
                                                                  version: str) -> None:
    """Input tried: the reference launch as a file; keys with `_`, a list, a mapping (0.5.9 passes its `str()`,
    0.5.23 its JSON), a null and false switches; an empty file."""
    import yaml
    merger = upstream_merger(sglang_source, version, options(version))
    expected = merger._convert_config_to_args(yaml.safe_load(text) or {})
    assert config_arguments(text, options(version), "/x.yaml", "gpu1", version) == expected


@pytest.mark.wheels
def test_a_server_started_from_a_config_file_is_adopted_as_one_started_with_flags(options) -> None:
    """Input tried: `python -m sglang.launch_server --config configs/server.yaml --tp 8 ...` run from /root, the
    file giving tp-size 4 (failed before: the file was not read, the profile had only the command line's flags)."""
    remote = FakeRemote().reply(("cat", "--", CONFIG_ON_HOST), stdout=SERVER_YAML)
    process = hand(HAND_CONFIG)
    launch = split_launch(process, "gpu1")
    merged = _config_merged(remote, launch.args, process.cwd, options("0.5.23"), "gpu1", "0.5.23")
    assert remote.ran_names() == [STEP_CONFIG], "the file is read on the host, from the server's directory"
    result = adopt_profile(process, launch, "/root/ml-env", options("0.5.23"), "0.5.23", "adopted", "sglang", merged)
    from_flags = adopt_profile(hand(HAND_0523), split_launch(hand(HAND_0523), "gpu1"), "/root/ml-env",
                               options("0.5.23"), "0.5.23", "adopted")
    reference = reference_as_hand_launched()
    assert result.profile.parallel.tp == 8, "the command line's --tp 8 wins over the file's tp-size 4"
    assert sglang_args(result.profile, "0.5.23") == sglang_args(from_flags.profile, "0.5.23") == \
        sglang_args(reference, "0.5.23")
    assert result.profile.extra_args == []
    assert result.launch_args == tuple(HAND_CONFIG[3:]), "release 0 runs the command as written, file and all"


def test_without_the_token_config_nothing_is_read() -> None:
    """SGLang merges only for the token `--config` (prepare_server_args: `"--config" in argv`)."""
    assert config_path(("--config=/x.yaml", "--port", "1"), "/root") is None
    assert config_path(("--config", "../etc/s.yaml"), "/root/run") == "/root/etc/s.yaml"
    remote = FakeRemote()
    assert _config_merged(remote, ("--port", "1"), "/root", {}, "gpu1", "0.5.23") is None and remote.batches == []


@pytest.mark.parametrize(("stdout", "exit_code", "says"), [
    ("", 1, "--config file /root/configs/server.yaml cannot be read now: cat: /root/configs/server.yaml: No such"),
    ("- a\n- b\n", 0, "does not hold a mapping at its top level"),
    ("a: [\n", 0, "/root/configs/server.yaml is not YAML"),
])
def test_a_config_file_gone_or_not_a_mapping_is_refused_naming_it(stdout: str, exit_code: int, says: str) -> None:
    """Input tried: the file removed since the server started; a YAML list; broken YAML."""
    remote = FakeRemote().reply(("cat", "--", CONFIG_ON_HOST), stdout=stdout, exit_code=exit_code,
                                stderr="cat: /root/configs/server.yaml: No such file or directory" if exit_code else "")
    with pytest.raises(PreflightError, match=says):
        _config_merged(remote, tuple(HAND_CONFIG[3:]), "/root", {}, "gpu1", "0.5.23")
    assert all(step.name == STEP_CONFIG for batch in remote.batches for step in batch), "nothing but the read"


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.5.9", "0.5.15", "0.5.20", "0.5.23"])
def test_a_key_sglang_refuses_in_a_config_file_is_refused_naming_the_file_and_key(
        options, sglang_source, version: str) -> None:
    """Input tried: every option of the wheel, one key at a time, in each spelling (`lora-paths: [a]`,
    `disable-cuda-graph: true` ...). Accepted before whatever its action; SGLang's own merger refuses those it does
    not turn into arguments ('Unsupported config option'), and which those are changed in 0.5.23."""
    import yaml
    records = options(version)
    merger = upstream_merger(sglang_source, version, records, every_action=True)
    refused_by_sglang, refused_here = set(), set()
    for record in records.values():
        for key in {record["dest"]} | {s[2:] for s in record["option_strings"] if s.startswith("--")}:
            text = f"{key}: {'true' if record['nargs'] == 0 else '1'}\n"
            try:
                merger._convert_config_to_args(yaml.safe_load(text))
            except ValueError:
                refused_by_sglang.add(key)
            try:
                config_arguments(text, records, "/root/s.yaml", "gpu1", version)
            except PreflightError as err:
                assert str(err).startswith(f"gpu1: the server's --config file /root/s.yaml: {key}: SGLang {version} "
                                           "does not take this option from a config file"), err
                refused_here.add(key)
    assert refused_here == refused_by_sglang
    assert refused_here, "each version refuses some (lora-paths at least)"


@pytest.mark.parametrize("name", ["configs/server.json", "configs/server.toml", "configs/server", "server.yaml.bak"])
def test_a_config_file_sglang_refuses_by_its_name_is_refused_before_it_is_read(name: str) -> None:
    """Input tried: `--config configs/server.json` (SGLang: 'Config file must be YAML format, got: .json'); it was
    read and adopted."""
    remote = FakeRemote()
    args = ("--config", name, "--port", "8000")
    with pytest.raises(PreflightError, match=f"--config file /root/{name}: SGLang reads only a .yaml or .yml file"):
        _config_merged(remote, args, "/root", {}, "gpu1", "0.5.23")
    assert remote.batches == [], "nothing is read"


@pytest.mark.parametrize("name", ["s.yaml", "s.yml", "S.YAML"])
def test_a_yaml_name_in_any_case_is_read(name: str) -> None:
    remote = FakeRemote().reply(("cat", "--", f"/root/{name}"), stdout="port: 8000\n")
    assert _config_merged(remote, ("--config", name), "/root", {}, "gpu1", "0.5.23") == ("--port", "8000")
