"""Groups as targets: Ansible's group resolution, serial batches and max-fail stopping (pure, no SSH), the parallel
runner over a per-host call, the per-host summary and exit code, and the command line's refusals."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from helpers.cli import invoke
from helpers.recording_progress import RecordingProgress

from deploy_lib.commands.deploy import Outcome
from deploy_lib.deploy.project import Target, resolve_group
from deploy_lib.errors import ConfigError, DeployError, LockHeld, ReadinessFailed, RemoteError, RollbackFailed
from deploy_lib.inventory.model import load_inventory
from deploy_lib.ops.fleet import (
    FleetRun,
    HostEnd,
    HostRun,
    Rollout,
    outcome_end,
    run_hosts,
    summarize,
    worst_exit_code,
)
from deploy_lib.outcomes import Action
from sandbox import manage, names

REPO = Path(__file__).resolve().parent.parent

FLEET = """\
all:
  hosts:
    lone: {ansible_host: 192.0.2.1}
  children:
    gpu:
      hosts:
        a: {ansible_host: 192.0.2.2}
        b: {ansible_host: 192.0.2.3}
      children:
        rack2:
          hosts:
            c: {ansible_host: 192.0.2.4}
    prod:
      children:
        gpu:
        edge:
          hosts:
            d: {ansible_host: 192.0.2.5}
            a:
    empty: {}
