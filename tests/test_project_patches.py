"""Patch sets from the user's own project (patches/ beside inventory/): listed, checked, enabled and disabled like a
bundled one, by every command that takes a patch set's name; a name a bundled set has is refused naming both."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import invoke
from helpers.deploy_plan import PROJECT, target
from helpers.fake_remote import FakeRemote
from helpers.json_doc import envelope, result
from helpers.project_patches import GATED, GATED_FILE, PATCHED, write_project_patch_set

from deploy_lib.bundled import ROLES_DIR
from deploy_lib.commands import patches as on_host
from deploy_lib.deploy.project import Project
from deploy_lib.errors import ConfigError
from deploy_lib.patches import Origin, State, check, disable, enable, find_patch_set, list_patch_sets
from deploy_lib.remote import Step

VERSIONS = {"sglang": "0.5.23"}


def test_a_project_patch_set_is_listed_beside_the_bundled_ones_with_where_it_is(tmp_path: Path) -> None:
    role = write_project_patch_set(tmp_path)
    listed = {p.name: p for p in list_patch_sets(ROLES_DIR, Project(tmp_path).patches_dir)}
    assert sorted(listed) == ["fusion-sm120", "nsa-aliases", "our-gate"]
    assert (listed["our-gate"].origin, listed["our-gate"].directory) == (Origin.PROJECT, role)
    assert listed["fusion-sm120"].origin is Origin.BUNDLED
    assert find_patch_set(ROLES_DIR, "our-gate", tmp_path / "patches").directory == role
    # a project without patches/ has the bundled sets only
    assert [p.name for p in list_patch_sets(ROLES_DIR, tmp_path / "nothing")] == ["fusion-sm120", "nsa-aliases"]


def test_a_project_patch_set_is_checked_enabled_and_disabled_like_a_bundled_one(tmp_path: Path) -> None:
    write_project_patch_set(tmp_path)
    patch_set = find_patch_set(ROLES_DIR, "our-gate", tmp_path / "patches")
    files = {GATED_FILE: GATED}
    assert [t.state for t in check(patch_set, files, VERSIONS, gpu_arch="sm120").targets] == [State.ABSENT]
    enabled = enable(patch_set, files, VERSIONS, gpu_arch="sm120")
    assert enabled.files == {GATED_FILE: PATCHED}
    patched = {**files, **enabled.files}
    assert [t.state for t in check(patch_set, patched, VERSIONS, gpu_arch="sm120", record=enabled.record).targets
            ] == [State.APPLIED]
    assert disable(patch_set, patched, enabled.record) == {GATED_FILE: GATED}
    # the release it makes is named as a bundled set's: <profile>+<set>
    assert on_host.patched_profile(PROJECT.profile("glm5-nvfp4"), patch_set).name == "glm5-nvfp4+our-gate"


def test_a_project_patch_set_is_checked_on_a_host_like_a_bundled_one(tmp_path: Path) -> None:
    """The host's current venv has SGLang 0.5.23 with the gated file: its state, file and line come back."""
    write_project_patch_set(tmp_path)
    patch_set = find_patch_set(ROLES_DIR, "our-gate", tmp_path / "patches")
    site = "/root/ml-env/lib/python3.11/site-packages"
    remote = FakeRemote()
    remote.reply(lambda step: step.name.startswith("store facts"), exit_code=1)  # an empty release store
    remote.reply("store facts: clock", stdout="1764500000\n")
    remote.reply(lambda step: isinstance(step, Step) and step.argv[0] == "nvidia-smi", stdout=(
        "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-0, 12.0, 97887, 0, 30.0, 600.0, 0, 580.95"))
    remote.reply("patch facts: venv", stdout=json.dumps({"purelib": site, "versions": VERSIONS, "origins": {},
                                                         "roots": {"sglang": site}}))
    remote.reply("patch facts: record", exit_code=1)
    remote.reply(f"read {GATED_FILE}", stdout=base64.b64encode(GATED.encode()).decode())
    report = on_host.check(remote, patch_set, PROJECT.profile("glm5-nvfp4"), target())
    assert [(t.target, t.state, t.file) for t in report.targets] == [("gate", State.ABSENT, GATED_FILE)]
    read, = (step for step in remote.ran if step.name == f"read {GATED_FILE}")
    assert isinstance(read, Step) and read.argv[-1] == f"{site}/{GATED_FILE}"


