"""The command line as a user meets it: help, short flags, option errors, version (no host involved)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from importlib.metadata import version as package_version
from pathlib import Path, PurePosixPath

import pytest
from helpers.cli import REPO, invoke
from invoke import Collection
from rich.console import Console

import tasks
from deploy_cli import present as ui
from deploy_cli.options import Task
from deploy_lib.commands.deploy import Outcome
from deploy_lib.host.hooks import HookContext, HookEvent, hook_environment
from deploy_lib.outcomes import Action
from deploy_lib.remote import MASK, Put, Step, StepResult


def all_tasks(collection: Collection = tasks.ns, prefix: str = "") -> Iterator[tuple[str, Task]]:
    for name, each in collection.tasks.items():
        yield prefix + name, each
    for name, sub in collection.collections.items():
        yield from all_tasks(sub, f"{prefix}{name}.")


@pytest.mark.parametrize("argv", [("deploy", "--help"), ("render", "--help"), ("status", "-h"), ("logs", "-h"),
                                  ("patches.check", "--help"), ("sandbox.up", "-h")])
def test_help_works_the_usual_way_on_every_kind_of_task(argv: tuple[str, ...]) -> None:
    shown = invoke(*argv)
    assert shown.returncode == 0, shown.stderr
    assert "Options:" in shown.stdout and "error" not in shown.stderr


def test_every_option_of_every_task_has_help_and_is_given_by_name() -> None:
    for name, each in all_tasks():
        assert isinstance(each, Task), f"{name} is not built with deploy_cli.options.task"
        for argument in each.get_arguments():
            assert argument.help, f"{name} --{argument.name} has no help text"
            assert not argument.positional, f"{name} takes {argument.name} positionally"


def test_a_short_flag_means_the_same_option_in_every_task() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for _, each in all_tasks():
        for argument in each.get_arguments():
            for short in (n for n in argument.names if len(n) == 1):
                meanings[short].add(argument.name)
    assert "h" not in meanings, "-h is help"
    assert {short: names for short, names in meanings.items() if len(names) > 1} == {}
    assert meanings["H"] == {"host"} and meanings["s"] == {"service"}


def test_a_number_option_given_a_word_is_a_sentence_and_exit_2() -> None:
    """Input tried: `logs -n abc` (it printed a ValueError traceback)."""
    refused = invoke("logs", "-n", "abc")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: -n/--lines takes a whole number (0 or more), got 'abc'"


@pytest.mark.parametrize("argv", [("logs", "--lines=-5"), ("logs", "-n", "-5", "-H", "nosuch")])
def test_a_negative_count_is_refused_before_any_host(argv: tuple[str, ...]) -> None:
    """Input tried: `logs --lines=-5` and `logs -n -5` (both were accepted and passed to journalctl)."""
    refused = invoke(*argv)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: -n/--lines takes a whole number (0 or more), got '-5'"


@pytest.mark.parametrize(("where", "why"), [("no/such/dir/x.json", "No such file or directory"),
                                          ("", "Is a directory")])
def test_a_schema_that_cannot_be_written_is_a_sentence_and_exit_2(tmp_path: Path, where: str, why: str) -> None:
    """Input tried: `schema -o /no/such/dir/x.json` (a FileNotFoundError traceback) and `schema -o` a directory."""
    output = tmp_path / where
    refused = invoke("schema", "-o", str(output))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == f"error: -o/--output {output}: cannot write the schema there: {why}"


def test_a_missing_required_option_names_it() -> None:
    refused = invoke("venv.adopt")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: adopt needs --path (the hand-made venv on the host")


def test_a_deploy_without_a_profile_takes_the_inventorys_or_says_what_to_give(tmp_path: Path) -> None:
    """Input tried: `deploy` with no --profile, against an inventory without and with a `profile` var."""
    (tmp_path / "hosts.yaml").write_text("all: {hosts: {gpu1: {ansible_host: 192.0.2.10}}}\n")
    refused = invoke("deploy", "-i", "hosts.yaml", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"error: which profile for gpu1? none was given and {tmp_path}/hosts.yaml "
                                     "sets no `profile` for the host")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text("model: {path: m}\nparallel: {tp: 2}\n")
    (tmp_path / "hosts.yaml").write_text(
        "all: {hosts: {gpu1: {ansible_host: 192.0.2.10, profile: profiles/mine.yaml}}}\n")
    shown = invoke("render", "-i", str(tmp_path / "hosts.yaml"))
    assert shown.returncode == 0, shown.stderr
    assert "--tp-size 2" in shown.stdout and "profile mine" in shown.stdout


def test_version_prints_the_tools_version() -> None:
    installed = subprocess.run([sys.executable, "-c", "import sys; from deploy_cli.program import main; "
                                "sys.argv = ['sglang-deploy', '--version']; main()"],
                               capture_output=True, text=True, cwd=REPO, check=True)
    assert installed.stdout.strip() == f"sglang-deploy {package_version('sglang-deploy')}"
    shown = invoke("version")
    assert shown.returncode == 0
    assert shown.stdout.strip() == f"sglang-deploy {package_version('sglang-deploy')}"


def test_a_profile_is_given_by_name_or_by_path_and_paths_are_from_the_working_directory() -> None:
    """Input tried: from inventory/, `render --profile profiles/glm5-nvfp4-fusion.yaml -i hosts.yaml` (the path
    was refused as a profile name, and -i was read from the project root)."""
    by_path = invoke("render", "--profile", "profiles/glm5-nvfp4-fusion.yaml", "-i", "hosts.yaml",
                     cwd=REPO / "inventory")
    by_name = invoke("render", "--profile", "glm5-nvfp4-fusion")
    assert by_path.returncode == 0, by_path.stderr
    assert "--flashinfer-allreduce-fusion-backend auto" in by_path.stdout
    assert by_path.stdout == by_name.stdout


def test_a_relative_inventory_that_is_not_in_the_working_directory_is_named_as_given(tmp_path: Path) -> None:
    refused = invoke("render", "-p", "glm5-nvfp4", "-i", "hosts.yaml", cwd=tmp_path)
    assert refused.returncode == 2
    assert str(tmp_path / "hosts.yaml") in refused.stderr


def test_plan_against_another_profile_names_where_a_secret_comes_from_not_a_value(tmp_path: Path) -> None:
    """Input tried: `plan --against` with HF_TOKEN unset (it printed `+ secret HF_TOKEN = (set)`)."""
    (tmp_path / "base.yaml").write_text("model: {path: m}\n")
    (tmp_path / "token.yaml").write_text("extends: base\nsecrets: {HF_TOKEN: {env: HF_TOKEN}}\n")
    shown = invoke("plan", "-p", str(tmp_path / "token.yaml"), "--against", str(tmp_path / "base.yaml"))
    assert shown.returncode == 0, shown.stderr
    assert "  + secret HF_TOKEN = {env: HF_TOKEN}" in shown.stdout.splitlines()
    assert "(set)" not in shown.stdout


def test_an_inventory_typo_is_a_warning_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("all: {hosts: {gpu1: {ansible_hots: 192.0.2.10, gpu_count: 8}}}\n")
    shown = invoke("render", "-p", str(REPO / "inventory" / "profiles" / "glm5-nvfp4.yaml"), "-i", "hosts.yaml",
                   cwd=tmp_path)  # tmp_path holds no inventory/: no project, so the profile is given by its path
    assert shown.returncode == 0, shown.stderr
    assert (f"warning: {tmp_path}/hosts.yaml: host gpu1: ansible_hots is not a var sglang-deploy reads, so it is "
            "ignored; did you mean `ansible_host`?") in shown.stderr.replace("\n", " ")


@pytest.mark.parametrize("argv", [("deploy", "--json", "-p", "no-such-profile"), ("releases", "--json", "-H", "nosuch"),
                                  ("rollback", "--json", "-H", "nosuch"), ("plan", "--json", "-p", "no-such-profile")])
def test_json_is_one_document_on_stdout_even_when_the_command_fails(argv: tuple[str, ...]) -> None:
    failed = invoke(*argv)
    document = json.loads(failed.stdout)
    assert failed.returncode == document["exit_code"] == 2 and document["command"] == argv[0]
    assert document["outcome"] == "failed" and document["error"]["type"] == "ConfigError"
    assert document["error"]["exit_code"] == 2 and document["error"]["message"]
    for host in document["hosts"]:  # a failed deploy's keys, under the one host it chose
        assert {"release", "previous", "timings", "cause", "hint", "exit_code"} <= set(host["result"])
    assert failed.stderr.startswith("error: ")


def test_status_json_of_a_host_it_cannot_read_is_the_envelope_with_the_cause() -> None:
    """Input tried: `status --json -H nosuch` (it printed a deploy's outcome: release, previous, timings; then a
    status report of unknowns of its own shape)."""
    failed = invoke("status", "--json", "-H", "nosuch")
    document = json.loads(failed.stdout)
    assert failed.returncode == document["exit_code"] == 2
    assert (document["command"], document["outcome"], document["hosts"]) == ("status", "failed", [])
    assert document["error"]["type"] == "ConfigError" and "unknown host 'nosuch'" in document["error"]["message"]


def test_a_deploy_outcome_as_json_has_release_previous_timings_cause_and_exit_code() -> None:
    outcome = Outcome(Action.deployed, "8e51991efed1", "1850be766a74", timings={"stage": 0.29, "readiness": 7.6})
    assert json.loads(json.dumps(ui.outcome_json(outcome))) == {
        "outcome": "deployed", "release": "8e51991efed1", "previous": "1850be766a74",
        "timings": {"stage": 0.29, "readiness": 7.6}, "ready_s": None, "downtime": None, "clients": None, "cause": None,
        "hint": None, "exit_code": 0,
        "changes": [], "secrets_not_available": {}, "overrides": []}


@pytest.mark.parametrize(("action", "in_json", "printed", "hooks_see"), [
    (Action.deployed, "deployed", "deployed: release A is serving (was B);", "deployed"),
    (Action.rolled_back, "rolled back", "rolled back: release A is serving (was B);", "rolled-back"),
    (Action.unchanged, "unchanged", "no changes: release A is current and running", "unchanged"),
    (Action.already_running, "already running", "already running: release A", "already-running")])
def test_an_outcome_is_spelled_as_the_readme_documents_it_in_json_terminal_and_hooks(
        action: Action, in_json: str, printed: str, hooks_see: str) -> None:
    """docs/commands.md "Scripting" (`outcome`: `rolled back` ...) and docs/hooks.md (SGLANG_DEPLOY_OUTCOME:
    `rolled-back` ...)."""
    outcome = Outcome(action, "A", "B")
    assert json.loads(json.dumps(ui.outcome_json(outcome)))["outcome"] == in_json
    with ui.console.capture() as shown:
        ui.print_outcome(outcome)
    assert shown.get().startswith(printed)
    told = hook_environment(HookEvent.post_deploy, HookContext("deploy", ("gpu1",), outcome=action), {})
    assert told["SGLANG_DEPLOY_OUTCOME"] == hooks_see


def test_tables_fit_the_width_in_columns() -> None:
    """Input tried: `COLUMNS=70 invoke releases | cat` (tables were always 120 wide when piped)."""
    script = ("from deploy_cli import reports as ui; from deploy_lib.commands.releases import ReleaseRow; "
              "ui.print_releases([ReleaseRow('8e51991efed1', '2026-11-29T11:50:00', 'glm5-nvfp4-fusion+fusion-sm120', "
              "'0.5.23', 'healthy', True, 'c64: 871.2 tok/s, c1024: 3,582.0 tok/s')])")
    for columns, width in (("70", 70), (None, 120)):
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
        shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                               check=True).stdout
        assert max(len(line) for line in shown.splitlines()) == width


def test_verbose_shows_each_remote_step_with_its_output_and_masks_secrets() -> None:
    out = Console(file=io.StringIO(), width=200)
    show = ui.step_printer(out)
    show(StepResult(Step("read facts", ("systemctl", "show", "sglang.service")), 0, "ActiveState=active\n", "", 0.05))
    show(StepResult(Put(PurePosixPath("/opt/d/sglang.env"), b"HF_TOKEN=hf_x", 0o600, secret=True), 0, "", "", 0.01))
    show(StepResult(Step("secret", ("tee", "x"), stdin=b"hf_x", secret=True), 1, "hf_x", "", 0.01))
    lines = out.file.getvalue().splitlines()
    assert lines[0] == "  $ systemctl show sglang.service (exit 0, 0.05 s)"
    assert lines[1] == "    | ActiveState=active"
    assert "hf_x" not in "\n".join(lines) and lines[-1] == f"    | {MASK}"


@pytest.mark.parametrize("task", [["patch-fusion"], ["patch", "--name", "fusion-sm120", "--check", "--audit"]])
def test_patch_without_one_action_is_a_sentence_and_exit_2(task: list[str]) -> None:
    refused = invoke(*task)
    assert (refused.returncode, refused.stderr.strip()) == (
        2, "error: give exactly one of --enable, --disable, --check, --audit")


def test_the_whole_no_op_deploy_renders_neither_the_unit_nor_the_env_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deploy engine's no-op (facts, plan, preflight, the live probe: its one round trip) against a scripted host
    that serves the profile's release; a render would raise."""
    from helpers.deploy_plan import PROJECT, target
    from helpers.deploy_trips import serving_the_profile
    from helpers.recording_progress import RecordingProgress

    import deploy_lib.release.model
    from deploy_lib.commands.deploy import Options, deploy
    host, release_id = serving_the_profile()
    for name in ("render_digested_unit", "render_launcher", "render_env", "render_env_redacted"):
        monkeypatch.setattr(deploy_lib.release.model, name, lambda *_: pytest.fail("a no-op rendered a release file"))
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (outcome.action, outcome.release_id) == ("unchanged", release_id)