"""


def write(tmp_path: Path, text: str = FLEET) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_a_group_holds_its_childrens_hosts_and_a_group_written_twice_is_one_group(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path))
    names = {group: [host.name for host in inventory.group(group)] for group in ("gpu", "rack2", "prod", "edge")}
    assert names == {"gpu": ["a", "b", "c"], "rack2": ["c"], "prod": ["a", "b", "c", "d"], "edge": ["d", "a"]}
    assert [h.name for h in inventory.group("all")] == ["lone", "a", "b", "c", "d"]
    assert [h.name for h in inventory.group("ungrouped")] == ["lone"]  # Ansible's implicit group
    assert inventory.hosts["c"].groups == ("all", "gpu", "rack2", "prod")


def test_an_unknown_or_empty_group_is_refused_naming_the_inventory_and_the_group(tmp_path: Path) -> None:
    inventory = load_inventory(path := write(tmp_path))
    with pytest.raises(ConfigError) as unknown:
        inventory.group("gpus")
    assert f"{path}: unknown group 'gpus'; did you mean `gpu`?" in str(unknown.value)
    assert "groups: all, edge, empty, gpu, prod, rack2, ungrouped" in str(unknown.value)
    with pytest.raises(ConfigError, match=f"{path}: group 'empty' has no hosts"):
        inventory.group("empty")


def test_a_group_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "all:\n  children:\n    x:\n      hosts: {h: {}}\n      children:\n        y:\n"
                           "          children:\n            x:\n")
    with pytest.raises(ConfigError, match=r"group 'x' is its own child: x -> y -> x"):
        load_inventory(path)


@pytest.mark.parametrize(("serial", "count", "sizes"), [
    ((), 5, [5]),
    (("2",), 5, [2, 2, 1]),
    (("30%",), 10, [3, 3, 3, 1]),
    (("10%",), 5, [1, 1, 1, 1, 1]),   # a percentage rounds down, but a batch has at least one host
    (("1", "50%"), 6, [1, 3, 2]),     # Ansible's list: one value per batch, the last repeating
    (("1", "2", "10"), 4, [1, 2, 1]),
    (("9",), 3, [3]),
])
def test_serial_makes_ansibles_batches(serial: tuple[str, ...], count: int, sizes: list[int]) -> None:
    hosts = [f"h{n}" for n in range(count)]
    batches = Rollout.parse(serial).batches(hosts)
    assert [len(batch) for batch in batches] == sizes
    assert [host for batch in batches for host in batch] == hosts


@pytest.mark.parametrize("given", ["0", "-1", "x", "2.5", "101%", "1 2", ""])
def test_a_bad_serial_is_refused_saying_what_it_takes(given: str) -> None:
    with pytest.raises(ConfigError, match=r"--serial takes a whole number of hosts \(>= 1\) or a percentage"):
        Rollout.parse([given])


def test_max_fail_counts_hosts_over_the_rollout_or_a_percentage_of_each_batch() -> None:
    assert Rollout.parse(max_fail="1").stop_reason(2, 1, 1) is None
    assert Rollout.parse(max_fail="1").stop_reason(2, 1, 2) == "2 hosts failed, more than --max-fail 1"
    assert Rollout.parse(max_fail="0").stop_reason(3, 1, 1) == "1 host failed, more than --max-fail 0"
    assert Rollout.parse(max_fail="50%").stop_reason(2, 1, 5) is None  # not more than half of this batch
    assert Rollout.parse(max_fail="49%").stop_reason(2, 1, 1) == \
        "1 of 2 hosts of the batch failed, more than --max-fail 49%"
    # as Ansible: a batch in which every host failed stops the rollout, unless a count of hosts allows more
    assert Rollout.parse(max_fail="100%").stop_reason(2, 2, 2) == "every host of the batch failed (2)"
    assert Rollout.parse().stop_reason(1, 1, 1) == "every host of the batch failed (1)"
    assert Rollout.parse().stop_reason(3, 2, 2) is None
    assert Rollout.parse(max_fail="2").stop_reason(1, 1, 2) is None  # --serial 1 --max-fail 2: two may fail


def test_worst_exit_code_puts_a_host_left_stopped_first() -> None:
    assert worst_exit_code([0, 0]) == 0
    assert worst_exit_code([0, 6, 4]) == 6
    assert worst_exit_code([9, 8, 130]) == 8
    assert worst_exit_code([0, 130, 6]) == 130


def targets(tmp_path: Path, group: str = "prod") -> list[Target]:
    return resolve_group(load_inventory(write(tmp_path)), group)


def failed_and_rolled_back(host: str) -> ReadinessFailed:
    error = ReadinessFailed(f"{host}: release new failed: no health; rolled back, release old is serving")
    error.about("new", "old", {})
    error.serving_id = "old"
    return error


class Hosts:
    """A per-host call that records which hosts it was called for and fails the ones told, as deploy raises."""

    def __init__(self, failing: dict[str, DeployError], together: int = 1) -> None:
        self.failing, self.called = failing, []
        self.barrier = threading.Barrier(together) if together > 1 else None
        self.lock = threading.Lock()

    def __call__(self, target: Target) -> str:
        with self.lock:
            self.called.append(target.host.name)
        if self.barrier is not None:
            self.barrier.wait(timeout=60)  # breaks unless the batch's hosts run at the same time
        if target.host.name in self.failing:
            raise self.failing[target.host.name]
        return "new"


def summary_of(fleet: FleetRun[str]):  # type: ignore[no-untyped-def]
    return summarize(fleet, lambda release: HostEnd(Action.deployed, release, release, 1.5))


def test_a_group_plan_shows_each_host_serving_what_it_served_and_a_deploy_its_new_release() -> None:
    """`plan --group G` changes nothing: the table's `serving now` is the release before; after a deploy, the new."""
    fleet = FleetRun((HostRun("a", result=Outcome(Action.planned, "new", "old")),
                      HostRun("b", result=Outcome(Action.deployed, "new", "old"))), (("a", "b"),))
    summary = summarize(fleet, outcome_end)
    assert [(row.host, row.outcome, row.release, row.serving) for row in summary.rows] == [
        ("a", "planned", "new", "old"), ("b", "deployed", "new", "new")]


def test_the_hosts_of_a_batch_run_at_the_same_time(tmp_path: Path) -> None:
    act = Hosts({}, together=4)
    fleet = run_hosts(targets(tmp_path), act, RecordingProgress())
    assert sorted(act.called) == ["a", "b", "c", "d"] and fleet.exit_code == 0
    summary = summary_of(fleet)
    assert summary.by_release == {"new": ["a", "b", "c", "d"]} and summary.exit_code == 0


