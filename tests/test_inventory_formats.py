"""Ansible inventory layouts: group_vars/ and host_vars/ beside the inventory with Ansible's precedence, host ranges,
the INI format and YAML merge keys. The refusals are in the bad-inventory corpus (tests/data/bad_inventories/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy_lib.inventory.formats import expand_host_pattern
from deploy_lib.inventory.model import load_inventory


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / next(iter(files))


def test_vars_apply_in_ansibles_order_inventory_group_vars_then_files_then_host(tmp_path: Path) -> None:
    """Input tried: router_port set at every level Ansible knows, each level dropped in turn."""
    levels = {
        "hosts.yaml": "all:\n  vars: {router_port: 1001}\n  children:\n    gpu:\n      vars: {router_port: 1002}\n"
                      "      hosts:\n        gpu1: {router_port: 1005}\n        gpu2: {}\n",
        "group_vars/all.yml": "router_port: 1003\n",
        "group_vars/gpu.yaml": "router_port: 1004\n",
        "host_vars/gpu1.yaml": "router_port: 1006\n",
    }
    path = _files(tmp_path, levels)
    inventory = load_inventory(path)
    # gpu2 has no host vars: the group_vars/ file of its group wins over the inventory's group vars
    assert [inventory.host(name).vars.router_port for name in ("gpu1", "gpu2")] == [1006, 1004]
    (tmp_path / "host_vars/gpu1.yaml").unlink()
    assert load_inventory(path).host("gpu1").vars.router_port == 1005  # inventory host var beats group_vars/
    (tmp_path / "group_vars/gpu.yaml").unlink()
    assert load_inventory(path).host("gpu2").vars.router_port == 1003  # group_vars/all beats the file's group vars


def test_a_host_var_wins_over_the_vars_of_a_group_written_after_it(tmp_path: Path) -> None:
    """Input tried: gpu1 with its own ansible_user under group a, then listed in group b whose vars set another user
    (the old loader let the later group's vars override the host's own)."""
    path = _files(tmp_path, {"hosts.yaml": (
        "all:\n  children:\n    a:\n      hosts:\n        gpu1: {ansible_user: alice}\n"
        "    b:\n      vars: {ansible_user: bob, gpu_count: 4}\n      hosts:\n        gpu1: {}\n")})
    host = load_inventory(path).host("gpu1")
    assert (host.vars.ansible_user, host.vars.gpu_count) == ("alice", 4)


def test_a_child_group_overrides_its_parent_and_siblings_apply_by_name(tmp_path: Path) -> None:
    """Input tried: a parent group written after its child, and two sibling groups written z before m."""
    path = _files(tmp_path, {"hosts.yaml": (
        "all:\n  children:\n    z:\n      vars: {gpu_count: 2}\n      hosts: {h: {}}\n"
        "    m:\n      vars: {gpu_count: 3, router_port: 2000}\n      hosts: {h: {}}\n"
        "      children:\n        rack:\n          vars: {router_port: 3000}\n          hosts: {h: {}}\n")})
    host = load_inventory(path).host("h")
    assert (host.vars.gpu_count, host.vars.router_port) == (2, 3000)  # z after m by name; rack deeper than m


def test_a_group_vars_directory_reads_its_files_in_name_order(tmp_path: Path) -> None:
    """Input tried: group_vars/gpu/ with two YAML files, a nested directory, an extension-less file, a hidden file,
    an editor backup and a README.md (the last three are not read, as in Ansible)."""
    path = _files(tmp_path, {
        "hosts.yaml": "all:\n  children:\n    gpu:\n      hosts: {gpu1: {}}\n",
        "group_vars/gpu/10-base.yml": "gpu_count: 8\nrouter_port: 1\n",
        "group_vars/gpu/20-site/port.yaml": "router_port: 2\n",
        "group_vars/gpu/30-user": "ansible_user: deploy\n",
        "group_vars/gpu/.hidden.yml": "gpu_count: 1\n",
        "group_vars/gpu/40-old.yml~": "gpu_count: 2\n",
        "group_vars/gpu/README.md": "gpu_count: [not, yaml, vars]\n",
        "group_vars/gpu/50-empty.yml": "",
    })
    host = load_inventory(path).host("gpu1")
    assert (host.vars.gpu_count, host.vars.router_port, host.vars.ansible_user) == (8, 2, "deploy")


def test_a_group_vars_file_for_an_unknown_group_is_not_read(tmp_path: Path) -> None:
    path = _files(tmp_path, {"hosts.yaml": "all:\n  hosts: {gpu1: {}}\n", "group_vars/other.yml": "gpu_count: 3\n"})
    assert load_inventory(path).host("gpu1").vars.gpu_count is None


@pytest.mark.parametrize(("pattern", "names"), [
    ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
    ("gpu[08:10]", ["gpu08", "gpu09", "gpu10"]),
    ("gpu[:2]", ["gpu0", "gpu1", "gpu2"]),
    ("node[1:7:3]", ["node1", "node4", "node7"]),
    ("rack-[a:c]", ["rack-a", "rack-b", "rack-c"]),
    ("r[1:2]-g[01:02].dc", ["r1-g01.dc", "r1-g02.dc", "r2-g01.dc", "r2-g02.dc"]),
    ("plain", ["plain"]),
])
def test_host_ranges_expand_as_ansible_does(pattern: str, names: list[str]) -> None:
    assert expand_host_pattern(pattern) == names


def test_a_range_in_a_yaml_inventory_gives_each_host_the_vars(tmp_path: Path) -> None:
    path = _files(tmp_path, {"hosts.yaml": "all:\n  children:\n    gpu:\n      hosts:\n"
                                           "        gpu[01:04]: {gpu_count: 8}\n        gpu02: {gpu_count: 4}\n"})
    inventory = load_inventory(path)
    assert inventory.groups["gpu"] == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert [host.vars.gpu_count for host in inventory.group("gpu")] == [8, 4, 8, 8]


def test_an_ini_inventory_reads_like_the_same_yaml_inventory(tmp_path: Path) -> None:
    """Input tried: Ansible's INI format with every kind of section, a range, a host:port, quoted and literal values,
    comments of both kinds, and a host written before any section."""
    ini = _files(tmp_path / "ini", {"hosts": (
        "# the lab\nloose ansible_host=192.0.2.9\n\n[gpu]\ngpu[1:2] gpu_count=8 gpu_arch=sm120\n"
        "gpu3:2222 ansible_host=192.0.2.13 venv='/opt/my env'  # trailing comment\n"
        "; a comment\n[gpu:vars]\nansible_user=deploy\nrouter_port=30081\n"
        "[edge]\nrouter1\n[fleet:children]\ngpu\nedge\n[fleet:vars]\nrouter=router1\n"
        "[all:vars]\nconnect_timeout_s=5.5\n")})
    yaml_inventory = _files(tmp_path / "yaml", {"hosts.yaml": (
        "all:\n  vars: {connect_timeout_s: 5.5}\n  hosts:\n    loose: {ansible_host: 192.0.2.9}\n  children:\n"
        "    fleet:\n      vars: {router: router1}\n      children:\n        gpu:\n"
        "          vars: {ansible_user: deploy, router_port: 30081}\n          hosts:\n"
        "            gpu1: {gpu_count: 8, gpu_arch: sm120}\n            gpu2: {gpu_count: 8, gpu_arch: sm120}\n"
        "            gpu3: {ansible_port: 2222, ansible_host: 192.0.2.13, venv: /opt/my env}\n"
        "        edge:\n          hosts: {router1: {}}\n")})
    from_ini, from_yaml = load_inventory(ini), load_inventory(yaml_inventory)
    assert {name: (set(host.groups), host.vars) for name, host in from_ini.hosts.items()} == {
        name: (set(host.groups), host.vars) for name, host in from_yaml.hosts.items()}
    assert from_ini.groups == from_yaml.groups
    gpu3 = from_ini.host("gpu3").vars
    assert (gpu3.ansible_port, gpu3.venv, gpu3.ansible_user, gpu3.router) == (2222, "/opt/my env", "deploy", "router1")
    assert from_ini.groups["ungrouped"] == ("loose",)


def test_an_ini_inventory_reads_group_vars_beside_it(tmp_path: Path) -> None:
    path = _files(tmp_path, {"inventory.ini": "[gpu]\ngpu1\n", "group_vars/gpu.yml": "gpu_count: 4\n"})
    assert load_inventory(path).host("gpu1").vars.gpu_count == 4


def test_yaml_merge_keys_give_defaults_that_explicit_keys_override(tmp_path: Path) -> None:
    """Input tried: an anchor of shared host vars merged into two hosts with `<<: *gpu`, one overriding a key."""
    path = _files(tmp_path, {"hosts.yaml": (
        "all:\n  vars:\n    x_gpu: &gpu {gpu_count: 8, gpu_arch: sm120}\n  hosts:\n    a:\n      <<: *gpu\n"
        "    b:\n      <<: *gpu\n      gpu_count: 4\n")})
    inventory = load_inventory(path)
    assert [(inventory.host(n).vars.gpu_count, inventory.host(n).vars.gpu_arch) for n in "ab"] == [
        (8, "sm120"), (4, "sm120")]