@pytest.mark.parametrize("no_bytecode", [False, True])
def test_the_sglang_deploy_command_loads_no_tasks_py_and_writes_the_bytecode_of_what_it_imports(
        tmp_path: Path, no_bytecode: bool) -> None:
    """`sglang-deploy` runs the package's own tasks (no tasks.py is looked for: an installed tool has none; failed
    before: the command needed the checkout's tasks.py); its own parse of the command line leaves bytecode writing to
    Python (invoke's parse switches it off unless --write-pyc). PYTHONDONTWRITEBYTECODE wins."""
    script = "import sys; from deploy_cli.program import main; sys.argv[0] = 'sglang-deploy'; main()"
    environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "PYTHONDONTWRITEBYTECODE")}
    shown = subprocess.run([sys.executable, "-c", script, "render", "-p", "glm5-nvfp4"], capture_output=True,
                           text=True, cwd=REPO, timeout=120, env=environ | {"PYTHONPYCACHEPREFIX": str(tmp_path)} | (
                               {"PYTHONDONTWRITEBYTECODE": "1"} if no_bytecode else {}))
    assert shown.returncode == 0, shown.stderr
    assert "--tp-size" in shown.stdout
    assert list((tmp_path / REPO.relative_to(REPO.anchor)).glob("tasks.*.pyc")) == []  # the prefix mirrors the path
    written = {f"{path.parent.name}/{path.name.split('.')[0]}" for path in tmp_path.rglob("*.pyc")
               if "deploy_lib" in path.parts}  # the prefix mirrors the source tree: <folder>/<module>.cpython-3xx.pyc
    assert written == set() if no_bytecode else {"deploy/project", "release/model", "release/render"} <= written


