"""The batch script's root runs through a real `sudo` on this machine (Debian package sudo, a host tool of
sandbox/testhost.sh): consecutive root steps share one `sudo -n`, and each step's result stays its own.

Two callers: root, for whom `sudo -n` never asks (as a user with NOPASSWD), and `nobody` (through setpriv), whom
it asks for a password. Each runs the script the host would run for the inventory user `deploy`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

import pytest
from helpers.remote import run_script
from helpers.sudo_above import sudo_above

from deploy_lib.errors import StepTimedOut, SudoPasswordRequired
from deploy_lib.remote import (
    Put,
    Step,
    batch_script,
    channel_stdin,
    check_result,
    concurrently,
    script_steps,
)
from deploy_lib.remote.steps import SUDO_PASSWORD_PROMPT

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("sudo") is None or shutil.which("setpriv") is None,
                                reason="needs root, sudo (Debian package sudo) and setpriv: `make host-deps`")

MARKER = "0123456789abcdef"
AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
HOSTILE = ("a b", "it's", '"q"', "'\"'\"'", "${HOME}", "`id`", "line1\nline2", "*", "-rf", "", "\\", "exit 0")


def test_consecutive_root_steps_share_one_sudo_and_a_user_step_ends_the_run() -> None:
    steps = [Step("user", ("true",)), sudo_above("a"), sudo_above("b"), Step("user between", ("true",)),
             sudo_above("c"), *concurrently([sudo_above("d"), sudo_above("e")]), sudo_above("f")]
    results = run_script(steps, user="deploy").results
    above = {result.step.name: result.stdout.strip() for result in results if result.step.sudo}
    assert "none" not in above.values()
    assert above["a"] == above["b"]
    assert above["c"] == above["d"] == above["e"] == above["f"] != above["a"]


def test_a_lone_root_step_keeps_its_own_sudo() -> None:
    results = run_script([Step("user", ("true",)), sudo_above("alone"), Step("user after", ("true",))],
                         user="deploy").results
    assert results[1].stdout.strip() != "none"
    assert "bash -c" not in batch_script([sudo_above("alone")], "deploy", MARKER)


def test_each_root_step_gives_the_result_it_gives_as_root() -> None:
    """Hostile argv and here-document stdin, stdout and stderr, an accepted non-zero code and concurrent steps:
    through one sudo as `deploy` the same results, step by step, as the same steps run by root without sudo."""
    steps = [
        Step("hostile argv", ("printf", "%s\\0", *HOSTILE), sudo=True),
        Step("hostile stdin", ("cat",), sudo=True, stdin=("".join(f"{text}\n" for text in HOSTILE)).encode()),
        Step("stderr and code 3", ("sh", "-c", "echo out; echo err >&2; exit 3"), sudo=True, ok=frozenset({0, 3})),
        Step("user", ("printf", "%s", "between")),
        *concurrently([Step("slow", ("sh", "-c", "sleep 0.2; echo slow"), sudo=True),
                       Step("fast", ("sh", "-c", "echo fast >&2"), sudo=True, ok=frozenset({0, 1}))]),
        Step("who", ("id", "-un"), sudo=True),
    ]
    as_deploy, _, _, done = run_script(steps, user="deploy")
    as_root = run_script(steps, user="root").results
    assert [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in as_deploy] == \
        [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in as_root]
    assert as_deploy[0].stdout.split("\0")[:-1] == list(HOSTILE)
    assert as_deploy[-1].stdout == "root\n" and done.returncode == 0


def test_a_code_not_accepted_in_a_root_run_stops_the_batch_there() -> None:
    steps = [Step("first", ("true",), sudo=True), Step("fails", ("sh", "-c", "echo why >&2; exit 2"), sudo=True),
             Step("after, root", ("touch", "/nonexistent-never-made"), sudo=True), Step("after, user", ("true",))]
    results, _, _, done = run_script(steps, user="deploy")
    assert [(r.step.name, r.exit_code, r.stderr) for r in results] == [("first", 0, ""), ("fails", 2, "why\n")]
    assert done.returncode == 0  # the script stops as it does after any step's failure


def test_a_root_step_over_its_timeout_is_ended_alone_and_reads_as_a_timeout() -> None:
    steps = [Step("quick", ("true",), sudo=True), Step("slow", ("sleep", "30"), sudo=True, timeout_s=0.5),
             Step("never", ("true",), sudo=True)]
    results = run_script(steps, user="deploy").results
    assert [r.exit_code for r in results] == [0, 124]
    with pytest.raises(StepTimedOut, match=r"timed out after 0\.5 s"):
        check_result(results[1], "deploy@gpu1:22")


def test_a_secret_sudo_put_reads_the_channel_under_a_sudo_of_its_own_between_root_runs(tmp_path: Path) -> None:
    """A root run's bash reads its lines from stdin, so the step that reads the channel (a secret Put's write) keeps
    a sudo of its own; the root steps around it still share theirs."""
    dest = tmp_path / "it's here" / "app.env"
    dest.parent.mkdir()
    put = Put(PurePosixPath(dest), b"TOKEN=s3cr3t\n", 0o600, sudo=True, secret=True)
    steps = [sudo_above("a"), sudo_above("b"), *script_steps([put], "0123456789ab"), sudo_above("c")]
    assert "s3cr3t" not in batch_script(steps, "deploy", MARKER)
    results = run_script(steps, channel_stdin(steps) or b"", user="deploy").results
    assert [r.exit_code for r in results] == [0, 0, 0, 0, 0]
    assert results[0].stdout == results[1].stdout != results[4].stdout
    assert dest.read_bytes() == b"TOKEN=s3cr3t\n" and (dest.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in dest.parent.iterdir()) == ["app.env"]


def test_sudo_is_given_a_short_command_line_whatever_the_steps_stdin() -> None:
    """sudo logs the command line of each command it runs: a root run's steps and their here-documents (the facts'
    36 KB option reader) travel on its bash's stdin instead."""
    text = "print('option reader')\n" * 2000
    script = batch_script([Step("reader", ("python3", "-"), sudo=True, stdin=text.encode()), sudo_above("b")],
                          "deploy", MARKER)
    [sudo_line] = [line for line in script.splitlines() if line.startswith("sudo ")]
    assert len(sudo_line) < 200 and "option reader" not in sudo_line


