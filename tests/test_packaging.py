"""A non-editable `pip install .` is a working install: it renders a release, finds the patch sets and reads the venv
host scripts without the checkout (templates/ and roles/ travel inside the wheel as deploy_lib/templates and
deploy_lib/roles, the host scripts as files of deploy_lib/venvs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# Runs in a directory outside the checkout, with only the installed copy of deploy_lib importable from the repo side.
RENDER_FROM_INSTALL = """
import json, sys
from pathlib import Path, PurePosixPath
import deploy_lib
from deploy_lib.bundled import ROLES_DIR, TEMPLATES_DIR
from deploy_lib.patches import list_patch_sets
from deploy_lib.profile import load_profile
from deploy_lib.release.model import build_release
from deploy_lib.store import StoreLayout
from deploy_lib.venvs.host_scripts import RELOCATE_SCRIPT
from deploy_lib.gpu_check.p2p.measure import SCRIPT_SOURCE as P2P_MEASURE_SCRIPT

loaded = load_profile(Path(sys.argv[1]), "glm5-nvfp4")
release = build_release(loaded, StoreLayout(service="sglang", root=PurePosixPath("/opt/sglang-deploy")), "0.5.23", {})
print(json.dumps({"package": deploy_lib.__file__, "templates": str(TEMPLATES_DIR), "roles": str(ROLES_DIR),
                  "unit": release.unit_text, "env": release.env_text, "launcher": release.launcher_text,
                  "patch_sets": [p.name for p in list_patch_sets(ROLES_DIR)], "relocate_script": RELOCATE_SCRIPT,
                  "p2p_measure_script": P2P_MEASURE_SCRIPT}))
"""


def test_a_non_editable_install_renders_and_lists_the_patch_sets(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", RENDER_FROM_INSTALL, str(REPO / "inventory" / "profiles")],
                          cwd=elsewhere, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert Path(result["package"]).is_relative_to(site)
    assert Path(result["templates"]) == site / "deploy_lib" / "templates"
    assert Path(result["roles"]) == site / "deploy_lib" / "roles"
    assert "ExecStart=/opt/sglang-deploy/sglang/current/launch" in result["unit"]
    assert "exec /root/ml-env/bin/python3 -m sglang.launch_server" in result["launcher"]
    assert 'CUDA_HOME="/usr/local/cuda-12.8"' in result["env"]
    assert result["patch_sets"] == ["fusion-sm120", "nsa-aliases"]
    assert result["relocate_script"] == (REPO / "deploy_lib" / "host_scripts" / "venv_relocate.py").read_text()
    assert result["p2p_measure_script"] == (REPO / "deploy_lib" / "host_scripts" / "p2p_measure.py").read_text()


def test_in_a_fresh_venv_the_installed_command_starts_a_project_renders_it_and_lists_only_user_tasks(
        tmp_path: Path) -> None:
    """`pip install .` (not editable) into a new venv, then in an empty directory: `sglang-deploy init --example
    glm5-nvfp4`, `render --profile glm5-nvfp4`, `--list`; init again refuses to overwrite; in another, the README's
    `init --model Qwen/Qwen3-8B --gpus 1 --host 192.0.2.10` and `render qwen3-8b`. Failed before: the installed command
    found no tasks (`Can't find any collection named 'tasks'!`, exit 1) and had no init."""
    import sysconfig
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True,
                                  text=True).stdout.strip())
    # the dependencies (fabric, invoke, pydantic...) from this interpreter, appended after the venv's own packages
    (purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", str(REPO)], check=True, capture_output=True, text=True, timeout=600)
    project = tmp_path / "mine"
    project.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_DEPLOY_", "PYTHON"))}

    def command(*argv: str, cwd: Path = project) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "sglang-deploy"), *argv], cwd=cwd, env=environ,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    started = command("init", "--example", "glm5-nvfp4")
    assert started.returncode == 0, started.stderr
    assert {path.relative_to(project).as_posix() for path in project.rglob("*") if path.is_file()} == {
        "inventory/hosts.yaml", "inventory/profiles/glm5-nvfp4.yaml", ".gitignore"}
    rendered = command("render", "--profile", "glm5-nvfp4")
    assert rendered.returncode == 0, rendered.stderr
    assert "--tp-size" in rendered.stdout and "ExecStart=/opt/sglang-deploy/sglang/current/launch" in rendered.stdout
    listed = command("--list")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert {"deploy", "rollback", "render", "init", "patch-fusion", "router.deploy", "venv.build"} <= names
    assert not {name for name in names if name.startswith(("sandbox", "demo"))}
    again = command("init", "--example", "glm5-nvfp4")
    assert again.returncode == 2 and "overwrites nothing" in again.stderr
    assert "hosts.yaml" in again.stderr
    mine = tmp_path / "qwen"
    mine.mkdir()
    asked = command("init", cwd=mine)
    assert asked.returncode == 2 and "--model" in asked.stderr and not any(mine.iterdir())
    started = command("init", "--model", "Qwen/Qwen3-8B", "--gpus", "1", "--host", "192.0.2.10", cwd=mine)
    assert started.returncode == 0, started.stderr
    assert "SGLang installed in a virtual environment at /root/ml-env" in started.stdout
    rendered = command("render", "qwen3-8b", cwd=mine)
    assert rendered.returncode == 0, rendered.stderr
    assert "--model-path Qwen/Qwen3-8B" in rendered.stdout and "--tp-size 1" in rendered.stdout
    pages = command("docs", cwd=mine)
    assert pages.returncode == 0, pages.stderr
    assert pages.stdout.splitlines()[0].split() == ["index", "sglang-deploy"]
    assert {line.split()[0] for line in pages.stdout.splitlines()[:-1]} == {page.stem for page in DOCS.glob("*.md")}
    shown = command("docs", "troubleshooting", cwd=mine)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (DOCS / "troubleshooting.md").read_text()
    where = command("docs", "--path", cwd=mine)
    assert Path(where.stdout.strip()).is_relative_to(venv) and Path(where.stdout.strip()).name == "guide"
    unknown = command("docs", "troubleshoting", cwd=mine)
    assert unknown.returncode == 2 and "did you mean `troubleshooting`?" in unknown.stderr


def test_the_wheel_builds_without_warnings_and_carries_the_readme_and_only_the_example_profile(tmp_path: Path) -> None:
    """Failed before: every build warned `Package 'deploy_lib.starter.profiles' is absent from the packages
    configuration`, and the wheel's metadata had no description (no `readme` in pyproject.toml). The guide's pages
    travel too (`sglang-deploy docs`); the build leaves no build/ or *.egg-info in the source tree (it wrote both, and
    a stale build/lib put files deleted from the source into the next wheel)."""
    import zipfile
    before = {path.name for path in REPO.iterdir()}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--verbose", "--wheel-dir",
                            str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    assert "absent from the packages configuration" not in built.stdout + built.stderr
    [wheel] = tmp_path.glob("sglang_deploy-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert "Description-Content-Type: text/markdown" in text
    assert text.split("\n\n", 1)[1].strip() == (REPO / "README.md").read_text().strip()
    assert {name for name in names if name.startswith("deploy_lib/starter/")} == {
        "deploy_lib/starter/hosts.example.yaml", "deploy_lib/starter/profiles/glm5-nvfp4.yaml"}
    assert {name for name in names if name.startswith("deploy_lib/guide/")} == {
        f"deploy_lib/guide/{page.name}" for page in DOCS.glob("*.md")}
    left = {path.name for path in REPO.iterdir()} - before
    assert {name for name in left if name == "build" or name.endswith(".egg-info")} == set()
