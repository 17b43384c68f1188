"""deploy_lib.remote without SSH: quoting, dry-run text, masking, round-trip planning, the batch script run by a
local bash, the parser on captured output, failure reporting, and the FakeRemote every other test uses."""

from __future__ import annotations

import shlex
import subprocess
from itertools import accumulate
from pathlib import Path, PurePosixPath

import pytest
from helpers.fake_remote import FakeRemote
from helpers.remote import run_script

from deploy_lib.errors import ConnectFailed, StepFailed, StepTimedOut, SudoPasswordRequired
from deploy_lib.remote import (
    MAX_INLINE_STDIN,
    MAX_SCRIPT_CHARS,
    Put,
    Step,
    StepResult,
    batch_script,
    channel_stdin,
    check_result,
    command_line,
    concurrently,
    describe,
    parse_batch_output,
    round_trips,
    script_steps,
)

HOSTILE = ("a b", "it's", '"q"', "$(touch /tmp/pwned)", "`id`", "line1\nline2", "*", "-rf", "")


def test_argv_is_quoted_once_and_survives_a_shell() -> None:
    line = command_line(Step("echo", ("printf", "%s\\0", *HOSTILE)), user="root")
    assert shlex.split(line) == ["printf", "%s\\0", *HOSTILE]
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True).stdout
    assert out.split("\0")[:-1] == list(HOSTILE)


@pytest.mark.parametrize(("user", "sudo", "expected"), [
    ("deploy", True, "sudo -n -- systemctl daemon-reload"),
    ("root", True, "systemctl daemon-reload"),
    ("deploy", False, "systemctl daemon-reload"),
])
def test_sudo_prefix_only_when_needed(user: str, sudo: bool, expected: str) -> None:
    assert command_line(Step("reload", ("systemctl", "daemon-reload"), sudo=sudo), user) == expected


def test_describe_lists_each_step_for_a_dry_run() -> None:
    batch = [
        Step("switch current", ("mv", "-T", "--", "/opt/d/current.tmp", "/opt/d/current"), sudo=True),
        Step("append history", ("tee", "-a", "--", "/opt/d/history.jsonl"), stdin=b'{"a": 1}\n'),
        Put(PurePosixPath("/opt/d/releases/r1/sglang.service"), b"[Unit]\n", 0o644, sudo=True),
    ]
    assert describe(batch) == [
        "switch current: sudo mv -T -- /opt/d/current.tmp /opt/d/current",
        "append history: tee -a -- /opt/d/history.jsonl < stdin (9 bytes)",
        "put /opt/d/releases/r1/sglang.service (mode 0644, sudo, 7 bytes, sha256 "
        "ae6c63cff33b)",
    ]


def test_secrets_are_masked_everywhere_they_could_be_shown() -> None:
    step = Step("login", ("tool", "--token", "hunter2"), stdin=b"hunter2", secret=True)
    put = Put(PurePosixPath("/opt/d/sglang.env"), b"HF_TOKEN=hunter2\n", 0o600, secret=True)
    result = StepResult(step, 1, "hunter2 echoed", "bad hunter2", 0.1)
    shown = [*describe([step, put]), repr(step), repr(put), repr(result), str(step), str(result)]
    for text in shown:
        assert "hunter2" not in text
        assert "***" in text
    with pytest.raises(StepFailed) as failed:
        check_result(result, "deploy@gpu1:22")
    assert "hunter2" not in str(failed.value) and "***" in str(failed.value)


def test_a_full_disk_while_writing_the_env_file_shows_the_os_error_but_never_the_content() -> None:
    """Input tried: the 0600 env file's Put failing with ENOSPC (what `install` prints through sudo)."""
    put = Put(PurePosixPath("/opt/d/sglang/releases/r1.tmp/sglang.env"), b"HF_TOKEN=hunter2\n", 0o600, sudo=True,
              secret=True)
    error = ("install: error writing '/opt/d/sglang/releases/r1.tmp/.sglang.env.tmp-1a2b': No space left on "
             "device\n")
    with pytest.raises(StepFailed) as failed:
        check_result(StepResult(put, 1, "", error, 0.1), "deploy@gpu1:22")
    message = str(failed.value)
    assert "No space left on device" in message and "not shown" not in message
    assert "hunter2" not in message and "HF_TOKEN" not in message
    assert failed.value.hint and "filesystem is full" in failed.value.hint


