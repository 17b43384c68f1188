"""The CLI's read-ahead (remote/read_ahead.py, remote/reads_record.py): a command line's first reads, remembered at
its end and sent at its next start while the tool imports, taken only when they are what the command sends. Against
the real OpenSSH server of tests/test_remote_ssh.py on loopback; each "command" is a ReadAhead started as the CLI
starts one, then finished as its process would at exit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.remote_ssh import SshServer
from tenacity import Retrying, stop_after_attempt

from deploy_lib.errors import ConnectFailed
from deploy_lib.remote import FabricRemote, SSHTarget, Step, read_ahead, reads_record
from deploy_lib.remote.reads_record import Exchange, load, record_dir, record_path, save, sent_ahead

COMMAND = ("sglang-deploy", "deploy", "--profile", "glm5-nvfp4")


ASKED: list[str] = []  # the paths the health server below was asked for


class Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        ASKED.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    ASKED.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(reads_record, "_current", None)
    return {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path)}


def command(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> reads_record.ReadAhead:
    """One command's start, as the CLI's first lines run it; its connections sent ahead have opened."""
    monkeypatch.setattr(reads_record, "_current", None)
    read_ahead.start(COMMAND, "/project", environ)
    started = reads_record.current()
    assert started is not None
    for ahead in list(started._ahead.values()):
        assert isinstance(ahead, read_ahead.Ahead)
        ahead.connected.wait(10)
    return started


def counting_read(counter: Path) -> Step:
    """A step marked read that leaves a trace of each time the host ran it (a real read leaves none)."""
    return Step("count", ("sh", "-c", f"echo x >> '{counter}'; wc -l < '{counter}'"), read=True, repeatable=True)


def test_the_second_run_takes_its_reads_from_ahead_and_the_host_ran_each_once(
        sshd: SshServer, tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        http_port: int) -> None:
    target = sshd.target(sshd.known_hosts(tmp_path))
    counter = tmp_path / "counter"
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    record = record_path(record_dir(environ), COMMAND, "/project")
    written = []
    for run in (1, 2):
        started = command(environ, monkeypatch)
        with FabricRemote(target) as remote:
            [result] = remote.run([counting_read(counter)])
            answer = remote.forward("127.0.0.1", http_port, health, 5)
            assert remote.round_trips == 2
        started.finish()
        written.append(record.stat().st_ino)
        assert result.stdout.strip() == str(run)  # the second run's read is its own run's, not the first's
        assert answer.answer.startswith(b"HTTP/1.0 200") or answer.answer.startswith(b"HTTP/1.1 200")
    assert counter.read_text() == "x\nx\n"  # sent once per command, ahead in the second
    assert written[0] == written[1]  # the second run read the same: its record was not written again
    assert ASKED == ["/health", "/health"]


def test_a_batch_other_than_the_one_remembered_is_sent_by_the_command(
        sshd: SshServer, tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile changed between two runs: the command reads what it reads now, on the connection opened ahead."""
    target = sshd.target(sshd.known_hosts(tmp_path))
    counter = tmp_path / "counter"
    started = command(environ, monkeypatch)
    with FabricRemote(target) as remote:
        remote.run([counting_read(counter)])
    started.finish()
    started = command(environ, monkeypatch)
    with FabricRemote(target) as remote:
        [result] = remote.run([Step("other", ("echo", "what the command reads now"), read=True)])
        [after] = remote.run([Step("a write", ("true",))])
    started.finish()
    assert result.stdout == "what the command reads now\n" and after.exit_code == 0
    assert load(record_path(record_dir(environ), COMMAND, "/project"), COMMAND, "/project") == [
        (target, ((Step("other", ("echo", "what the command reads now"), read=True),),))]


