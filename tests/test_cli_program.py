"""The program around the tasks, as a user meets it: one task per command, invoke's --dry, the tool's own help,
usage errors exit 2, every value shown in help, a closed pipe, a word after deploy/render/plan as the profile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import REPO, invoke
from invoke.util import Lexicon

from deploy_cli.collection import user_tasks
from deploy_cli.program import NAME, PIPE_CLOSED, DeployProgram, OneTaskExecutor, with_operand

SGLANG_DEPLOY = "import sys; from deploy_cli.program import main; sys.argv[0] = 'sglang-deploy'; main()"


def sglang_deploy(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`sglang-deploy ARGV` as a user types it (the installed command's entry point)."""
    return subprocess.run([sys.executable, "-c", SGLANG_DEPLOY, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("program", [invoke, sglang_deploy])
def test_a_stray_word_that_is_a_second_task_is_refused_naming_it_before_anything_runs(program: object) -> None:
    """Input tried: `render -p glm5-nvfp4 uninstall -i inv.yaml` (invoke rendered, then ran uninstall: only the
    consent question stopped it, and with --yes it would have gone ahead)."""
    refused = program("render", "-p", "glm5-nvfp4", "uninstall", "-i", "inv.yaml")  # type: ignore[operator]
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: one task per command: `uninstall` is a second task after `render`; "
                                     "nothing was run")
    assert refused.stdout == ""  # render did not run either


def test_dry_is_the_tasks_dry_run(tmp_path: Path) -> None:
    """Input tried: `invoke -R tune ...` against a host whose port is closed. invoke's --dry only echoes `c.run`
    commands, which no task uses: the real tune ran and asked to restart the server (exit 1 without a terminal).
    As --dry-run it asks nothing and reads the host, whose closed port is the error (exit 5)."""
    (tmp_path / "hosts.yaml").write_text("all: {hosts: {gpu1: {ansible_host: 127.0.0.1, ansible_port: 9}}}\n")
    tuned = invoke("-R", "tune", "-p", str(REPO / "inventory" / "profiles" / "glm5-nvfp4.yaml"), "--vary",
                   "features.cuda_graph=true,false", "-i", "hosts.yaml", cwd=tmp_path)
    assert "not asking" not in tuned.stderr
    assert tuned.returncode == 5 and "cannot connect to host root@127.0.0.1:9" in tuned.stderr


@pytest.mark.parametrize("argv", [("-R", "status"), ("status", "--dry"), ("render", "-p", "glm5-nvfp4", "-R")])
@pytest.mark.parametrize("program", [invoke, sglang_deploy])
def test_dry_on_a_task_without_a_dry_run_is_refused(program: object, argv: tuple[str, ...]) -> None:
    """Input tried: `invoke -R status`, `status --dry`, `render -p glm5-nvfp4 -R` (ignored: the task ran)."""
    refused = program(*argv)  # type: ignore[operator]
    task = "status" if "status" in argv else "render"
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.strip() == (f"error: --dry (-R) is the task's --dry-run, and `{task}` has none; nothing "
                                      "was run")


INVOKE_CORE = ("--pty", "--hide", "--warn-only", "--prompt-for-sudo-password", "--echo", "--write-pyc",
               "--command-timeout", "--config", "--list-format", "--debug")


@pytest.mark.parametrize("argv", [("--help",), (), ("-h",)])
def test_the_top_level_help_is_the_tools_own_with_the_tasks_by_family(argv: tuple[str, ...]) -> None:
    """Input tried: `sglang-deploy --help` and `sglang-deploy` alone (they showed invoke's core options: --pty,
    --hide, -w, --prompt-for-sudo-password; and a flat list of subcommands)."""
    shown = sglang_deploy(*argv)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.startswith(f"{NAME} ") and "SGLang server" in text.split("\n\n", 1)[0]
    assert f"Usage: {NAME} [--project DIR] TASK [--options]" in text
    assert not [option for option in INVOKE_CORE if option in text]
    headings = [line for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings[:3] == ["Releases: what a profile becomes, and taking hosts to it or back:",
                            "A host's server and its store, without a new release:",
                            "Reading a host: state, history, journal, benchmark, GPUs:"]
    assert headings[-2:] == ["Options:", "Exit codes:"]
    assert "Other tasks:" not in headings  # every module of tasks has its family
    listed = {line.split()[0] for line in text.split("\nOptions:")[0].splitlines()
              if line.startswith("  ") and not line.startswith("   ")}  # a task's line, not a wrapped one
    expected = {name for name in user_tasks().task_names if name != "tune.tune"} | {"tune"}
    assert listed == expected


@pytest.mark.parametrize("argv", [("--pty", "render"), ("render", "--hide", "both"), ("-w", "status")])
def test_invokes_options_for_shell_commands_are_not_the_tools(argv: tuple[str, ...]) -> None:
    """Input tried: `sglang-deploy --pty render`, `render --hide both`, `-w status` (accepted, meaning nothing)."""
    refused = sglang_deploy(*argv)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ")


@pytest.mark.parametrize(("argv", "said"), [
    (("logs", "--bogus"), "error: `logs` has no option --bogus (`sglang-deploy logs --help` lists its options)"),
    (("logs", "-n"), "error: -n needs a value (--lines=LINES): none was given at the end of the line; nothing was "
                     "run (`sglang-deploy logs --help` lists its options)"),
    (("nosuch",), "error: no task named 'nosuch' (`sglang-deploy --help` lists the tasks)"),
    (("--help", "nosuch"), "error: no task named 'nosuch' (`sglang-deploy --help` lists the tasks)"),
    (("--project",), "error: Flag --project needed value and was not given one! (`sglang-deploy --help` lists the "
                     "tasks)")])
def test_a_usage_error_found_by_the_parser_exits_2_like_the_tools_own(argv: tuple[str, ...], said: str) -> None:
    """Input tried: an unknown option, an option without its value, an unknown task, help for an unknown task, the
    program's --project without a value (invoke's parser exited 1 where the tool's usage errors exit 2)."""
    refused = sglang_deploy(*argv)
    assert (refused.returncode, refused.stderr.strip()) == (2, said)


@pytest.mark.parametrize("argv", [("plan", "--detailed-exitcode", "--bogus"), ("-R", "plan", "--detailed-exitcode"),
                                  ("plan", "--detailed-exitcode", "-p", "glm5-nvfp4", "status")])
def test_a_usage_error_of_a_drift_check_is_1_not_the_2_that_means_changes(argv: tuple[str, ...]) -> None:
    """Input tried: `plan --detailed-exitcode` with an unknown option, with -R, with a second task (exit 2, which
    cron or CI reads as "something would change" under Terraform's contract)."""
    refused = sglang_deploy(*argv)
    assert (refused.returncode, refused.stdout) == (1, "") and refused.stderr.startswith("error: ")


def test_every_option_that_takes_a_value_shows_its_placeholder_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `TASK --help` for every task (--serial, --compare, --sizes and --lines showed no value: a list
    or a checked number is neither invoke's STRING nor INT)."""
    namespace = user_tasks()
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=namespace, executor_class=OneTaskExecutor)
    for task in namespace.task_names:
        program.run([NAME, task, "--help"], exit=False)
        shown = capsys.readouterr().out
        for argument in namespace[task].get_arguments():
            if argument.takes_value:
                long_name = max(argument.names, key=len)
                assert f"--{long_name}={long_name.upper().replace('-', '_')}" in shown, (task, long_name)
    program.run([NAME, "logs", "--help"], exit=False)
    assert "  -n LINES, --lines=LINES " in capsys.readouterr().out
    for task, option in (("deploy", "--serial=SERIAL ..."), ("bench", "--compare=COMPARE ..."),
                         ("gpu-check", "--sizes=SIZES ...")):
        program.run([NAME, task, "--help"], exit=False)
        assert f"  {option} " in capsys.readouterr().out


def test_no_tasks_help_names_a_command_the_installed_tool_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    """Input tried: `TASK --help` for every task and the overview (stop's help said "`invoke start` brings it back",
    patch-fusion's "`invoke patch --name fusion-sm120`": there is no `invoke` where the tool is pip-installed). A
    task's help names another by the task's name alone, as the task table of docs/commands.md does."""
    namespace = user_tasks()
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=namespace, executor_class=OneTaskExecutor)
    shown = {}
    for task in [*namespace.task_names, None]:
        program.run([NAME, *([task] if task else []), "--help"], exit=False)
        shown[task] = " ".join(capsys.readouterr().out.split())  # a line wrapped after `invoke` is found too
    assert "`start` brings it back" in shown["stop"]
    assert {task: text for task, text in shown.items() if "invoke " in text} == {}


@pytest.mark.parametrize(("program", "argv"), [("sglang-deploy", ("--help",)), ("sglang-deploy", ()),
                                               ("sglang-deploy", ("schema",)), ("invoke", ("schema",))])
def test_output_into_a_closed_pipe_ends_quietly(program: str, argv: tuple[str, ...]) -> None:
    """Input tried: `sglang-deploy --help | head -1` and `sglang-deploy | head -1` (a BrokenPipeError traceback);
    `schema | head -1` through both programs. The reader is gone before the command writes anything, as `head` is
    once it has its line: stderr says nothing, and the exit is 1, as Python's and rich's own."""
    command = [sys.executable, "-c", SGLANG_DEPLOY] if program == "sglang-deploy" else [
        sys.executable, "-m", "invoke", "--search-root", str(REPO)]
    running = subprocess.Popen([*command, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert running.stdout is not None and running.stderr is not None
    running.stdout.close()  # the read end: every write of the command fails with EPIPE
    stderr = running.stderr.read().decode()
    assert (running.wait(timeout=120), stderr) == (PIPE_CLOSED, "")


def test_a_word_after_deploy_render_or_plan_is_the_profile(tmp_path: Path) -> None:
    """Input tried: `sglang-deploy render glm5-nvfp4-fusion` (invoke: `No idea what 'glm5-nvfp4-fusion' is!`),
    `render -i FILE NAME`, `plan NAME --against OTHER`, `deploy NAME` with a profile that does not exist; --profile
    still works, and both forms at once are refused."""
    by_word = sglang_deploy("render", "glm5-nvfp4-fusion")
    by_option = sglang_deploy("render", "--profile", "glm5-nvfp4-fusion")
    assert by_word.returncode == 0, by_word.stderr
    assert by_word.stdout == by_option.stdout and "--flashinfer-allreduce-fusion-backend auto" in by_word.stdout
    after_a_value = sglang_deploy("render", "-i", "inventory/hosts.example.yaml", "glm5-nvfp4-fusion")
    assert after_a_value.stdout == by_word.stdout, after_a_value.stderr
    compared = sglang_deploy("plan", "glm5-nvfp4", "--against", "glm5-nvfp4-fusion")
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.startswith("glm5-nvfp4-fusion -> glm5-nvfp4: 1 change(s)")
    (tmp_path / "hosts.yaml").write_text("all: {hosts: {gpu1: {ansible_host: 192.0.2.10}}}\n")
    deployed = sglang_deploy("deploy", "no-such-profile", "-i", "hosts.yaml", "--json", cwd=tmp_path)
    assert deployed.returncode == 2 and "no-such-profile" in deployed.stderr and "No idea" not in deployed.stderr
    both = sglang_deploy("render", "glm5-nvfp4", "--profile", "glm5-nvfp4-fusion")
    assert (both.returncode, both.stdout) == (2, "")
    assert both.stderr.startswith("error: the profile is given twice: as the word 'glm5-nvfp4' and by --profile")
    helped = sglang_deploy("deploy", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith(f"Usage: {NAME} deploy [--options] [PROFILE]")


@pytest.mark.parametrize(("argv", "read"), [
    (["deploy", "-yi", "inv.yaml", "glm5"], ["deploy", "-yi", "inv.yaml", "--profile", "glm5"]),
    (["deploy", "-pglm5", "-y"], ["deploy", "-pglm5", "-y"]),
    (["deploy", "--serial", "1", "glm5"], ["deploy", "--serial", "1", "--profile", "glm5"]),
    (["deploy", "--inventory=glm5", "glm5"], ["deploy", "--inventory=glm5", "--profile", "glm5"]),
    (["render", "--help"], ["render", "--help"]),
    (["status", "gpu1"], ["status", "gpu1"]),
    (["deploy", "--", "glm5"], ["deploy", "--", "glm5"])])
def test_the_word_taken_as_the_profile_is_neither_a_value_nor_a_flag(argv: list[str], read: list[str]) -> None:
    """Input tried: the word after a flag cluster whose last flag takes a value (`-yi inv.yaml`), a value glued to
    its flag (`-pglm5`), after a repeatable option's value, after `--`; a task without a profile operand (`status`
    keeps its stray word for the parser to refuse)."""
    namespace = user_tasks()
    contexts = Lexicon({context.name: context for context in namespace.to_contexts()})
    operands = {name: namespace[name].operand for name in namespace.task_names if namespace[name].operand}
    assert operands == {"deploy": "profile", "render": "profile", "plan": "profile", "docs": "page"}
    assert with_operand(argv, contexts, DeployProgram(namespace=namespace).initial_context, operands) == read