def test_a_project_patch_set_named_as_a_bundled_one_is_refused_naming_both(tmp_path: Path) -> None:
    role = tmp_path / "patches" / "fusion-sm120"
    shutil.copytree(ROLES_DIR / "fusion-sm120", role)
    (tmp_path / "inventory").mkdir()
    with pytest.raises(ConfigError) as caught:
        list_patch_sets(ROLES_DIR, tmp_path / "patches")
    assert caught.value.exit_code == 2
    assert caught.value.message == (f"two patch sets are named 'fusion-sm120': bundled {ROLES_DIR}/fusion-sm120/"
                                    f"meta.yaml and project {role}/meta.yaml")
    refused = invoke("patches.list", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert str(ROLES_DIR / "fusion-sm120" / "meta.yaml") in refused.stderr
    assert str(role / "meta.yaml") in refused.stderr and "rename the project's one" in refused.stderr
    # tune's patches= axis reads the same sets: refused the same way, before any host
    swept = invoke("tune", "--vary", "patches=none,fusion-sm120", "-H", "nosuch", cwd=tmp_path)
    assert swept.returncode == 2 and "two patch sets are named 'fusion-sm120'" in swept.stderr, swept.stderr


def test_two_project_patch_sets_of_one_name_and_a_folder_without_meta_are_refused(tmp_path: Path) -> None:
    """A project's set is named by its folder: a second folder holding the same `name:` is refused as not its
    folder's name."""
    write_project_patch_set(tmp_path)
    write_project_patch_set(tmp_path, folder="our-gate-2")
    with pytest.raises(ConfigError, match=r"/our-gate-2/meta\.yaml: name: 'our-gate' is not its folder's name "
                                          r"'our-gate-2'"):
        list_patch_sets(ROLES_DIR, tmp_path / "patches")
    shutil.rmtree(tmp_path / "patches" / "our-gate-2")
    (tmp_path / "patches" / "notes").mkdir()
    with pytest.raises(ConfigError, match=r"notes: a folder of the project's patch sets without a meta\.yaml"):
        list_patch_sets(ROLES_DIR, tmp_path / "patches")


def test_patches_list_says_where_each_set_comes_from(tmp_path: Path) -> None:
    role = write_project_patch_set(tmp_path)
    shown = invoke("patches.list", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    listed = {p["meta"]["name"]: (p["origin"], p["directory"]) for p in result(envelope(shown.stdout, 0))}
    assert listed == {"fusion-sm120": ("bundled", str(ROLES_DIR / "fusion-sm120")),
                      "nsa-aliases": ("bundled", str(ROLES_DIR / "nsa-aliases")),
                      "our-gate": ("project", str(role))}


@pytest.mark.parametrize("argv", [("patch", "--check"), ("patches.audit",), ("patches.enable", "--yes"),
                                  ("patches.disable", "--yes")])
def test_every_patch_command_takes_a_project_sets_name(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """The name resolves (the command goes on to the host, which is not in the inventory); a name neither bundled nor
    in the project is refused naming both places."""
    write_project_patch_set(tmp_path)
    found = invoke(argv[0], "--name", "our-gate", *argv[1:], "-H", "nosuch", cwd=tmp_path)
    assert found.returncode == 2 and "unknown host 'nosuch'" in found.stderr, found.stderr
    if argv[0] == "patch":
        unknown = invoke("patch", "--name", "our-gat", "--check", "-H", "nosuch", cwd=tmp_path)
        assert unknown.returncode == 2
        assert (f"no patch set named 'our-gat' under {ROLES_DIR} or {tmp_path / 'patches'}; did you mean "
                "`our-gate`?") in unknown.stderr
