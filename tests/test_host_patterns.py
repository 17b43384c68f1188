"""`--limit PATTERN`: Ansible's host patterns over an inventory (issue 40: `No idea what '--limit' is!`, and one
`--host` or one `--group` was all there was). Pure: names in, names out."""

from __future__ import annotations

import pytest

from deploy_lib.errors import ConfigError
from deploy_lib.inventory.patterns import Term, match_hosts, split_pattern

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