def test_invalid_steps_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="argv"):
        Step("empty", ())
    with pytest.raises(ValueError, match="argv"):
        Step("a string", "rm -rf /")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Step("never ends", ("true",), timeout_s=0)
    with pytest.raises(ValueError, match="absolute"):
        Put(PurePosixPath("relative/file"), b"", 0o644)


def test_round_trips_group_steps_and_small_puts_with_one_channel_stdin_each() -> None:
    """A Put small enough for a here-document or the channel joins the run of steps around it (the stage, switch and
    restart of a deploy are one round trip); a large one travels alone over SFTP."""
    a, b = Step("a", ("true",)), Step("b", ("true",))
    s1, s2 = Step("s1", ("cat",), stdin=b"1", secret=True), Step("s2", ("cat",), stdin=b"2", secret=True)
    unit = Put(PurePosixPath("/x"), b"[Unit]\n", 0o644)  # text: in the script
    env = Put(PurePosixPath("/y"), b"TOKEN=1\n", 0o600, secret=True)  # a secret: on the channel
    large = Put(PurePosixPath("/z"), b"x" * (MAX_INLINE_STDIN + 1), 0o644)
    assert round_trips([a, s1, b, s2, a, unit, b, env, large, b]) == [(a, s1, b), (s2, a, unit, b), (env,), large,
                                                                       (b,)]
    assert round_trips([]) == []


def test_a_put_in_a_run_writes_a_temp_file_with_its_mode_then_renames_it(tmp_path) -> None:
    dest = tmp_path / "it's a dir" / "app.env"
    dest.parent.mkdir()
    dest.write_text("OLD=1\n")
    old_inode = dest.stat().st_ino
    put = Put(PurePosixPath(dest), b"TOKEN=s3cr3t\n", 0o600, secret=True)
    steps = script_steps([put], "0123456789ab")
    results = run_script(steps, stdin=put.data).results
    assert [r.exit_code for r in results] == [0, 0]
    assert dest.read_bytes() == b"TOKEN=s3cr3t\n" and (dest.stat().st_mode & 0o777) == 0o600
    assert dest.stat().st_ino != old_inode  # replaced by a rename, never rewritten in place
    assert sorted(p.name for p in dest.parent.iterdir()) == ["app.env"]
    assert "s3cr3t" not in batch_script(steps, "root", "m" * 16)


def test_non_secret_text_stdin_travels_in_the_script_so_several_share_a_round_trip() -> None:
    """The facts batch sends SGLang's option reader and the model plan, each on its own stdin, in one trip."""
    s1, s2 = Step("s1", ("cat",), stdin=b"first\nscript\n"), Step("s2", ("wc", "-c"), stdin=b"x" * 1000 + b"\n")
    secret = Step("secret", ("cat",), stdin=b"token\n", secret=True)
    binary = Step("binary", ("cat",), stdin=b"\xff\x00")
    assert round_trips([s1, s2, secret]) == [(s1, s2, secret)]
    assert round_trips([secret, binary]) == [(secret,), (binary,)]
    assert channel_stdin([s1, s2, secret]) == b"token\n"
    results = run_script([s1, s2, secret], stdin=b"token\n").results
    assert [r.stdout for r in results] == ["first\nscript\n", "1001\n", "token\n"]
    assert "token" not in batch_script([s1, s2, secret], "root", "m" * 16)