def test_a_failed_host_in_a_batch_rolls_back_alone_and_the_others_deploy(tmp_path: Path) -> None:
    fleet = run_hosts(targets(tmp_path), Hosts({"b": failed_and_rolled_back("b")}), RecordingProgress(),
                      Rollout.parse(["2"], "1"))
    summary = summary_of(fleet)
    assert [(row.host, row.outcome, row.serving) for row in summary.rows] == [
        ("a", "deployed", "new"), ("b", "failed", "old"), ("c", "deployed", "new"), ("d", "deployed", "new")]
    assert summary.by_release == {"new": ["a", "c", "d"], "old": ["b"]}
    assert summary.rows[1].release == "new" and "rolled back" in summary.rows[1].cause
    assert summary.exit_code == 6 and summary.stopped is None


def test_passing_max_fail_leaves_the_hosts_not_started_untouched_and_lists_them(tmp_path: Path) -> None:
    act = Hosts({"a": failed_and_rolled_back("a"), "b": LockHeld("b: locked by deploy x (pid 1 on y)")})
    progress = RecordingProgress()
    fleet = run_hosts(targets(tmp_path), act, progress, Rollout.parse(["1"], "1"))
    assert act.called == ["a", "b"]  # c and d were never called
    assert fleet.not_started == ["c", "d"] and fleet.failed == ["a", "b"]
    summary = summary_of(fleet)
    assert summary.stopped == "2 hosts failed, more than --max-fail 1"
    assert summary.by_release == {"old": ["a"], "as before": ["b"], "untouched": ["c", "d"]}
    assert summary.exit_code == 6  # the worst host's code: readiness (6) over the lock (4)
    assert "rollout stopped: 2 hosts failed, more than --max-fail 1" in progress.of_kind("note")
    assert progress.of_kind("phase")[:2] == ["batch 1 of 4: a", "batch 2 of 4: b"]


def test_a_host_left_stopped_makes_the_group_exit_8_and_says_so(tmp_path: Path) -> None:
    fleet = run_hosts(targets(tmp_path, "gpu"), Hosts({"c": RollbackFailed("c: both failed; the unit is stopped"),
                                                       "a": RemoteError("a: connection lost")}),
                      RecordingProgress())
    summary = summary_of(fleet)
    assert summary.exit_code == 8
    assert {row.host: row.serving for row in summary.rows} == {"a": "unknown (see status)", "b": "new",
                                                               "c": "none (unit stopped)"}


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_starts_no_further_host_and_lets_the_running_one_finish(tmp_path: Path, signum: int,
                                                                         code: int) -> None:
    finished = []

    def deploy_one(target: Target) -> str:
        if target.host.name == "a":
            os.kill(os.getpid(), signum)  # as Ctrl-C or `kill` reaches the process while host a deploys
        finished.append(target.host.name)
        return "new"
    fleet = run_hosts(targets(tmp_path), deploy_one, RecordingProgress(), Rollout.parse(["1"]))
    assert finished == ["a"] and fleet.not_started == ["b", "c", "d"]
    assert fleet.runs[0].result == "new" and fleet.exit_code == code
    summary = summary_of(fleet)
    assert summary.by_release == {"new": ["a"], "untouched": ["b", "c", "d"]}
    assert summary.interruption == f"interrupted ({signal.Signals(signum).name}): no further host was started; " \
                                   "the hosts already running finished first"


def test_a_bug_in_the_per_host_call_is_not_hidden_as_a_host_failure(tmp_path: Path) -> None:
    def broken(target: Target) -> str:
        raise ZeroDivisionError("bug")
    with pytest.raises(ZeroDivisionError):
        run_hosts(targets(tmp_path), broken, RecordingProgress())


def group_inventory(tmp_path: Path) -> Path:
    """Two hosts nothing listens for (port 1 of loopback: refused at once), in group `pair`."""
    (tmp_path / "known_hosts").write_text("")
    return write(tmp_path, "all:\n  vars: {ansible_port: 1, known_hosts_file: known_hosts, gpu_count: 8}\n"
                           "  children:\n    pair:\n      hosts:\n        one: {ansible_host: 127.0.0.1}\n"
                           "        two: {ansible_host: 127.0.0.1}\n")