@pytest.mark.parametrize("first", [
    Step("a write", ("touch", "/tmp/x")),  # not marked read
    Step("a read of a secret", ("cat", "/etc/x"), read=True, secret=True),
])
def test_nothing_that_may_change_the_host_or_holds_a_secret_is_remembered(
        sshd: SshServer, tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        first: Step) -> None:
    target = sshd.target(sshd.known_hosts(tmp_path))
    started = command(environ, monkeypatch)
    with FabricRemote(target) as remote:
        remote.run([replace_argv(first)])
        remote.run([Step("a read after it", ("true",), read=True)])
    started.finish()
    assert not record_path(record_dir(environ), COMMAND, "/project").exists()


def replace_argv(step: Step) -> Step:
    """The step, harmless on this machine: its marks are what the test is about."""
    return Step(step.name, ("true",), read=step.read, secret=step.secret)


def test_a_target_that_may_accept_a_new_host_key_is_not_remembered(
        sshd: SshServer, tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    target = sshd.target(sshd.known_hosts(tmp_path), accept_new=True)
    started = command(environ, monkeypatch)
    with FabricRemote(target) as remote:
        remote.run([Step("a read", ("true",), read=True)])
    started.finish()
    assert not record_path(record_dir(environ), COMMAND, "/project").exists()


def test_a_remembered_host_that_refuses_gets_the_commands_own_connect_error(
        tmp_path: Path, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    target = SSHTarget(host="127.0.0.1", port=9, known_hosts_file=tmp_path / "known_hosts", connect_timeout_s=2)
    save(record_path(record_dir(environ), COMMAND, "/project"), COMMAND, "/project",
         [(target, ((Step("a read", ("true",), read=True),),))])
    started = command(environ, monkeypatch)
    remote = FabricRemote(target, connect_policy=Retrying(stop=stop_after_attempt(1), reraise=True))
    with pytest.raises(ConnectFailed, match=r"127\.0\.0\.1"):
        remote.run([Step("a read", ("true",), read=True)])
    remote.close()
    started.finish()


HOSTILE = "it's \"quoted\" $(rm -rf ~) `x` \\ \n\t ünï ☃"


def test_the_record_keeps_every_step_and_target_as_sent_and_ignores_what_it_cannot_trust(
        tmp_path: Path, environ: dict[str, str]) -> None:
    """Hostile argv, names and stdin bytes come back equal; a record others may write, a record of another command
    line or directory, and a record that is not JSON are no record."""
    target = SSHTarget(host="gpu-1", port=2222, user="deploy", key_files=(Path(f"/keys/{HOSTILE}"),),
                       known_hosts_file=Path("~/.ssh/known_hosts"))
    ops = ((Step(HOSTILE, ("printf", HOSTILE), sudo=True, stdin=b"\x00\xff" + HOSTILE.encode(),
                 ok=frozenset({0, 1, 127}), timeout_s=7.5, concurrent=True, repeatable=True, read=True),),
           Exchange("127.0.0.1", 30000, b"GET /health HTTP/1.1\r\n\r\n", 5.0))
    path = record_path(record_dir(environ), COMMAND, "/project")
    save(path, COMMAND, "/project", [(target, ops)])
    assert load(path, COMMAND, "/project") == [(target, ops)]
    assert load(path, (*COMMAND, "--yes"), "/project") == [] and load(path, COMMAND, "/elsewhere") == []
    assert path.stat().st_mode & 0o077 == 0
    path.chmod(0o620)  # group-writable
    assert load(path, COMMAND, "/project") == []
    path.chmod(0o600)
    path.write_text("{not json")
    assert load(path, COMMAND, "/project") == []


def test_only_a_read_or_an_http_get_may_be_sent_ahead() -> None:
    assert sent_ahead((Step("a", ("true",), read=True),))
    assert not sent_ahead((Step("a", ("true",), read=True), Step("b", ("rm", "x"))))
    assert not sent_ahead(())
    assert sent_ahead(Exchange("h", 1, b"GET / HTTP/1.1\r\n\r\n", 1))
    assert not sent_ahead(Exchange("h", 1, b"POST /generate HTTP/1.1\r\n\r\n", 1))


def test_the_switch_turns_it_off(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    read_ahead.start(COMMAND, "/project", {**environ, read_ahead.SWITCH_ENV: "0"})
    assert reads_record.current() is None
