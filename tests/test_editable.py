"""A source-checkout SGLang (an editable install) on this machine: the real 0.5.23 wheel's packages laid out as a
checkout (sandbox/source_tree.py), installed with `pip install -e` offline into a throw-away venv, with the real
FlashInfer 0.7.2 wheel beside it. The tool's own host-side scripts run with that venv's python, as on a host.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from helpers.wheelcache import wheel_path

from deploy_lib import patches
from deploy_lib.remote import StepResult
from deploy_lib.venvs import TREE_SCRIPT, InstalledFacts, installed_step, parse_installed
from sandbox import wheelhouse
from sandbox.source_tree import make_source_tree

pytestmark = pytest.mark.wheels
ROLES = Path(__file__).resolve().parent.parent / "roles"


def _run(*argv: str | Path) -> str:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, timeout=600).stdout


@pytest.fixture(scope="module")
def editable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkout, venv): sglang installed editable from the checkout, flashinfer-python as a wheel."""
    root = tmp_path_factory.mktemp("editable")
    checkout = make_source_tree(wheel_path("sglang", "0.5.23"), root / "sglang" / "python")
    venv = root / "ml-env"
    _run(sys.executable, "-m", "venv", venv)
    pip = (venv / "bin" / "python3", "-m", "pip", "install", "-q", "--no-deps", "--no-index",
           "--disable-pip-version-check")
    # setuptools >= 70.1 builds editable wheels by itself (older ones need the `wheel` package); offline, as a host
    _run(*pip, wheelhouse.download("setuptools"), wheel_path("flashinfer-python", "0.7.2"))
    _run(*pip, "--no-build-isolation", "-e", checkout)
    return checkout, venv


def _installed(venv: Path, patch_set: patches.PatchSet) -> InstalledFacts:
    step = installed_step(PurePosixPath(str(venv)), patches.distributions(patch_set),
                          patches.top_level_packages(patch_set))
    done = subprocess.run(step.argv, capture_output=True, text=True, timeout=60)
    return parse_installed(PurePosixPath(str(venv)), StepResult(step, done.returncode, done.stdout, done.stderr, 0.0))


def _read(installed: InstalledFacts, paths: tuple[str, ...]) -> dict[str, str]:
    """What the file facts read on a host, read here: each path at its real location."""
    return {path: Path(str(installed.location(path))).read_bytes().decode()
            for path in paths if Path(str(installed.location(path))).is_file()}


def test_setuptools_wrote_an_editable_finder_not_the_package(editable: tuple[Path, Path]) -> None:
    checkout, venv = editable
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert sorted(p.name for p in site.glob("__editable__*sglang*")) == [
        "__editable__.sglang-0.5.23.pth", "__editable___sglang_0_5_23_finder.py"]
    assert not (site / "sglang").exists()
    direct_url = json.loads((site / "sglang-0.5.23.dist-info" / "direct_url.json").read_text())
    assert direct_url["dir_info"] == {"editable": True} and direct_url["url"] == checkout.as_uri()


def test_files_are_followed_into_the_checkout_and_check_finds_the_gates(editable: tuple[Path, Path]) -> None:
    checkout, venv = editable
    patch_set = patches.load_patch_set(ROLES / "fusion-sm120")
    installed = _installed(venv, patch_set)
    assert installed.roots["sglang"] == PurePosixPath(str(checkout))
    assert installed.editable() == {"sglang": PurePosixPath(str(checkout))}
    assert installed.outside() == {"sglang": PurePosixPath(str(checkout))}
    assert installed.origins["sglang"].describe() == f"editable: {checkout}"
    assert installed.roots["flashinfer"] == installed.site_packages  # a plain wheel install
    paths = patches.files_needed(patch_set, installed.versions)
    report = patches.check(patch_set, _read(installed, paths), installed.versions, gpu_arch="sm120")
    states = {t.target: t.state for t in report.targets}
    assert not report.conflicts, report.summary_lines()
    assert states["runtime-gate"] is patches.State.ABSENT and states["jit-gate"] is patches.State.NATIVE


def test_enable_then_disable_restores_the_checkouts_bytes(editable: tuple[Path, Path]) -> None:
    checkout, venv = editable
    patch_set = patches.load_patch_set(ROLES / "fusion-sm120")
    installed = _installed(venv, patch_set)
    paths = patches.files_needed(patch_set, installed.versions)
    files = _read(installed, paths)
    enabled = patches.enable(patch_set, files, installed.versions, gpu_arch="sm120")
    assert enabled.files and all(path.startswith("sglang/") for path in enabled.files)
    reverted = patches.disable(patch_set, {**files, **enabled.files}, enabled.record)
    for path, text in reverted.items():
        assert text.encode() == (checkout / path).read_bytes()


def test_the_package_tree_is_copied_byte_exact_with_its_digest(editable: tuple[Path, Path], tmp_path: Path) -> None:
    checkout, venv = editable
    python = venv / "bin" / "python3"
    digest = json.loads(_run(python, "-I", "-c", TREE_SCRIPT, "digest", checkout / "sglang"))[str(checkout / "sglang")]
    copy = tmp_path / "site-packages" / "sglang"
    copy.parent.mkdir()
    _run(python, "-I", "-c", TREE_SCRIPT, "copy", checkout / "sglang", copy, digest)

    def tree(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert tree(copy) == tree(checkout / "sglang") and len(tree(copy)) > 4000
    # a checkout that changed since its digest was read is not copied
    refused = subprocess.run([str(python), "-I", "-c", TREE_SCRIPT, "copy", str(checkout / "sglang"), str(copy),
                              "0" * 64], capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1 and "changed while it was copied" in refused.stderr
    assert not copy.exists()