@pytest.mark.parametrize(("argv", "message"), [
    (("--host", "one", "--group", "pair"), "error: --host and --group are exclusive"),
    (("--serial", "1"), "error: --serial and --max-fail roll out over a group: give --group G"),
    (("--group", "pair", "--serial", "0"), "error: --serial takes a whole number of hosts (>= 1) or a percentage"),
    (("--group", "pair", "--max-fail", "lots"), "error: --max-fail takes a whole number of hosts (>= 0)"),
    (("--group", "pairs"), "unknown group 'pairs'; did you mean `pair`?"),
])
def test_group_options_that_cannot_work_are_refused_before_any_connection(tmp_path: Path, argv: tuple[str, ...],
                                                                           message: str) -> None:
    """Input tried: the flags in argv against a two-host inventory."""
    ran = invoke("deploy", "--profile", "glm5-nvfp4", "-i", str(group_inventory(tmp_path)), "--yes", *argv)
    assert ran.returncode == 2, ran.stderr
    assert message in ran.stderr
    assert "one" not in ran.stdout  # no result table: nothing ran


def test_an_unreachable_group_fails_host_by_host_and_stops_when_a_whole_batch_failed(tmp_path: Path) -> None:
    ran = invoke("deploy", "--profile", "glm5-nvfp4", "-i", str(group_inventory(tmp_path)), "--group", "pair",
                 "--serial", "1", "--yes", "--json", env={"HF_TOKEN": "x"})
    assert ran.returncode == 5, ran.stderr
    report = json.loads(ran.stdout)
    one, two = report["hosts"]
    assert (report["command"], report["outcome"], report["exit_code"]) == ("deploy", "failed", 5)
    assert (one["host"], one["outcome"], one["exit_code"], one["result"]["exit_code"]) == ("one", "failed", 5, 5)
    assert (two["host"], two["outcome"], two["result"]) == ("two", "not started", None)
    rollout = report["rollout"]
    assert rollout["not_started"] == ["two"] and rollout["stopped"] == "every host of the batch failed (1)"
    assert rollout["serving"] == {"as before": ["one"], "untouched": ["two"]}  # never connected: nothing changed
    assert "one " in ran.stderr  # progress and errors go to stderr, prefixed by the host


def test_read_only_tasks_take_a_group_and_exit_with_the_worst_host_code(tmp_path: Path) -> None:
    ran = invoke("status", "-i", str(group_inventory(tmp_path)), "--group", "pair")
    assert ran.returncode == 5, ran.stderr
    assert "one" in ran.stdout and "two" in ran.stdout  # each host's part under its name
    assert ran.stderr.count("error:") == 2


def test_sandbox_up_brings_up_th1_to_thn_or_the_names_given_never_both() -> None:
    assert names.guest_names([], 0) == ["th1"]
    assert names.guest_names([], 3) == ["th1", "th2", "th3"]
    assert names.guest_names(["a", "b"], 0) == ["a", "b"]
    with pytest.raises(ConfigError, match=r"--name .* or --count N, not both"):
        names.guest_names(["a"], 2)
    with pytest.raises(ConfigError, match="--count takes 1 to 8 guests, got 9"):
        names.guest_names([], 9)


def test_the_sandbox_inventory_puts_every_guest_in_group_sandbox(tmp_path: Path) -> None:
    guests = [manage.Guest(f"th{n}", "running", "10.213.0.1", f"10.213.0.{n + 1}", tmp_path / "key",
                           tmp_path / f"known_hosts_{n}", f"ns{n}", f"ve{n}") for n in (1, 2, 3)]
    path = write(tmp_path, manage.inventory_text(guests))
    assert [host.name for host in load_inventory(path).group(names.GROUP)] == ["th1", "th2", "th3"]
    committed = load_inventory(REPO / "inventory" / "sandbox.yaml")
    assert [host.name for host in committed.group(names.GROUP)] == ["th1"]