def test_without_passwordless_sudo_every_root_step_meets_the_prompt_as_it_would_alone(tmp_path: Path) -> None:
    """A read that accepts exit 1 ("absent") gets the prompt and the batch goes on, as it did with a sudo of its
    own per step; check_result then names the user and the sudoers line. No root step ran."""
    witness = tmp_path / "ran as root"
    read = frozenset({0, 1})
    steps = [Step("read a", ("cat", "/etc/shadow"), sudo=True, ok=read),
             Step("read b", ("id", "-u"), sudo=True, ok=read), Step("user", ("id", "-un")),
             Step("write", ("touch", str(witness)), sudo=True),
             Step("never", ("true",), sudo=True)]
    results, _, _, done = run_script(steps, user="deploy", caller=AS_NOBODY)
    assert [(r.step.name, r.exit_code) for r in results] == [("read a", 1), ("read b", 1), ("user", 0), ("write", 1)]
    assert results[2].stdout == "nobody\n"
    for result in (results[0], results[1], results[3]):
        assert result.stdout == "" and result.stderr.count(SUDO_PASSWORD_PROMPT) == 1
    assert not witness.exists() and done.returncode == 0
    with pytest.raises(SudoPasswordRequired) as raised:
        check_result(results[0], "deploy@gpu1:22", user="deploy")
    assert "asks deploy for a password (step 'read a')" in raised.value.message
    assert "deploy ALL=(ALL) NOPASSWD: ALL" in str(raised.value.hint)


