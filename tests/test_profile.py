"""Profiles and inventories: the reference profile, the bad-input corpus, extends, schema."""

from __future__ import annotations

import getpass
import json
import shutil
from pathlib import Path

import pytest

from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.errors import ConfigError
from deploy_lib.inventory.model import check_profile_fits_host, load_inventory
from deploy_lib.profile import Profile, load_profile, profile_json_schema
from deploy_lib.remote import JumpHost

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "inventory" / "profiles"
DATA = Path(__file__).resolve().parent / "data"
BAD_PROFILES = sorted(p for p in (DATA / "bad_profiles").glob("*.yaml") if p.stem != "valid-parent")
# a bad inventory is a file (YAML, or INI: .ini), or a directory: its inventory `hosts.yaml` or `hosts` (INI) with
# the group_vars/ and host_vars/ beside it; the inventory's first line says what error it must give
BAD_INVENTORIES = sorted(p for p in (DATA / "bad_inventories").iterdir() if p.suffix in (".yaml", ".ini") or p.is_dir())


def inventory_file(entry: Path) -> Path:
    return next(p for p in (entry / "hosts.yaml", entry / "hosts") if p.exists()) if entry.is_dir() else entry


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} lacks its '# expect:' line"
    return first.removeprefix("# expect: ")


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_reference_profile_expresses_the_hand_written_launch() -> None:
    profile = load_profile(PROFILES, "glm5-nvfp4").profile
    assert profile.model.path == "lukealonso/GLM-5-NVFP4"
    assert profile.model.served_name == "glm-5"
    assert (profile.model.reasoning_parser, profile.model.tool_call_parser) == ("glm45", "glm47")
    assert profile.model.trust_remote_code and profile.model.quantization == "modelopt_fp4"
    assert profile.parallel.tp == 8
    assert (profile.memory.mem_fraction_static, profile.memory.max_running_requests) == (0.92, 1024)
    assert profile.backends.attention == "flashinfer" and profile.backends.moe_runner == "flashinfer_cutlass"
    assert (profile.backends.dsa_decode, profile.backends.dsa_prefill, profile.backends.fp8_gemm) == (
        "trtllm", "trtllm", "cutlass")
    assert not profile.features.cuda_graph and not profile.features.radix_cache
    assert not profile.features.allreduce_fusion
    assert profile.features.metrics, "the one addition to the hand launch: /metrics for the watch and workload"
    assert (profile.server.host, profile.server.port) == ("0.0.0.0", 8000)
    assert profile.service.venv == "/root/ml-env"
    assert profile.environment() == {
        "NCCL_P2P_LEVEL": "5", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8", "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "8", "SAFETENSORS_FAST_GPU": "1", "CUDA_HOME": "/usr/local/cuda-12.8",
    }


def test_fusion_profile_extends_the_reference_and_changes_only_fusion() -> None:
    base = load_profile(PROFILES, "glm5-nvfp4").profile
    fusion = load_profile(PROFILES, "glm5-nvfp4-fusion")
    assert fusion.chain == ("glm5-nvfp4-fusion", "glm5-nvfp4")
    assert fusion.profile.features.allreduce_fusion
    as_base = fusion.profile.model_copy(update={
        "features": fusion.profile.features.model_copy(update={"allreduce_fusion": False}),
        "description": base.description})
    assert as_base == base
    assert fusion.profile.content_hash() != base.content_hash()


@pytest.mark.parametrize("path", BAD_PROFILES, ids=lambda p: p.stem)
def test_bad_profile_is_refused_naming_file_key_and_allowed_values(path: Path, tmp_path: Path) -> None:
    """Input tried: the file itself (its first line says what error it must give)."""
    corpus = tmp_path / "profiles"
    shutil.copytree(path.parent, corpus)
    before = tree_snapshot(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_profile(corpus, path.stem)
    message = str(caught.value)
    assert expected_message(path) in message
    assert str(corpus / path.name) in message
    assert tree_snapshot(tmp_path) == before, "loading a bad profile must write nothing"


def test_corpus_is_large_enough() -> None:
    assert len(BAD_PROFILES) + len(BAD_INVENTORIES) >= 40


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body)
    return path


def test_a_one_megabyte_string_is_refused(tmp_path: Path) -> None:
    """Input tried: a model path of 1,000,000 characters."""
    _write(tmp_path, "huge", "model:\n  path: " + "a" * 1_000_000 + "\n")
    with pytest.raises(ConfigError, match="too large"):
        load_profile(tmp_path, "huge")


def test_a_long_string_under_the_file_limit_is_refused_by_key(tmp_path: Path) -> None:
    """Input tried: a 100 KB served name."""
    _write(tmp_path, "long", "model:\n  path: m\n  served_name: " + "x" * 100_000 + "\n")
    with pytest.raises(ConfigError, match=r"model\.served_name: String should have at most 4096 characters"):
        load_profile(tmp_path, "long")


