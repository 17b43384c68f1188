"""nsa-aliases through SGLang's own argparse: the installed server_args module, executed as the server runs it
(sglang_sim.argcheck: `ServerArgs.add_cli_args(parser)`, with stand-ins for torch and the GPU stack), parses the seed's
launch flags on the patched file of each SGLang version the set patches, and refuses them on the wheel's own file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sglang_sim.argcheck import RESULT_MARKER

from deploy_lib.bundled import ROLES_DIR
from deploy_lib.patches import enable, files_needed, load_patch_set

pytestmark = pytest.mark.wheels

SEED_FLAGS = ["--model-path", "/models/glm-5", "--nsa-decode-backend", "trtllm", "--nsa-prefill-backend", "flashmla_kv"]


def parse(sim_venv: Path, sglang_tree: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The sim venv's python (msgspec, transformers) importing sglang from `sglang_tree` first."""
    return subprocess.run([str(sim_venv / "bin/python"), "-m", "sglang_sim.argcheck"], input=json.dumps(argv),
                          capture_output=True, text=True, timeout=300, cwd=sglang_tree.parent,
                          env={**os.environ, "PYTHONPATH": str(sglang_tree)})


def parsed(done: subprocess.CompletedProcess[str]) -> dict:
    line = next(line for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER))
    return json.loads(line[len(RESULT_MARKER):])


@pytest.mark.parametrize("version", ["0.5.20", "0.5.21", "0.5.22", "0.5.23"])
def test_the_patched_server_args_take_the_nsa_flags_with_upstreams_warning(sim_venv, version, tmp_path):
    from helpers.wheelcache import (
        unpacked,  # imported here: a pytest plugin imported before it is registered is not rewritten
    )

    patch_set = load_patch_set(ROLES_DIR / "nsa-aliases")
    wheel = unpacked("sglang", version)
    versions = {"sglang": version}
    files = {path: (wheel / path).read_bytes().decode("utf-8") for path in files_needed(patch_set, versions)}
    patched = tmp_path / "site-packages"
    shutil.copytree(wheel / "sglang", patched / "sglang")
    for path, text in enable(patch_set, files, versions, gpu_arch="sm120").files.items():
        (patched / path).write_bytes(text.encode("utf-8"))

    refused = parse(sim_venv, wheel, SEED_FLAGS)
    assert refused.returncode == 2
    assert "unrecognized arguments: --nsa-decode-backend trtllm --nsa-prefill-backend flashmla_kv" in refused.stderr

    accepted = parse(sim_venv, patched, SEED_FLAGS)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    namespace = parsed(accepted)
    assert (namespace["dsa_decode_backend"], namespace["dsa_prefill_backend"]) == ("trtllm", "flashmla_kv")
    assert "nsa_decode_backend" not in namespace  # the --dsa-* setting, no field of its own
    output = accepted.stdout + accepted.stderr
    assert ("'--nsa-decode-backend' is deprecated and will be removed in a future release. "
            "Use '--dsa-decode-backend' instead.") in output

    plain = parsed(parse(sim_venv, patched, ["--model-path", "/m"]))
    assert (plain["dsa_decode_backend"], plain["dsa_prefill_backend"]) == (None, None)  # the --dsa-* defaults stand
    bad = parse(sim_venv, patched, ["--model-path", "/m", "--nsa-decode-backend", "nsa"])
    assert bad.returncode == 2 and "invalid choice: 'nsa'" in bad.stderr
