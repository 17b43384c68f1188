"""Every task's `--json` is one document of one shape (deploy_cli/envelope.py, the reference's "JSON output"): run
in-process through the program as a user types it, each task that takes --json on a host the inventory lacks (its
error), and the ones that need no host or run against a scripted host to the end (their result, or the host's error,
under `hosts`). Issue 40: `status --group` was keyed by host, `deploy --group` nested hosts under `hosts`, `plan
--against` had no `outcome` or `exit_code`, and a refusal under --json printed nothing on stdout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import REPO
from helpers.deploy_trips import serving_the_profile
from helpers.fake_remote import FakeRemote
from helpers.host_lock import HOLDER
from helpers.router import answering
from helpers.router import inventory as router_inventory
from helpers.venv_host import INSPECTION
from helpers.venv_host import host as venv_host

from deploy_cli import common
from deploy_cli.collection import user_tasks
from deploy_cli.envelope import SCHEMA_VERSION, Envelope
from deploy_cli.options import Task
from deploy_cli.program import NAME, DeployProgram, OneTaskExecutor
from deploy_lib.host import venv_adopt
from deploy_lib.store import FACT_BOOT_ID, FACT_CLOCK, FACT_LOCK, FACT_LOCK_BOOT, FACT_LOCK_OWNER

INVENTORY = "all:\n  hosts:\n    gpu1: {ansible_host: 192.0.2.10, gpu_count: 8, gpu_arch: sm120}\n"
# a value for each task's required option, where it has one
REQUIRED = {"name": "fusion-sm120", "tune_id": "t20261201-120000-ab12", "group": "nosuch", "profile": "glm5-nvfp4",
            "path": "/root/ml-env", "venv_hash": "0123456789ab"}
# what a task needs besides its required options to get as far as choosing its host
GIVEN = {"patch": ["--check"], "patch-fusion": ["--check"], "tune": ["--vary", "memory.max_running_requests=64,256"],
         "adopt": ["--pid", "4242"]}
READS_NO_HOST = ("patches.list", "version", "init")


def json_tasks() -> list[str]:
    """Every task that takes --json, by the name a user types."""
    tasks = user_tasks()
    named = [min((name, *aliases), key=len) for name, aliases in tasks.task_names.items()]
    return [name for name in named if isinstance(tasks[name], Task) and "json" in tasks[name].option_help]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The checkout as the project (its profiles), an inventory of one host gpu1 in tmp_path."""
    monkeypatch.chdir(REPO)
    for name in ("SGLANG_DEPLOY_INVENTORY", "SGLANG_DEPLOY_PROJECT", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(INVENTORY)
    yield inventory


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Envelope, str]:
    """`sglang-deploy ARGV` through the program's own run: exit code, the document (checked against the model:
    every key known, none missing), stderr."""
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=user_tasks(),
                            executor_class=OneTaskExecutor)
    try:
        program.run([NAME, *argv])
        code = 0
    except SystemExit as ended:
        code = int(ended.code or 0)
    shown = capsys.readouterr()
    document = json.loads(shown.out)
    return code, Envelope.model_validate(document, strict=False), shown.err


def test_every_task_that_takes_json_is_listed() -> None:
    assert {"deploy", "rollback", "plan", "render", "status", "releases", "logs", "bench", "gpu-check", "report",
            "stop", "start", "restart", "uninstall",
            "patches.list", "patch", "tune", "tune.show", "venv.list", "model.list", "router.deploy",
            "router.status", "unlock", "adopt", "venv.build", "venv.adopt", "venv.remove", "init",
            "version"} <= set(json_tasks())