def test_a_typed_key_set_to_null_leaves_its_flag_to_extra_args(tmp_path: Path) -> None:
    """Input tried: the reference profile extended with backends.dsa_decode: null and a hand-written
    --nsa-decode-backend (refused as given twice before; the typed key then writes no flag)."""
    shutil.copy(PROFILES / "glm5-nvfp4.yaml", tmp_path / "glm5-nvfp4.yaml")
    _write(tmp_path, "nsa", 'extends: glm5-nvfp4\nbackends: {dsa_decode: null}\n'
                            'extra_args: ["--nsa-decode-backend", "flashmla_kv"]\n')
    profile = load_profile(tmp_path, "nsa").profile
    assert profile.backends.dsa_decode is None and profile.extra_args[-2:] == ["--nsa-decode-backend", "flashmla_kv"]
    _write(tmp_path, "twice", 'extends: glm5-nvfp4\nextra_args: ["--nsa-decode-backend", "flashmla_kv"]\n')
    twice = r"backends\.dsa_decode \(trtllm\) and extra_args \(--nsa-decode-backend\) both"
    with pytest.raises(ConfigError, match=twice):
        load_profile(tmp_path, "twice")


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        load_profile(PROFILES, "glm6")
    assert "glm5-nvfp4" in str(caught.value)


@pytest.mark.parametrize("name", ["../etc/passwd", "a b", ""])
def test_profile_names_cannot_escape_the_profiles_directory(name: str) -> None:
    with pytest.raises(ConfigError, match="profile name"):
        load_profile(PROFILES, name)


def test_awkward_but_valid_values_are_kept_exactly(tmp_path: Path) -> None:
    """Input tried: a model path with spaces, a served name with quotes, % and $ in an environment value."""
    _write(tmp_path, "awkward", (
        "model:\n  path: '/models/GLM 5 NVFP4'\n  served_name: 'glm \"five\" it''s'\n"
        "env:\n  WEIRD: '50% of $HOME and ${X} `not run`'\n"
        "secrets:\n  HF_TOKEN: {env: MY_HF_TOKEN}\n"))
    profile = load_profile(tmp_path, "awkward").profile
    assert profile.model.path == "/models/GLM 5 NVFP4"
    assert profile.model.served_name == "glm \"five\" it's"
    assert profile.env["WEIRD"] == "50% of $HOME and ${X} `not run`"
    assert profile.secrets["HF_TOKEN"].env == "MY_HF_TOKEN"


def test_nccl_level_accepts_names_and_numbers() -> None:
    for level in ("SYS", "PHB", 0, 5, "5"):
        profile = Profile.model_validate({"model": {"path": "m"}, "nccl": {"p2p_level": level}})
        assert profile.environment()["NCCL_P2P_LEVEL"] == str(level)


def test_json_schema_lists_every_top_level_key_and_forbids_others() -> None:
    schema = profile_json_schema()
    assert set(schema["properties"]) == set(Profile.model_fields) | {"extends", "$schema"}
    assert schema["additionalProperties"] is False
    json.dumps(schema)
    attention = schema["$defs"]["AttentionBackend"]["enum"]
    assert "flashinfer" in attention and "trtllm_mha" in attention


def test_a_profile_may_name_its_schema_for_editors(tmp_path: Path) -> None:
    """Input tried: docs/profiles.md's two ways of pointing an editor at `invoke schema`'s output."""
    _write(tmp_path, "edited", "# yaml-language-server: $schema=../../profile.schema.json\n"
                               "$schema: ../../profile.schema.json\nmodel: {path: m}\n")
    assert load_profile(tmp_path, "edited").profile == Profile.model_validate({"model": {"path": "m"}})


@pytest.mark.parametrize("path", BAD_INVENTORIES, ids=lambda p: p.stem)
def test_bad_inventory_is_refused_naming_file_and_key(path: Path) -> None:
    """Input tried: the inventory file itself, with its group_vars/ and host_vars/ for a directory (the inventory's
    first line says what error it must give)."""
    with pytest.raises(ConfigError) as caught:
        load_inventory(inventory_file(path))
    assert expected_message(inventory_file(path)) in str(caught.value)
    assert str(path) in str(caught.value)


def test_reference_inventory_resolves_group_vars_into_the_host() -> None:
    inventory = load_inventory(REPO / "inventory" / "hosts.yaml")
    host = inventory.host(None)
    assert host.name == "pve-gpu1" and host.address == "192.0.2.10"
    assert (host.vars.gpu_count, host.vars.gpu_arch, host.vars.ansible_user) == (8, "sm120", "root")
    assert host.groups == ("all", "gpu")


