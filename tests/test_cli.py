"""The command line as a user meets it: help, short flags, option errors, version (no host involved)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from importlib.metadata import version as package_version
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from helpers.cli import REPO, invoke
from invoke import Collection
from rich.console import Console

import tasks
from deploy_cli import present as ui
from deploy_cli.options import Task
from deploy_lib.deploy import Outcome
from deploy_lib.remote import MASK, Put, Step, StepResult


def fresh_process_json(script: str, *argv: str) -> Any:
    """What `script`, run by a new interpreter in the checkout, printed as JSON (its exit status 0)."""
    shown = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


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
    assert refused.stderr.strip() == "error: --lines takes a whole number (0 or more), got 'abc'"


@pytest.mark.parametrize("argv", [("logs", "--lines=-5"), ("logs", "-n", "-5", "-H", "nosuch")])
def test_a_negative_count_is_refused_before_any_host(argv: tuple[str, ...]) -> None:
    """Input tried: `logs --lines=-5` and `logs -n -5` (both were accepted and passed to journalctl)."""
    refused = invoke(*argv)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: --lines takes a whole number (0 or more), got '-5'"


@pytest.mark.parametrize(("where", "why"), [("no/such/dir/x.json", "No such file or directory"),
                                          ("", "Is a directory")])
def test_a_schema_that_cannot_be_written_is_a_sentence_and_exit_2(tmp_path: Path, where: str, why: str) -> None:
    """Input tried: `schema -o /no/such/dir/x.json` (a FileNotFoundError traceback) and `schema -o` a directory."""
    output = tmp_path / where
    refused = invoke("schema", "-o", str(output))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == f"error: cannot write the schema to {output}: {why}"


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
    assert failed.returncode == document["exit_code"] == 2
    assert document["outcome"] == "failed" and document["error"] == "ConfigError"
    assert {"release", "previous", "timings", "cause", "hint", "exit_code"} <= set(document)
    assert failed.stderr.startswith("error: ")


def test_status_json_of_a_host_it_cannot_read_is_a_status_report_with_the_cause() -> None:
    """Input tried: `status --json -H nosuch` (it printed a deploy's outcome: release, previous, timings)."""
    failed = invoke("status", "--json", "-H", "nosuch")
    document = json.loads(failed.stdout)
    assert failed.returncode == document["exit_code"] == 2
    assert (document["host"], document["service"], document["unit_state"], document["current"]) == \
        ("nosuch", "sglang", "unknown", None)
    assert document["error"] == "ConfigError" and "unknown host 'nosuch'" in document["cause"]
    assert not {"release", "previous", "timings", "outcome"} & set(document)


def test_a_deploy_outcome_as_json_has_release_previous_timings_cause_and_exit_code() -> None:
    outcome = Outcome("deployed", "8e51991efed1", "1850be766a74", timings={"stage": 0.29, "readiness": 7.6})
    assert json.loads(json.dumps(ui.outcome_json(outcome))) == {
        "outcome": "deployed", "release": "8e51991efed1", "previous": "1850be766a74",
        "timings": {"stage": 0.29, "readiness": 7.6}, "ready_s": None, "cause": None, "hint": None, "exit_code": 0,
        "changes": [], "secrets_not_available": {}, "overrides": []}


def test_tables_fit_the_width_in_columns() -> None:
    """Input tried: `COLUMNS=70 invoke releases | cat` (tables were always 120 wide when piped)."""
    script = ("from deploy_cli import reports as ui; from deploy_lib.commands.status import ReleaseRow; "
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


@pytest.mark.parametrize("task", [["patch-fusion"], ["patch", "--set", "fusion-sm120", "--check", "--audit"]])
def test_patch_without_one_action_is_a_sentence_and_exit_2(task: list[str]) -> None:
    refused = invoke(*task)
    assert (refused.returncode, refused.stderr.strip()) == (
        2, "error: give exactly one of --enable, --disable, --check, --audit")


def test_loading_the_tasks_leaves_the_template_engine_patch_sets_and_sandbox_rig_unloaded() -> None:
    """Each `invoke` command pays for what tasks.py imports: only what a command runs is loaded, in its task. Was:
    the failure table and Fabric loaded by every command (the progress printer's log-line shortener, the remote
    package's FabricRemote, the SSH settings' connection type)."""
    script = "import json, sys; import tasks; print(json.dumps(sorted(sys.modules)))"
    loaded = set(fresh_process_json(script))
    not_needed = {"jinja2", "deploy_lib.release.render", "deploy_lib.deploy", "deploy_lib.patches",
                  "deploy_lib.commands", "deploy_lib.gpu_check", "deploy_lib.facts.diagnose", "fabric",
                  "deploy_lib.remote.connection", "sandbox.manage", "sandbox.hub", "sandbox.wheelhouse"}
    assert not_needed & loaded == set()


def test_loading_the_tasks_builds_no_model_s_validator() -> None:
    """pydantic builds a model's validator when a command first validates one (defer_build), not when tasks.py
    imports it: `--list`, `--help` and the commands that read no profile skip the work (~17 ms of CPU, measured by
    `invoke --list`). Was: every profile section's validator built at import, by the `= ParallelSpec()` defaults."""
    script = ("import json, sys; import tasks; from pydantic import BaseModel; "
              "print(json.dumps(sorted(f'{cls.__module__}.{name}' for module in list(sys.modules.values()) "
              "if module.__name__.startswith('deploy_') for name, cls in vars(module).items() "
              "if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == module.__name__ "
              "and cls.__pydantic_complete__)))")
    assert fresh_process_json(script) == []


def test_the_cyclic_collector_is_on_again_once_the_tasks_are_loaded() -> None:
    """tasks.py holds the collector off while its imports build long-lived objects (~13 % of their CPU); a command
    that runs for hours (a sweep, a rolling deploy) must still collect its cycles: on again, the imports frozen."""
    script = "import gc, json; import tasks; print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))"
    enabled, frozen = fresh_process_json(script)
    assert enabled and frozen > 10_000


def test_a_no_op_deploy_renders_nothing_and_leaves_what_it_does_not_run_unloaded() -> None:
    """A no-op compares release ids (plan and preflight, as `invoke deploy` runs them on a one-host command, with what
    the task imports): the unit and env file are rendered only to be staged or shown, the venv builder, the prune's
    venv reads and the gpu check load only when they run. Was: Jinja2 loaded and both files rendered on every deploy;
    then the venvs and gpu_check packages loaded on every deploy (the engine's, the plan's and the facts' imports)."""
    from helpers.deploy_plan import deployed, first_plan
    current = deployed(first_plan()[1])
    script = ("import json, sys; sys.path.insert(0, 'tests'); import tasks; "
              "from helpers.deploy_plan import NOW, PROJECT, facts, target; "
              "from deploy_lib.deploy import plan_deploy, preflight; from deploy_lib.store import ReleaseRecord; "
              "from deploy_lib.ops import commands, multinode, scope; from deploy_lib.remote import FabricRemote; "
              "from deploy_cli import common; "
              "current = ReleaseRecord(**json.loads(sys.argv[1])); loaded = PROJECT.profile('glm5-nvfp4'); "
              "common.scope(None, None, None, False, common.rollout(None, None)); "  # the deploy task's one host
              "host = facts(tuple(current.metadata['args']), current=current, active='active'); "
              "plan = plan_deploy(loaded, target(), host, {}, False, NOW); preflight(plan, loaded, target(), host); "
              "print(json.dumps({'unchanged': plan.unchanged, 'loaded': sorted(sys.modules)}))")
    report = fresh_process_json(script, json.dumps(dataclasses.asdict(current)))
    assert report["unchanged"]
    assert {"jinja2", "deploy_lib.ops.fleet", "rich.table", "deploy_lib.venvs", "deploy_lib.gpu_check"} & set(
        report["loaded"]) == set()


def test_a_no_op_deploy_with_its_hooks_and_notices_loads_no_webhook_sender() -> None:
    """The deploy command's whole no-op (ops.commands.deploy: the hooks, the notices, the engine) on a host without
    `notify_webhook`, in a fresh process with what the task imports: the webhook's sender and urllib.request load
    only for a host that has a webhook. Was: loaded by every deploy and rollback to tell no one."""
    script = ("import json, sys; sys.path.insert(0, 'tests'); import tasks; from contextlib import nullcontext; "
              "from helpers.recording_progress import RecordingProgress; "
              "from helpers.deploy_plan import PROJECT, target; "
              "from helpers.deploy_trips import serving_the_profile; from deploy_lib.deploy import Options; "
              "from deploy_lib.ops import commands; from deploy_lib.ops.scope import Reach, Scope; "
              "host, release_id = serving_the_profile(); progress = RecordingProgress(); "
              "reach = Reach(lambda found, prefixed: nullcontext(host), lambda name: progress, lambda question: None); "
              "fleet = commands.deploy(PROJECT, Scope(PROJECT.inventory(None), (target(),)), 'glm5-nvfp4', "
              "Options(grace_s=0), reach); "
              "print(json.dumps({'action': commands.one(fleet).action, 'loaded': sorted(sys.modules)}))")
    report = fresh_process_json(script)
    assert report["action"] == "unchanged"
    assert {"deploy_lib.remote.webhook", "urllib.request", "http.client"} & set(report["loaded"]) == set()


def test_the_whole_no_op_deploy_renders_neither_the_unit_nor_the_env_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deploy engine's no-op (facts, plan, preflight, the live probe: its one round trip) against a scripted host
    that serves the profile's release; a render would raise."""
    from helpers.deploy_plan import PROJECT, target
    from helpers.deploy_trips import serving_the_profile
    from helpers.recording_progress import RecordingProgress

    import deploy_lib.release.model
    from deploy_lib.deploy import Options, deploy
    host, release_id = serving_the_profile()
    for name in ("render_digested_unit", "render_launcher", "render_env", "render_env_redacted"):
        monkeypatch.setattr(deploy_lib.release.model, name, lambda *_: pytest.fail("a no-op rendered a release file"))
    outcome = deploy(PROJECT.profile("glm5-nvfp4"), target(), host, RecordingProgress(), Options(grace_s=0))
    assert (outcome.action, outcome.release_id) == ("unchanged", release_id)


@pytest.mark.parametrize("no_bytecode", [False, True])
def test_a_command_writes_the_bytecode_of_what_it_imports_unless_python_is_told_not_to(
        tmp_path: Path, no_bytecode: bool) -> None:
    """invoke switches bytecode writing off for what it imports after its own options, so every command compiled the
    tool's modules from source again (failed before: no deploy_lib bytecode written), and tasks.py, which invoke loads
    with writing off, too (failed before: no tasks.py bytecode). PYTHONDONTWRITEBYTECODE wins."""
    shown = invoke("render", "-p", "glm5-nvfp4", env={"PYTHONPYCACHEPREFIX": str(tmp_path),
                                                      "PYTHONDONTWRITEBYTECODE": "1" if no_bytecode else ""})
    assert shown.returncode == 0, shown.stderr
    written = {f"{path.parent.name}/{path.name.split('.')[0]}" for path in tmp_path.rglob("*.pyc")
               if "deploy_lib" in path.parts}  # the prefix mirrors the source tree: <folder>/<module>.cpython-3xx.pyc
    assert written == set() if no_bytecode else {"deploy_lib/project", "release/model", "release/render"} <= written
    tasks_py = list((tmp_path / REPO.relative_to(REPO.anchor)).glob("tasks.*.pyc"))  # the prefix mirrors the path
    assert tasks_py == [] if no_bytecode else len(tasks_py) == 1


@pytest.mark.parametrize("no_bytecode", [False, True])
def test_the_sglang_deploy_command_loads_no_tasks_py_and_writes_the_bytecode_of_what_it_imports(
        tmp_path: Path, no_bytecode: bool) -> None:
    """`sglang-deploy` runs the package's own tasks (no tasks.py is looked for: an installed tool has none); invoke
    switches bytecode writing off before a command runs, and the program gives it back to Python (failed before:
    the command needed the checkout's tasks.py). PYTHONDONTWRITEBYTECODE wins."""
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
    assert written == set() if no_bytecode else {"deploy_lib/project", "release/model", "release/render"} <= written


def test_patch_without_a_set_is_exit_2_naming_the_option() -> None:
    refused = invoke("patch", "--check")
    assert refused.returncode == 2 and "--name" in refused.stderr


@pytest.mark.parametrize("argv", [("patch", "--name", "fusion-sm120"), ("patch", "--set", "fusion-sm120"),
                                  ("patches.check", "--name", "fusion-sm120")])
def test_a_patch_sets_name_is_given_as_name_everywhere_and_the_old_set_still_parses(argv: tuple[str, ...]) -> None:
    """Input tried: the spellings above with --check against a host not in the inventory: each parses and reaches the
    host lookup (before: `patches.check NAME` in the README did not parse, `patch` knew only --set)."""
    refused = invoke(*argv, "--check", "-H", "nosuch") if argv[0] == "patch" else invoke(*argv, "-H", "nosuch")
    assert refused.returncode == 2 and "unknown host 'nosuch'" in refused.stderr


HOST_TASKS_WITHOUT_VERBOSE = {"render"}  # --host picks the inventory's vars only; every other one talks to the host
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


def test_the_deploy_engine_loads_the_benchmark_only_for_a_gated_deploy() -> None:
    script = "import json, sys; import deploy_lib.deploy; print(json.dumps(sorted(sys.modules)))"
    assert {"deploy_lib.throughput", "deploy_lib.patches"} & set(fresh_process_json(script)) == set()