@pytest.mark.parametrize("task", [task for task in json_tasks() if task not in READS_NO_HOST])
def test_a_tasks_error_under_json_is_the_one_document(task: str, project: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each task on a host the inventory lacks (a group the inventory lacks for router.*): exit 2, the document
    with the error."""
    options = user_tasks()[task].option_help
    argv = [task, "--json", *(("-i", str(project)) if "inventory" in options else ()),
            *(("-H", "nosuch") if "host" in options else ())]
    for name in user_tasks()[task].required:
        # adopt writes a new profile: the reference profile's name is refused before the host
        argv += [f"--{name.replace('_', '-')}", "hand-made" if task == "adopt" else REQUIRED[name]]
    argv += GIVEN.get(task, [])
    code, document, err = run_json(capsys, *argv)
    assert (document.schema_version, document.command, document.exit_code) == (SCHEMA_VERSION, task, code)
    assert code == 2 and document.outcome == "failed" and document.hosts == []
    assert document.error is not None and document.error.type == "ConfigError" and document.error.exit_code == 2
    assert "nosuch" in document.error.message and err.startswith("error: ")


def test_render_and_plan_against_give_their_document_as_the_hosts_result(project: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """render and plan --against read no host: their result is under the host they were given."""
    code, rendered, _ = run_json(capsys, "render", "-p", "glm5-nvfp4", "-i", str(project), "--json")
    assert (code, rendered.outcome, rendered.error) == (0, "ok", None)
    [host] = rendered.hosts
    assert host.host == "gpu1" and "--tp-size" in host.result["args"] and host.result["unit_file"]
    code, planned, _ = run_json(capsys, "plan", "-p", "glm5-nvfp4", "--against", "glm5-nvfp4-fusion", "-i",
                                str(project), "--json", "--detailed-exitcode")
    assert (code, planned.exit_code, planned.outcome) == (2, 2, "ok")  # 2: something would change
    [host] = planned.hosts
    assert (host.host, host.outcome) == ("gpu1", "planned")
    assert host.result["from"] == "glm5-nvfp4-fusion" and host.result["changes"]


def test_a_refused_combination_under_json_is_a_document_with_the_refusal(project: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --against --group` was refused with nothing on stdout."""
    code, document, err = run_json(capsys, "plan", "-p", "glm5-nvfp4", "--against", "x", "--group", "all", "--json",
                                   "-i", str(project))
    assert code == document.exit_code == 2 and document.outcome == "failed"
    assert document.error is not None and document.error.type == "UsageError"
    assert document.error.message.startswith("--against compares two profiles") and "--against" in err


@pytest.mark.parametrize("task", ["plan", "deploy"])
def test_a_plan_on_a_fake_host_is_the_hosts_result(task: str, project: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """plan, and deploy --dry-run, against a host serving the profile with one override: the host's outcome
    `planned`, its result the deploy's document as before (changes, overrides)."""
    host, _ = serving_the_profile()
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(host))
    extra = ("--dry-run",) if task == "deploy" else ()
    code, document, _ = run_json(capsys, task, "-p", "glm5-nvfp4", "--set", "memory.max_running_requests=512", "-i",
                                 str(project), "--json", *extra)
    assert (code, document.outcome, document.error, document.rollout) == (0, "ok", None, None)
    [planned] = document.hosts
    assert (planned.host, planned.outcome, planned.exit_code) == ("gpu1", "planned", 0)
    assert planned.result["outcome"] == "planned" and planned.result["overrides"] == ["memory.max_running_requests=512"]
    assert planned.result["changes"]


GROUP = ("all:\n  children:\n    pair:\n      hosts:\n"
         "        one: {ansible_host: 192.0.2.11, gpu_count: 8, gpu_arch: sm120}\n"
         "        two: {ansible_host: 192.0.2.12, gpu_count: 8, gpu_arch: sm120}\n")


@pytest.mark.parametrize("task", ["releases", "status"])
def test_a_groups_read_is_one_result_per_host_as_for_one_host(task: str, project: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`status --group` was keyed by host: now each host is an element of `hosts`, its result as for one host."""
    project.write_text(GROUP)
    hosts = {name: serving_the_profile()[0] for name in ("one", "two")}
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(hosts[found.host.name]))
    code, alone, _ = run_json(capsys, task, "-H", "one", "-i", str(project), "--json")
    code_group, group, _ = run_json(capsys, task, "--group", "pair", "-i", str(project), "--json")
    assert [host.host for host in group.hosts] == ["one", "two"] and group.rollout is None
    assert (code, code_group, alone.exit_code, group.exit_code, group.outcome) == (0, 0, 0, 0, "ok")
    [one] = alone.hosts
    assert (one.host, one.outcome, one.error) == ("one", "ok", None)
    assert [host.outcome for host in group.hosts] == ["ok", "ok"]
    assert type(one.result) is type(group.hosts[0].result) and one.result  # the same report, host by host
    if isinstance(one.result, dict):  # status: a status report
        assert set(one.result) == set(group.hosts[0].result) and one.result["current"]
    else:  # releases: the list of releases, the current one marked
        assert [row["is_current"] for row in one.result].count(True) == 1


def test_a_plans_error_with_detailed_exitcode_is_1_and_keeps_its_own_code(project: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, document, _ = run_json(capsys, "plan", "-p", "no-such-profile", "-i", str(project), "--json",
                                 "--detailed-exitcode")
    assert code == document.exit_code == 1 and document.outcome == "failed"
    assert document.error is not None and document.error.exit_code == 2


# (the command line after the task, how it ends on a host serving the reference profile: `ok`, or the error the
# scripted host leads to); {out}: a directory to write in, {rid}: the current release.
ON_A_SERVING_HOST = [
    (["logs"], "ok"),
    (["model.list"], "ok"),
    (["venv.list"], "ok"),
    (["unlock", "--yes"], "ok"),  # there was no lock
    (["uninstall", "--yes"], "ok"),
    (["patches.enable", "--name", "fusion-sm120", "--yes"], "PreflightError"),  # nvidia-smi lists no GPU
    (["patches.disable", "--name", "fusion-sm120", "--yes"], "PreflightError"),
    (["bench"], "ok"),
    (["report", "--out", "{out}"], "ok"),
    (["tune", "-p", "glm5-nvfp4", "--vary", "memory.max_running_requests=64,256", "--dry-run"], "ok"),
    (["stop", "--yes"], "ok"),
    (["start", "--yes"], "ok"),
    (["restart", "--yes"], "ok"),
    (["rollback", "--yes"], "PreflightError"),  # release B's files differ from their record
    (["tune.show", "--tune-id", "t20261201-120000-ab12"], "ConfigError"),  # no such sweep in its history
    (["bench", "--compare", "B", "--compare", "{rid}"], "ConfigError"),  # no benchmark recorded
    (["gpu-check"], "PreflightError"),  # the server holds the GPUs
    (["patches.check", "--name", "fusion-sm120"], "PreflightError"),  # nvidia-smi lists no GPU
    (["patch", "--name", "fusion-sm120", "--check"], "PreflightError"),
    (["patches.audit", "--name", "fusion-sm120"], "PreflightError"),
    (["workload", "--name", "w", "--window", "2s", "--every", "1s"], "PreflightError"),  # metrics are off
    (["venv.adopt", "--path", "/root/ml-env", "--yes"], "PreflightError"),  # no python in it
    (["venv.remove", "--venv-hash", "0123456789ab", "--yes"], "ConfigError"),  # no such managed venv
    (["venv.build", "-p", "glm5-nvfp4", "--yes"], "ConfigError"),  # the profile has no service.venv_build
    (["adopt", "--profile", "hand-made", "--pid", "4242", "--yes"], "PreflightError"),  # not an SGLang server
]


@pytest.mark.parametrize(("argv", "ends"), ON_A_SERVING_HOST, ids=[" ".join(case[0]) for case in ON_A_SERVING_HOST])
def test_a_command_on_a_host_is_the_one_document_with_that_host(argv: list[str], ends: str, project: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    """Each task that reads or changes a host, run to its end on a scripted host: the document validates, names the
    host, and carries the command's report as the host's result, or its error both as the document's and the
    host's."""
    host, rid = serving_the_profile()
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(host))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # where uninstall copies the host's history
    given = [word.format(out=tmp_path / "report", rid=rid) for word in argv]
    code, document, _ = run_json(capsys, *given, "-i", str(project), "--json")
    assert (document.command, document.exit_code) == (argv[0], code)
    [on_host] = document.hosts
    assert on_host.host == "gpu1" and on_host.exit_code == code
    if ends == "ok":
        assert (code, document.outcome, document.error, on_host.error) == (0, "ok", None, None)
        assert on_host.outcome != "failed" and on_host.result is not None
    else:
        assert code and (document.outcome, on_host.outcome) == ("failed", "failed")
        assert document.error is not None and document.error.type == ends and on_host.error == document.error


def test_version_and_init_read_no_host_and_report_under_a_null_host(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`version --json` and `init --json` (which refused --json before): their report is the one result, under no
    host; init's lists the files it wrote, and a second init there is its error in the document."""
    code, shown, _ = run_json(capsys, "version", "--json")
    assert (code, shown.outcome, shown.error) == (0, "ok", None)
    [tool] = shown.hosts
    assert tool.host is None and tool.result["version"]
    argv = ("init", "--model", "Qwen/Qwen3-8B", "--host", "192.0.2.10", "--directory", str(tmp_path), "--json")
    code, started, _ = run_json(capsys, *argv)
    assert (code, started.outcome, started.error) == (0, "ok", None)
    [written] = started.hosts
    assert written.host is None and written.result["profile"] == "qwen3-8b" and written.result["host_needs"]
    assert all(Path(path).is_file() for path in written.result["written"])
    code, again, err = run_json(capsys, *argv)
    assert code == again.exit_code == 2 and again.outcome == "failed" and again.hosts == []
    assert again.error is not None and again.error.type == "ConfigError" and "overwrites nothing" in err


@pytest.mark.parametrize("task", ["docs", "schema"])
def test_docs_and_schema_refuse_json_with_the_document(task: str, capsys: pytest.CaptureFixture[str]) -> None:
    """docs prints a page of the guide and schema a JSON Schema already: --json is refused, as the document."""
    code, document, _ = run_json(capsys, task, "--json")
    assert task not in json_tasks() and (code, document.command, document.outcome) == (2, task, "failed")
    assert document.error is not None and document.error.type == "UsageError" and "--json" in document.error.message


@pytest.mark.parametrize("task", READS_NO_HOST)
def test_a_command_that_reads_no_host_refuses_a_flag_it_lacks_in_the_document(task: str,
                                                                             capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    code, document, _ = run_json(capsys, task, "--json", "--group", "gpu")
    assert (code, document.command, document.outcome, document.hosts) == (2, task, "failed", [])
    assert document.error is not None and document.error.type == "UsageError" and "--group" in document.error.message


@pytest.mark.parametrize(("answer", "code"), [({"workers": [{"url": "http://192.0.2.2:8000", "is_healthy": True}]}, 0),
                                              ({"error": "connection refused"}, 10)])
def test_router_status_is_the_routers_host_with_its_workers_or_its_error(answer: dict[str, Any], code: int,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """router.status on a group behind a router: the router's host, the workers it lists as its result, or the
    router's failure as the document's and the host's error."""
    router = answering(list=answer)
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(router))
    got, document, _ = run_json(capsys, "router.status", "--group", "replicas", "-i", str(router_inventory(tmp_path)),
                                "--json")
    [edge] = document.hosts
    assert (got, document.exit_code, edge.host, edge.exit_code) == (code, code, "edge", code)
    if code:
        assert document.outcome == edge.outcome == "failed"
        assert document.error is not None and document.error.type == "RouterFailed" and edge.error == document.error
    else:
        assert (document.outcome, edge.outcome, edge.error) == ("ok", "ok", None)
        assert edge.result == answer["workers"]


@pytest.mark.parametrize(("force", "code"), [(True, 0), (False, 4)])
def test_unlock_reports_the_lock_it_removed_or_the_holder_it_left(force: bool, code: int, project: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A lock a live owner took in this boot: `unlock --force` removes it and names its owner as the result,
    `unlock` leaves it and the document carries LockHeld."""
    held = (FakeRemote().reply(FACT_CLOCK, stdout="1764634200\n").reply(FACT_LOCK, stdout="1764634170\n")
            .reply(FACT_LOCK_OWNER, stdout=HOLDER.to_json().decode())
            .reply(FACT_LOCK_BOOT, stdout="boot-1\n").reply(FACT_BOOT_ID, stdout="boot-1\n"))
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(held))
    got, document, _ = run_json(capsys, "unlock", "--yes", *(("--force",) if force else ()), "-i", str(project),
                                "--json")
    [on_host] = document.hosts
    assert (got, document.exit_code, on_host.host, on_host.exit_code) == (code, code, "gpu1", code)
    if force:
        assert (document.outcome, on_host.error) == ("ok", None)
        assert on_host.result["removed"]["owner"]["purpose"] == HOLDER.purpose
    else:
        assert document.error is not None and document.error.type == "LockHeld" and on_host.error == document.error


def test_venv_adopt_and_remove_report_the_venv_they_made_and_what_they_removed(project: Path,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    """venv.adopt of a hand-made venv: its hash, path and drift as the host's result; venv.remove of that hash on a
    host that holds it: the venvs it removed."""
    adopting = venv_host().reply(venv_adopt.FACT_INSPECT, stdout=json.dumps(INSPECTION) + "\n")
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(adopting))
    code, adopted, _ = run_json(capsys, "venv.adopt", "--path", "/root/ml-env", "--yes", "-i", str(project), "--json")
    [on_host] = adopted.hosts
    assert (code, adopted.outcome, on_host.host, on_host.error) == (0, "ok", "gpu1", None)
    made = on_host.result
    assert made["path"].endswith(made["hash"]) and not made["reused"] and list(made["drift"]) == ["sglang"]
    marker = {"hash": made["hash"], "kind": "adopted"}
    holding = venv_host(markers={made["hash"]: marker}).reply(FACT_LOCK, exit_code=1)  # no lock on the store
    monkeypatch.setattr(common, "remote", lambda found, prefixed=False: nullcontext(holding))
    code, removed, _ = run_json(capsys, "venv.remove", "--venv-hash", made["hash"], "--yes", "-i", str(project),
                                "--json")
    [on_host] = removed.hosts
    assert (code, removed.outcome, on_host.host, on_host.error) == (0, "ok", "gpu1", None)
    assert on_host.result["venvs"] == [made["hash"]]