def test_host_vars_override_group_vars_which_override_all(tmp_path: Path) -> None:
    path = _write(tmp_path, "inv", (
        "all:\n  vars: {ansible_user: alice, ansible_port: 2200}\n  children:\n    g:\n"
        "      vars: {ansible_user: bob}\n      hosts:\n        h1: {ansible_port: 22}\n        h2: {}\n"))
    inventory = load_inventory(path)
    assert (inventory.host("h1").vars.ansible_user, inventory.host("h1").vars.ansible_port) == ("bob", 22)
    assert (inventory.host("h2").vars.ansible_user, inventory.host("h2").vars.ansible_port) == ("bob", 2200)
    with pytest.raises(ConfigError, match="say which with --host"):
        inventory.host(None)


def test_unknown_inventory_host_lists_the_known_ones() -> None:
    """Input tried: --host gpu9 against the reference inventory."""
    with pytest.raises(ConfigError, match=r"unknown host 'gpu9'.*\n.*pve-gpu1"):
        load_inventory(REPO / "inventory" / "hosts.yaml").host("gpu9")


def test_tp_larger_than_the_hosts_gpu_count_is_refused(tmp_path: Path) -> None:
    """Input tried: the TP8 reference profile against a host declaring 4 GPUs."""
    path = _write(tmp_path, "inv", "all:\n  hosts:\n    small: {gpu_count: 4}\n")
    loaded = load_profile(PROFILES, "glm5-nvfp4")
    with pytest.raises(ConfigError, match=r"parallel: tp 8 needs 8 GPUs per node, host small has 4 \(.*inv.yaml: host "
                                          r"small: gpu_count\)"):
        check_profile_fits_host(loaded.profile, load_inventory(path).host("small"), loaded.path)


def test_a_profile_path_finds_its_parent_beside_it(tmp_path: Path) -> None:
    """Input tried: a profile file outside inventory/profiles/ that extends a sibling; a .yml path."""
    _write(tmp_path, "base", "model: {path: m}\nparallel: {tp: 2}\n")
    _write(tmp_path, "child", "extends: base\nserver: {port: 8001}\n")
    loaded = Project(REPO).profile(str(tmp_path / "child.yaml"))
    assert (loaded.name, loaded.chain, loaded.profile.parallel.tp) == ("child", ("child", "base"), 2)
    with pytest.raises(ConfigError, match=r"a profile file ends in \.yaml"):
        Project(REPO).profile(str(tmp_path / "child.yml"))


@pytest.mark.parametrize(("host_vars", "jump"), [
    ("ansible_ssh_common_args: '-o ProxyJump=root@pve1'", JumpHost("pve1", 22, "root")),
    ("ansible_ssh_common_args: '-o ProxyJump=deploy@192.0.2.1:2222'", JumpHost("192.0.2.1", 2222, "deploy")),
    ("ansible_ssh_common_args: '-oProxyJump=root@pve1'", JumpHost("pve1", 22, "root")),
    ("ansible_ssh_common_args: '-o \"ProxyJump root@pve1\"'", JumpHost("pve1", 22, "root")),
    ("ansible_ssh_common_args: '-J root@[2001:db8::1]:2022'", JumpHost("2001:db8::1", 2022, "root")),
    ("ansible_ssh_extra_args: '-J ssh://root@pve1'", JumpHost("pve1", 22, "root")),
    ("proxy_jump: pve1", JumpHost("pve1", 22, getpass.getuser())),
    ("{proxy_jump: 'root@pve1', ansible_ssh_common_args: '-o ProxyJump=root@pve1'}", JumpHost("pve1", 22, "root")),
    ("proxy_jump: none", None),
])
def test_jump_host_from_the_inventory(tmp_path: Path, host_vars: str, jump: JumpHost | None) -> None:
    """Inputs tried: ProxyJump as Ansible users write it in ansible_ssh_common_args/extra_args, and proxy_jump."""
    mapping = host_vars if host_vars.startswith("{") else "{" + host_vars + "}"
    path = _write(tmp_path, "inv", f"all:\n  hosts:\n    vm: {mapping}\n")
    target = resolve_target(load_inventory(path), "vm")
    assert target.ssh.jump == jump


def test_inventory_vars_that_look_like_typos_are_warned_about_with_a_suggestion(tmp_path: Path) -> None:
    """Input tried: `ansible_hots` (ignored, then SSH failed with 'Name or service not known'), `gpu_cout`,
    an Ansible var this tool does not use, and a var of another tool."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    gpu1:\n      ansible_hots: 192.0.2.10\n      gpu_cout: 8\n"
                         "      ansible_become: true\n      backup_dir: /srv\n")
    warnings = load_inventory(inventory).host("gpu1").warnings
    assert warnings == (
        f"{inventory}: host gpu1: ansible_become is not a var sglang-deploy reads, so it is ignored",
        f"{inventory}: host gpu1: ansible_hots is not a var sglang-deploy reads, so it is ignored; "
        "did you mean `ansible_host`?",
        f"{inventory}: host gpu1: gpu_cout is not a var sglang-deploy reads, so it is ignored; "
        "did you mean `gpu_count`?",
    )
