"""The per-venv JIT and compile caches (deploy_lib/venvs/caches.py) against what the real wheels read.

The wheel tests (marker `wheels`) read each cited file out of its published wheel through the shared wheel cache
(tests/helpers/wheelcache.py) and skip when a wheel is neither cached nor downloadable (no network)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from deploy_lib.store import StoreLayout
from deploy_lib.venvs import cache_dir_steps, cache_environment
from deploy_lib.venvs.caches import CACHE_VARIABLES, CACHES, SGLANG_NEW, SGLANG_OLD, CacheVariable, ReadBy

pytest_plugins = ("helpers.wheelcache",)

LAYOUT = StoreLayout("sglang", root=PurePosixPath("/opt/sglang-deploy"))


def test_every_cache_has_a_directory_of_its_own_under_the_venvs_cache_and_is_created_for_its_user() -> None:
    assert len({cache.name for cache in CACHES}) == len({cache.subdir for cache in CACHES}) == len(CACHES)
    environment = cache_environment(LAYOUT, "0123456789abcdef")
    base = "/opt/sglang-deploy/sglang/cache/0123456789abcdef"
    assert environment == {cache.name: f"{base}/{cache.subdir}" for cache in CACHES}
    made, owned = cache_dir_steps(LAYOUT, "0123456789abcdef", "sglang")
    assert set(made.argv[3:]) == set(owned.argv[3:]) == {base, *environment.values()}
    # what issue 41 asked beyond FlashInfer, Triton, TorchInductor and bytecode: DeepGEMM's, SGLang's own, TVM-FFI's
    assert {"SGLANG_DG_CACHE_DIR", "SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "TVM_FFI_CACHE_DIR"} <= set(environment)


def test_every_variable_but_the_interpreters_own_cites_the_wheels_that_read_it() -> None:
    for cache in CACHES:
        assert cache.read_by or cache.name == "PYTHONPYCACHEPREFIX", cache.name
    cited = {(read.dist, read.version) for cache in CACHES for read in cache.read_by}
    assert {("sglang", SGLANG_NEW), ("sglang", SGLANG_OLD)} <= cited


def test_the_interpreter_keeps_bytecode_where_pythonpycacheprefix_says(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; print(sys.pycache_prefix)"], capture_output=True,
                          text=True, check=True, env={"PYTHONPYCACHEPREFIX": str(tmp_path)})
    assert done.stdout.strip() == str(tmp_path)


def _wheel_file(dist: str, version: str, path: str) -> str:
    from helpers.wheelcache import unpacked

    try:
        root = unpacked(dist, version, members=(path,))
    except RuntimeError as error:  # not cached and not downloadable here (no network)
        pytest.skip(f"{dist}=={version} is not available: {str(error).splitlines()[0]}")
    return (root / path).read_text()


def _cited_lines(read: ReadBy) -> list[int]:
    """The line numbers a citation names: "66-68", "2320 third_party_cache_defaults", "682, 933"."""
    numbers: list[int] = []
    for first, last in re.findall(r"(\d+)(?:-(\d+))?", read.lines):
        numbers += range(int(first), int(last or first) + 1)
    return numbers


CITATIONS = [pytest.param(cache, read, id=f"{cache.name}-{read.dist}-{read.version}-{read.path.rsplit('/', 1)[-1]}")
             for cache in CACHES for read in cache.read_by]


@pytest.mark.wheels
@pytest.mark.parametrize(("cache", "read"), CITATIONS)
def test_each_cited_wheel_file_reads_the_variable_at_the_cited_lines(cache: CacheVariable, read: ReadBy) -> None:
    lines = _wheel_file(read.dist, read.version, read.path).splitlines()
    cited = [lines[number - 1] for number in _cited_lines(read) if number <= len(lines)]
    # read as a string (os.getenv, os.environ[...], a dict key) or as SGLang's typed envs attribute
    uses = re.compile(rf"""["']{cache.name}["']|envs\.{cache.name}\b|^\s+{cache.name} = Env""")
    assert any(uses.search(line) for line in cited), (cache.name, read, cited)


@pytest.mark.wheels
def test_every_cache_sglang_0_5_23_moves_to_its_cache_dir_is_kept_per_venv() -> None:
    """SGLang 0.5.23's own list of third-party caches (environ.py third_party_cache_defaults), and each *_CACHE_DIR
    setting of its environ.py: each one is ours, or defaults below SGLANG_CACHE_DIR (which is ours)."""
    source = _wheel_file("sglang", SGLANG_NEW, "sglang/srt/environ.py")
    tree = ast.parse(source)
    defaults = next(node for node in ast.walk(tree)
                    if isinstance(node, ast.FunctionDef) and node.name == "third_party_cache_defaults")
    returned = next(node.value for node in ast.walk(defaults) if isinstance(node, ast.Return))
    assert isinstance(returned, ast.Dict)
    theirs = {key.value for key in returned.keys if isinstance(key, ast.Constant)}
    assert theirs and theirs <= set(CACHE_VARIABLES), theirs - set(CACHE_VARIABLES)
    settings = re.findall(r"^\s+([A-Z0-9_]*CACHE_DIR) = (EnvStr\(.*\))$", source, re.MULTILINE)
    assert len(settings) >= 4
    for name, default in settings:
        assert name in CACHE_VARIABLES or "_default_cache_subdir(" in default, (name, default)


@pytest.mark.wheels
@pytest.mark.parametrize("version", [SGLANG_NEW, SGLANG_OLD])
def test_sglang_sets_deepgemms_own_variable_from_its_own_so_that_one_is_kept_per_venv(version: str) -> None:
    """DG_JIT_CACHE_DIR is left out of the list: SGLang overwrites it from SGLANG_DG_CACHE_DIR on import."""
    source = _wheel_file("sglang", version, "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py")
    assignment = re.search(r"""os\.environ\["DG_JIT_CACHE_DIR"\] = (.*?)\n(?:\S|\n)""", source, re.DOTALL)
    assert assignment and "SGLANG_DG_CACHE_DIR" in assignment.group(1)
    assert "DG_JIT_CACHE_DIR" not in CACHE_VARIABLES