def test_a_root_run_ended_by_a_signal_ends_the_batch_and_sends_none_of_its_steps_again(tmp_path: Path) -> None:
    """A root run's bash killed halfway (here by its own step) is not taken for a refusal: no step runs twice."""
    count = tmp_path / "appended"
    kill_the_run = "read -r _ _ _ parent _ </proc/$PPID/stat; kill -KILL $parent"  # timeout's parent: the run's bash
    steps = [Step("append", ("sh", "-c", f"echo x >> {count}"), sudo=True),
             Step("kill the run", ("sh", "-c", kill_the_run), sudo=True), Step("never", ("true",))]
    results, _, _, done = run_script(steps, user="deploy")
    assert [r.step.name for r in results] == ["append"]
    assert count.read_text() == "x\n" and done.returncode == 128 + 9


def test_without_sudo_on_the_host_each_root_step_fails_as_it_would_alone(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("timeout", "id"):
        (tools / tool).symlink_to(shutil.which(tool) or tool)
    steps = [Step("read", ("id", "-u"), sudo=True, ok=frozenset({0, 127})), Step("root", ("id", "-u"), sudo=True),
             Step("never", ("id", "-u"))]
    results = run_script(steps, user="deploy", env={"PATH": str(tools)}).results
    assert [(r.step.name, r.exit_code) for r in results] == [("read", 127), ("root", 127)]
    assert all("failed to run command 'sudo'" in r.stderr for r in results)


def test_with_a_sudo_password_each_root_step_gives_the_result_it_gives_as_root() -> None:
    """Input tried: the password `hunter2 'x' $HOME` (with a space and shell characters) as the channel's first line,
    the rest of the channel a secret step's stdin. sudo here does not ask root for it (as under a NOPASSWD rule): the
    root side skips the line, so no step reads it, in a root run, a step of its own, or a concurrent group."""
    password = "hunter2 'x' $HOME"
    steps = [
        Step("hostile argv", ("printf", "%s\\0", *HOSTILE), sudo=True),
        Step("here-document stdin", ("cat",), sudo=True, stdin=b"line one\nline two\n"),
        Step("user", ("id", "-un")),
        Step("channel stdin", ("cat",), sudo=True, stdin=b"from the channel\n", secret=True),
        *concurrently([Step("slow", ("sh", "-c", "sleep 0.2; cat"), sudo=True),
                       Step("fast", ("sh", "-c", "cat; echo fast >&2"), sudo=True)]),
        Step("who", ("id", "-un"), sudo=True),
    ]
    channel = channel_stdin(steps) or b""
    script = batch_script(steps, "deploy", MARKER, with_password=True)
    assert password not in script and "sudo -n" not in script
    with_password = run_script(steps, f"{password}\n".encode() + channel, user="deploy", with_password=True)
    as_root = run_script(steps, channel, user="root").results
    assert [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in with_password.results] == \
        [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in as_root]
    assert with_password.results[3].stdout == "from the channel\n"
    assert with_password.results[4].stdout == with_password.results[5].stdout == ""
    assert password not in with_password.process.stdout.decode() + with_password.process.stderr.decode()


def test_a_sudo_password_sudo_refuses_fails_the_first_root_step_and_runs_none(tmp_path: Path) -> None:
    """`nobody` cannot authenticate to sudo: the password given is refused, the first root step fails with sudo's
    words (not the `-n` refusal of a prompt), no root step ran, and the password is in no output."""
    password = "not-nobodys-password"
    witness = tmp_path / "ran as root"
    steps = [Step("write", ("touch", str(witness)), sudo=True), Step("never", ("true",), sudo=True)]
    run = run_script(steps, f"{password}\n".encode(), user="deploy", caller=AS_NOBODY, with_password=True)
    assert [(r.step.name, r.exit_code, r.stdout) for r in run.results] == [("write", 1, "")]
    assert "incorrect password" in run.results[0].stderr and SUDO_PASSWORD_PROMPT not in run.results[0].stderr
    assert not witness.exists()
    assert password not in run.process.stdout.decode() + run.process.stderr.decode()