def test_round_trips_split_a_script_too_long_for_one_argument() -> None:
    big = Step("big", ("echo", "x" * (MAX_SCRIPT_CHARS // 3)))
    trips = round_trips([big] * 5)
    assert [len(t) for t in trips if isinstance(t, tuple)] == [2, 2, 1]


class _FakeClock:
    """time for FabricRemote's wait: sleeps advance it at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.naps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.now += seconds


def test_a_long_step_wakes_the_client_rarely_and_a_short_round_trip_still_ends_within_a_millisecond(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for a round trip's exit status looked at the channel every millisecond for as long as the step ran:
    1,000 wake-ups a second through a venv build or a model download. Here a 10-minute step, on a clock the naps
    advance."""
    from deploy_lib.remote import runner
    clock = _FakeClock()
    monkeypatch.setattr(runner, "time", clock)
    step_s = 600.0
    waiting = type("Waiting", (), {"process_is_finished": property(lambda _: clock.now >= step_s),
                                   "has_dead_threads": False})()
    runner.WholeStdinRemote.wait(waiting)  # type: ignore[arg-type]
    naps = list(zip(clock.naps, [0.0, *accumulate(clock.naps)], strict=False))  # (nap, time waited when it began)
    assert all(nap == 0.001 for nap, waited in naps if waited < 0.1)
    assert len(naps) < step_s * 25  # 20 a second once the wait is long, not 1,000
    # a look is late by at most 1 % of the time waited (or 1 ms), and never by more than 50 ms
    assert all(nap <= max(0.001, waited / 100) + 1e-12 and nap <= 0.05 for nap, waited in naps)


def test_batch_script_runs_steps_in_order_and_stops_at_the_first_unaccepted_code(tmp_path) -> None:
    after = tmp_path / "after"
    steps = [
        Step("no newline", ("printf", "%s", "a\nb")),
        Step("accepted 3", ("sh", "-c", "echo out; echo err >&2; exit 3"), ok=frozenset({0, 3})),
        Step("stdin", ("cat",), stdin=b"piped"),
        Step("fails", ("sh", "-c", "exit 5")),
        Step("after", ("touch", str(after))),
    ]
    results, running_out, running_err, done = run_script(steps, stdin=b"piped")
    assert done.returncode == 0  # the script stops after a failed step as after the last
    assert [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in results] == [
        ("no newline", 0, "a\nb", ""),
        ("accepted 3", 3, "out\n", "err\n"),
        ("stdin", 0, "piped", ""),
        ("fails", 5, "", ""),
    ]
    assert all(r.duration_s > 0 for r in results)  # the script stamps each step (a missing stamp parses as 0.0)
    assert not after.exists() and (running_out, running_err) == ("", "")


def test_only_the_stdin_step_reads_the_channel() -> None:
    steps = [Step("reads nothing", ("wc", "-c")), Step("gets stdin", ("wc", "-c"), stdin=b"12345")]
    results = run_script(steps, stdin=b"12345").results
    assert [r.stdout.strip() for r in results] == ["0", "5"]


def _rendezvous(name: str, mine: Path, theirs: Path, **kwargs: object) -> Step:
    """Creates `mine`, then waits for `theirs`: two of them end only when they run at the same time."""
    script = f"touch {mine}; until [ -e {theirs} ]; do sleep 0.01; done"
    return Step(name, ("sh", "-c", script), timeout_s=20, concurrent=True, **kwargs)  # type: ignore[arg-type]


def test_concurrent_steps_run_at_the_same_time_and_report_in_order(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    steps = [Step("before", ("echo", "first")),
             *concurrently([Step("talks", ("sh", "-c", "echo out; echo err >&2; exit 3"), ok=frozenset({0, 3})),
                            Step("inline stdin", ("cat",), stdin=b"inline\n")]),
             _rendezvous("waits for b", a, b), _rendezvous("waits for a", b, a),
             Step("channel stdin", ("cat",), stdin=b"\x00channel", concurrent=True),
             Step("after", ("echo", "last"))]
    results = run_script(steps, stdin=b"\x00channel").results
    assert [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in results] == [
        ("before", 0, "first\n", ""), ("talks", 3, "out\n", "err\n"), ("inline stdin", 0, "inline\n", ""),
        ("waits for b", 0, "", ""), ("waits for a", 0, "", ""), ("channel stdin", 0, "\x00channel", ""),
        ("after", 0, "last\n", "")]
    assert all(r.duration_s > 0 for r in results)  # a concurrent step stamps its own start and end


def test_a_failed_concurrent_step_stops_the_batch_after_its_group(tmp_path) -> None:
    after = tmp_path / "after"
    steps = [*concurrently([Step("fails", ("sh", "-c", "exit 5")), Step("still runs", ("echo", "ran"))]),
             Step("after", ("touch", str(after)))]
    results = run_script(steps).results
    assert [(r.step.name, r.exit_code, r.stdout) for r in results] == [("fails", 5, ""), ("still runs", 0, "ran\n")]
    assert not after.exists()


def test_batch_script_times_out_a_step_with_exit_124() -> None:
    results = run_script([Step("slow", ("sleep", "5"), timeout_s=0.2), Step("next", ("true",))]).results
    assert [(r.step.name, r.exit_code) for r in results] == [("slow", 124)]
    with pytest.raises(StepTimedOut, match=r"timed out after 0\.2 s"):
        check_result(results[0], "root@h:22")


def test_parser_on_captured_output_of_an_interrupted_round_trip() -> None:
    steps = [Step("one", ("echo", "1")), Step("two", ("sleep", "100"))]
    marker = "0123456789abcdef"
    stdout = (f"{marker} 0 start\n1\n\n{marker} 0 end 0 1764412800.100000 1764412800.350000\n"
              f"{marker} 1 start\npartial")
    stderr = f"{marker} 0 start\n\n{marker} 0 end 0 1764412800,1 1764412800,35\n{marker} 1 start\nwarn\n"
    results, running_out, running_err = parse_batch_output(steps, marker, stdout, stderr)
    assert [(r.step.name, r.exit_code, r.stdout, r.stderr) for r in results] == [("one", 0, "1\n", "")]
    assert results[0].duration_s == pytest.approx(0.25)
    assert (running_out, running_err) == ("partial", "warn\n")


def test_step_output_cannot_forge_a_marker_of_another_round_trip() -> None:
    steps = [Step("liar", ("echo",))]
    stdout = "abc 0 start\n\nabc 0 end 0 1 2\nxyz 0 start\nreal\n\nxyz 0 end 0 1 2\n"
    results, _, _ = parse_batch_output(steps, "xyz", stdout, "xyz 0 start\n\nxyz 0 end 0 1 2\n")
    assert results[0].stdout == "real\n"


def test_failure_message_names_the_step_and_keeps_only_the_tail() -> None:
    step = Step("pip install", ("pip", "install", "sglang==0.5.9"))
    stderr = "".join(f"err line {i}\n" for i in range(1, 41))
    with pytest.raises(StepFailed) as failed:
        check_result(StepResult(step, 1, "out\n", stderr, 2.0), "deploy@gpu1:22")
    error = failed.value
    assert error.step is step and error.result.stderr == stderr
    text = str(error)
    assert "'pip install'" in text and "exit code 1" in text and "deploy@gpu1:22" in text
    assert "err line 40" in text and "err line 29" in text and "err line 28\n" not in text


def test_accepted_codes_do_not_raise() -> None:
    check_result(StepResult(Step("is-active", ("systemctl", "is-active", "x"), ok=frozenset({0, 3})),
                            3, "inactive\n", "", 0.0), "h")


# FakeRemote: the double must fail the way the real one does, or tests built on it prove nothing.

def test_fake_remote_answers_by_argv_name_and_predicate_last_rule_wins() -> None:
    remote = FakeRemote()
    remote.reply(lambda step: True, stdout="default")
    remote.reply(("readlink", "--", "/c"), stdout="releases/r1\n")
    remote.reply("lock owner", stdout="{}")
    results = remote.run([Step("x", ("readlink", "--", "/c")), Step("lock owner", ("cat", "f")),
                          Step("other", ("true",))])
    assert [r.stdout for r in results] == ["releases/r1\n", "{}", "default"]


def test_fake_remote_stops_at_first_failure_like_the_real_one() -> None:
    remote = FakeRemote().reply("mkdir", exit_code=1, stderr="File exists", times=1)
    batch = [Step("mkdir", ("mkdir", "/l")), Put(PurePosixPath("/l/owner.json"), b"{}", 0o644)]
    with pytest.raises(StepFailed) as failed:
        remote.run(batch)
    assert failed.value.result.exit_code == 1 and remote.files == {}
    remote.run(batch)  # the rule was used up: now it succeeds
    assert remote.ran_names() == ["mkdir", "mkdir", "put /l/owner.json"]
    assert remote.file_text("/l/owner.json") == "{}"


def test_fake_remote_can_drop_the_connection() -> None:
    remote = FakeRemote().reply("stage", raises=ConnectFailed("connection lost during step 'stage'"))
    with pytest.raises(ConnectFailed):
        remote.run([Step("before", ("true",)), Step("stage", ("true",)), Step("after", ("true",))])
    assert remote.ran_names() == ["before"]


SUDO_PROMPT = "sudo: a password is required\n"


@pytest.mark.parametrize("step", [
    Step("host facts: current release checksums", ("sha256sum", "--", "/x"), sudo=True, ok=frozenset({0, 1})),
    Put(PurePosixPath("/opt/x/sglang.env"), b"A=1\n", 0o600, sudo=True),
])
def test_a_sudo_password_prompt_is_a_remote_error_naming_the_sudoers_line(step: Step | Put) -> None:
    # reported: with NOPASSWD removed, the accepted exit 1 of a fact read looked like drift (exit 9)
    with pytest.raises(SudoPasswordRequired) as raised:
        check_result(StepResult(step, 1, "", SUDO_PROMPT, 0.1), "deploy@gpu1:22", user="deploy")
    assert raised.value.exit_code == 5
    assert "asks deploy for a password" in raised.value.message and "drift" not in str(raised.value)
    assert "deploy ALL=(ALL) NOPASSWD: ALL" in str(raised.value.hint)
