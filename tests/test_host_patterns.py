"""`--limit PATTERN`: Ansible's host patterns over an inventory (issue 40: `No idea what '--limit' is!`, and one
`--host` or one `--group` was all there was). Pure: names in, names out."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pytest
from helpers.cli import REPO
from helpers.recording_progress import RecordingProgress

from deploy_cli.collection import user_tasks
from deploy_cli.program import NAME, DeployProgram, OneTaskExecutor
from deploy_lib.commands.deploy import Options
from deploy_lib.deploy.project import Project
from deploy_lib.errors import ConfigError
from deploy_lib.inventory.model import Inventory, load_inventory
from deploy_lib.inventory.patterns import Term, match_hosts, split_pattern
from deploy_lib.ops import dispatch
from deploy_lib.ops.scope import Reach, Scope, host_within, select

HOSTS = ["gpu1", "gpu2", "gpu3", "gpu4", "edge", "rack-a1", "rack-b1"]
GROUPS = {
    "all": tuple(HOSTS),
    "gpu": ("gpu1", "gpu2", "gpu3", "gpu4"),
    "nodes": ("gpu3", "gpu4"),          # a multi-node pair
    "replicas": ("gpu1", "gpu2", "edge"),
    "racks": ("rack-a1", "rack-b1"),
    "ungrouped": (),
}


@pytest.mark.parametrize(("pattern", "hosts"), [
    ("gpu1", ["gpu1"]),
    ("gpu", ["gpu1", "gpu2", "gpu3", "gpu4"]),                       # a group gives its hosts
    ("gpu3,gpu1", ["gpu1", "gpu3"]),                                  # always in inventory order
    ("gpu1:edge", ["gpu1", "edge"]),                                  # `:` separates as `,` does
    ("gpu*", ["gpu1", "gpu2", "gpu3", "gpu4"]),
    ("gpu?", ["gpu1", "gpu2", "gpu3", "gpu4"]),
    ("rack-[a]*", ["rack-a1"]),                                      # a glob's class, not a subscript
    ("rack*", ["rack-a1", "rack-b1"]),                               # hosts and the group `racks` alike
    ("~gpu[13]$", ["gpu1", "gpu3"]),                                  # a regex, matched from the start
    ("gpu[0]", ["gpu1"]),
    ("gpu[-1]", ["gpu4"]),
    ("gpu[1:2]", ["gpu2", "gpu3"]),                                   # both ends included, as Ansible
    ("gpu[:1]", ["gpu1", "gpu2"]),
    ("gpu[2:]", ["gpu3", "gpu4"]),
    ("gpu[0:1]:edge", ["gpu1", "gpu2", "edge"]),                      # a subscript's `:` is not a separator
    ("gpu:&replicas", ["gpu1", "gpu2"]),
    ("gpu:!nodes", ["gpu1", "gpu2"]),
    ("!nodes:gpu", ["gpu1", "gpu2"]),                                 # exclusions apply last, wherever written
    ("gpu,&replicas,!gpu2", ["gpu1"]),
    ("&replicas", ["gpu1", "gpu2", "edge"]),                          # no plain term: from every host
    ("!gpu", ["edge", "rack-a1", "rack-b1"]),
    ("all:!racks", ["gpu1", "gpu2", "gpu3", "gpu4", "edge"]),
    (" gpu1 , edge ", ["gpu1", "edge"]),
])
def test_a_pattern_names_the_hosts_ansible_would(pattern: str, hosts: list[str]) -> None:
    assert match_hosts(pattern, HOSTS, GROUPS) == hosts


@pytest.mark.parametrize(("pattern", "refusal"), [
    ("gpu9", "--limit gpu9: 'gpu9' matches no host or group of the inventory"),
    ("gpu1,gpux", "--limit gpu1,gpux: 'gpux' matches no host or group"),           # one bad term is enough
    ("gpu:!gpu9", "--limit gpu:!gpu9: 'gpu9' matches no host or group"),            # an exclusion's typo too
    ("web[1:3]", "--limit web[1:3]: 'web' matches no host or group"),
    ("gpu[7]", "--limit gpu[7]: gpu[7]: gpu has 4 host(s): no position 7"),
    ("gpu[5:9]", "--limit gpu[5:9]: gpu[5:9]: gpu has 4 host(s): the range picks none"),
    ("gpu:&racks", "--limit gpu:&racks: the pattern leaves no host"),
    ("gpu,,edge", "--limit gpu,,edge: an empty term"),
    ("gpu:", "--limit gpu:: an empty term"),
    ("", "--limit: the pattern is empty"),
    ("@retry.txt", "--limit @retry.txt: a file of hosts (@FILE, Ansible's retry file) is not read here"),
    ("~gpu(", "--limit: '~gpu(' is not a regular expression"),
    ("~pu", "--limit ~pu: '~pu' matches no host or group"),                          # re.match: from the start
])
def test_a_pattern_that_names_nothing_is_refused_naming_it(pattern: str, refusal: str) -> None:
    """Ansible warns and goes on; here a typo never narrows a command silently."""
    with pytest.raises(ConfigError) as refused:
        match_hosts(pattern, HOSTS, GROUPS)
    assert str(refused.value).startswith(refusal), refused.value
    assert refused.value.exit_code == 2


def test_a_subscript_on_a_name_that_is_no_group_says_what_a_subscript_is() -> None:
    """`web[1:3]` is Ansible's slice of group web, not the hosts web1 to web3."""
    with pytest.raises(ConfigError) as refused:
        match_hosts("gp[0:1]", HOSTS, GROUPS)
    assert refused.value.hint == "a subscript picks hosts of a group by position, as in Ansible: `gp[0:1]` is " \
                                 "the first two hosts of group gp"