def test_patch_without_a_set_is_exit_2_naming_the_option() -> None:
    refused = invoke("patch", "--check")
    assert refused.returncode == 2 and "--name" in refused.stderr


@pytest.mark.parametrize("argv", [("patch", "--name", "fusion-sm120"), ("patches.check", "--name", "fusion-sm120")])
def test_a_patch_sets_name_is_given_as_name_everywhere(argv: tuple[str, ...]) -> None:
    """Input tried: the spellings above with --check against a host not in the inventory: each parses and reaches the
    host lookup (before: `patches.check NAME` in the README did not parse, `patch` knew only --set). `patch --set`,
    the first spelling, is refused naming --name (tests/test_mistakes.py): --set is a profile override elsewhere."""
    refused = invoke(*argv, "--check", "-H", "nosuch") if argv[0] == "patch" else invoke(*argv, "-H", "nosuch")
    assert refused.returncode == 2 and "unknown host 'nosuch'" in refused.stderr


# render: --host picks the inventory's vars only; init: --host is the address it writes; every other one talks to
# the host
HOST_TASKS_WITHOUT_VERBOSE = {"render", "init"}
JSON_TASKS = {"plan", "render", "logs", "model.list", "patches.list", "patches.check", "patches.audit",
              "patches.enable", "patches.disable", "patch", "patch-fusion", "status", "releases", "deploy",
              "rollback", "venv.list", "bench"}


def test_every_task_that_talks_to_a_host_takes_verbose_and_the_reporting_ones_take_json() -> None:
    """Input tried: `stop -v`, `start -v`, `restart -v`, `uninstall -v`, `adopt -v`, `venv.remove -v`, `model.list -v`
    (refused before), and --json on plan, render, logs, model.list, patches.* (refused before)."""
    options = {name: set(each.option_help) for name, each in all_tasks()}
    no_verbose = {name for name, taken in options.items() if "host" in taken and "verbose" not in taken}
    assert no_verbose == HOST_TASKS_WITHOUT_VERBOSE
    assert {name for name in JSON_TASKS if "json" not in options[name]} == set()