def test_terms_keep_their_operator_and_order() -> None:
    assert split_pattern("a:&b:!c[0:1]") == [Term("", "a"), Term("&", "b"), Term("!", "c[0:1]")]
    assert split_pattern("a,b:c") == [Term("", "a"), Term("", "b:c")]  # with `,`, `:` is part of a name


INVENTORY = """\
all:
  children:
    gpu:
      hosts:
        gpu1: {ansible_host: 192.0.2.1}
        gpu2: {ansible_host: 192.0.2.2}
        gpu3: {ansible_host: 192.0.2.3}
    nodes:
      hosts:
        node1: {ansible_host: 192.0.2.11}
        node2: {ansible_host: 192.0.2.12}
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    return load_inventory(path)


@pytest.mark.parametrize(("host", "group", "limit", "names", "left_out"), [
    (None, "gpu", "gpu:!gpu2", ["gpu1", "gpu3"], ("gpu2",)),
    (None, "gpu", "gpu[0:1]", ["gpu1", "gpu2"], ("gpu3",)),
    (None, "gpu", "*", ["gpu1", "gpu2", "gpu3"], ()),
    (None, None, "gpu3,node*", ["gpu3", "node1", "node2"], ("gpu1", "gpu2")),   # alone: every host, narrowed
    ("gpu2", None, "gpu", ["gpu2"], ()),
])
def test_limit_narrows_the_group_or_checks_the_host(inventory: Inventory, host: str | None, group: str | None,
                                                   limit: str, names: list[str], left_out: tuple[str, ...]) -> None:
    scope = select(inventory, host, group, limit=limit)
    assert (scope.names, scope.left_out, scope.limit) == (names, left_out, limit)
    assert scope.one_host == (host is not None)


@pytest.mark.parametrize(("host", "group", "limit", "refusal"), [
    (None, "gpu", "nodes", "--limit nodes leaves no host of group gpu (gpu1, gpu2, gpu3)"),
    ("gpu1", None, "gpu:!gpu1", "--limit gpu:!gpu1 does not name host gpu1 (--host): nothing to act on"),
    (None, "gpu", "gpu:!gpu7", "--limit gpu:!gpu7: 'gpu7' matches no host or group of the inventory"),
])
def test_a_limit_that_leaves_nothing_is_refused(inventory: Inventory, host: str | None, group: str | None,
                                                limit: str, refusal: str) -> None:
    with pytest.raises(ConfigError) as refused:
        select(inventory, host, group, limit=limit)
    assert str(refused.value).startswith(refusal), refused.value


def test_a_limit_that_splits_a_multi_node_release_is_refused_before_any_host_is_reached(
        inventory: Inventory, tmp_path: Path) -> None:
    """Input tried: `deploy --group nodes --limit node1` of a profile with parallel.nnodes 2: one node of the one
    server deployed alone."""
    project = Project(REPO)
    (tmp_path / "two.yaml").write_text("model: {path: m}\nparallel: {nnodes: 2, dist_init_port: 29500}\n")
    scope = select(inventory, None, "nodes", limit="node1")
    reached: list[str] = []

    def never(*_: object) -> NoReturn:
        reached.append("connect")
        raise AssertionError("no host is reached")
    reach = Reach(connect=never, progress=lambda _: RecordingProgress(), consent=lambda _: None)
    with pytest.raises(ConfigError) as refused:
        dispatch.deploy(project, scope, str(tmp_path / "two.yaml"), Options(dry_run=True), reach)
    assert str(refused.value).startswith(
        "--limit node1 splits group nodes: profile two is multi-node (parallel.nnodes 2), one server over all its "
        "nodes, but node2 would be left out"), refused.value
    assert reached == []


@pytest.mark.parametrize(("line", "names"), [
    ("status --group gpu --limit gpu:!gpu2", ["gpu1", "gpu3"]),
    ("releases --group gpu --limit=gpu[-1]", ["gpu3"]),
    ("stop --limit node* --yes", ["node1", "node2"]),
    ("status --group gpu", ["gpu1", "gpu2", "gpu3"]),
])
def test_every_command_with_host_and_group_takes_limit(line: str, names: list[str], inventory: Inventory,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Through the program's own parser and the task: the scope the library is handed is narrowed."""
    seen: list[list[str]] = []

    def caught(scope: Scope, *_: object) -> NoReturn:
        seen.append(scope.names)
        raise SystemExit(0)
    for name in ("status", "releases", "stop"):
        monkeypatch.setattr(dispatch, name, caught)
    monkeypatch.setenv("SGLANG_DEPLOY_INVENTORY", str(inventory.path))
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=user_tasks(),
                            executor_class=OneTaskExecutor)
    with pytest.raises(SystemExit):
        program.run([NAME, *line.split()])
    assert seen == [names], capsys.readouterr().err


def test_limit_is_offered_by_exactly_the_tasks_that_take_host_and_group() -> None:
    namespace = user_tasks()
    with_limit = sorted(name for name in namespace.task_names
                        if any("limit" in argument.names for argument in namespace[name].get_arguments()))
    assert with_limit == ["deploy", "logs", "plan", "releases", "report", "restart", "rollback", "start", "status",
                          "stop", "tune.tune", "uninstall", "workload"]


@pytest.mark.parametrize(("host", "limit", "chosen"), [
    ("gpu1", None, "gpu1"), (None, None, None), ("gpu1", "gpu*", "gpu1"), (None, "gpu:!gpu1:!gpu2", "gpu3"),
    (None, "nodes[-1]", "node2")])
def test_a_one_host_path_takes_the_host_the_limit_allows(inventory: Inventory, host: str | None, limit: str | None,
                                                         chosen: str | None) -> None:
    assert host_within(inventory, host, limit) == chosen
