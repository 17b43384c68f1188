"""FabricRemote, and the store's batches through it, against a real OpenSSH server started on 127.0.0.1 for
this module (no sandbox VM needed).

Skips with a reason when sshd (Debian package openssh-server) is not installed.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import pytest
from helpers.remote_ssh import SshServer, free_port, keygen
from tenacity import stop_after_attempt, wait_none

from deploy_lib.errors import ConnectFailed, ConnectionLost, LockHeld, StepFailed, StepTimedOut
from deploy_lib.host.store import lock_on_first_change, read_store_facts, take_lock, unlock
from deploy_lib.ops.fleet import in_parallel
from deploy_lib.remote import SSH_CONNECT, FabricRemote, JumpHost, Put, SSHTarget, Step
from deploy_lib.remote.batch import MAX_INLINE_STDIN
from deploy_lib.remote.ssh import SSH_RECONNECT
from deploy_lib.store import (
    HEALTHY,
    LockContext,
    LockOwner,
    StoreFacts,
    StoreLayout,
    Tags,
    acquire_lock,
    append_history,
    history_entry,
    parse_history,
    prune_releases,
    release_json,
    releases_to_prune,
    remove_lock,
    stage_release,
    switch_current,
    this_process_owner,
)


@pytest.fixture
def remote(sshd: SshServer, tmp_path: Path) -> Iterator[FabricRemote]:
    connection = FabricRemote(sshd.target(sshd.known_hosts(tmp_path)))
    yield connection
    connection.close()


def _fingerprint(public_key: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(public_key)], check=True, capture_output=True,
                          text=True).stdout.split()[1]


def test_unknown_host_key_is_refused_with_fingerprint_and_file(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    remote = FabricRemote(sshd.target(known_hosts))
    with pytest.raises(ConnectFailed) as refused:
        remote.run([Step("probe", ("true",))])
    message = str(refused.value)
    assert _fingerprint(sshd.host_public_key) in message
    assert str(known_hosts) in message and "127.0.0.1" in message
    assert "--accept-new-host-key" in message
    assert not known_hosts.exists()


def test_unknown_host_key_is_recorded_and_accepted_with_opt_in(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    first = FabricRemote(sshd.target(known_hosts, accept_new=True))
    assert first.run([Step("probe", ("echo", "hi"))])[0].stdout == "hi\n"
    first.close()
    assert known_hosts.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600
    # Now known: a connection without the opt-in succeeds.
    second = FabricRemote(sshd.target(known_hosts))
    assert second.run([Step("probe", ("echo", "again"))])[0].stdout == "again\n"
    second.close()


def test_changed_host_key_is_refused_even_with_opt_in(sshd: SshServer, tmp_path: Path) -> None:
    keygen(tmp_path / "other")
    known_hosts = tmp_path / "known_hosts"
    kind, blob = (tmp_path / "other.pub").read_text().split()[:2]
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    remote = FabricRemote(sshd.target(known_hosts, accept_new=True))
    with pytest.raises(ConnectFailed) as refused:
        remote.run([Step("probe", ("true",))])
    message = str(refused.value)
    assert "CHANGED" in message
    assert _fingerprint(tmp_path / "other.pub") in message and _fingerprint(sshd.host_public_key) in message
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {blob}\n"


def test_refused_connection_is_retried_then_reported(tmp_path: Path) -> None:
    target = SSHTarget(host="127.0.0.1", port=free_port(), known_hosts_file=tmp_path / "known_hosts")
    remote = FabricRemote(target, connect_policy=SSH_CONNECT.copy(sleep=lambda _: None,
                                                                  stop=stop_after_attempt(2)))
    with pytest.raises(ConnectFailed, match=f"cannot connect to .*127.0.0.1:{target.port}"):
        remote.run([Step("probe", ("true",))])


def _through_itself(sshd: SshServer, known_hosts: Path, accept_new: bool = False) -> SSHTarget:
    """`localhost` reached through the jump host `127.0.0.1` (the same sshd): two hops, two known_hosts names."""
    direct = sshd.target(known_hosts, accept_new)
    return SSHTarget(host="localhost", port=sshd.port, user=direct.user, key_files=direct.key_files,
                     known_hosts_file=known_hosts, connect_timeout_s=5, accept_new_host_key=accept_new,
                     jump=JumpHost("127.0.0.1", sshd.port, direct.user))


def _known_line(sshd: SshServer, name: str, public_key: Path | None = None) -> str:
    kind, blob = (public_key or sshd.host_public_key).read_text().split()[:2]
    return f"[{name}]:{sshd.port} {kind} {blob}\n"


def test_jump_host_carries_steps_and_puts(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(_known_line(sshd, "127.0.0.1") + _known_line(sshd, "localhost"))
    with FabricRemote(_through_itself(sshd, known_hosts)) as remote:
        assert remote.run([Step("probe", ("echo", "through"))])[0].stdout == "through\n"
        remote.run([Put(PurePosixPath(str(tmp_path / "put.txt")), b"via jump", 0o600)])
        assert remote.target.address.endswith(f"via {getpass.getuser()}@127.0.0.1:{sshd.port}")
    assert (tmp_path / "put.txt").read_bytes() == b"via jump"


def test_unknown_key_of_the_target_behind_a_jump_host_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(_known_line(sshd, "127.0.0.1"))
    with pytest.raises(ConnectFailed) as refused, FabricRemote(_through_itself(sshd, known_hosts)) as remote:
        remote.run([Step("probe", ("true",))])
    message = str(refused.value)
    assert f"host key of host [localhost]:{sshd.port} via jump host" in message
    assert _fingerprint(sshd.host_public_key) in message
    assert known_hosts.read_text() == _known_line(sshd, "127.0.0.1")


def test_unknown_key_of_the_jump_host_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(_known_line(sshd, "localhost"))
    with pytest.raises(ConnectFailed) as refused, FabricRemote(_through_itself(sshd, known_hosts)) as remote:
        remote.run([Step("probe", ("true",))])
    assert f"host key of jump host [127.0.0.1]:{sshd.port} is not in" in str(refused.value)
    assert _fingerprint(sshd.host_public_key) in str(refused.value)


def test_changed_key_of_the_jump_host_is_refused_even_with_opt_in(sshd: SshServer, tmp_path: Path) -> None:
    keygen(tmp_path / "other")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(_known_line(sshd, "127.0.0.1", tmp_path / "other.pub"))
    with (pytest.raises(ConnectFailed) as refused,
          FabricRemote(_through_itself(sshd, known_hosts, accept_new=True)) as remote):
        remote.run([Step("probe", ("true",))])
    assert f"host key of jump host 127.0.0.1:{sshd.port} CHANGED" in str(refused.value)
    assert _fingerprint(tmp_path / "other.pub") in str(refused.value)
    assert known_hosts.read_text() == _known_line(sshd, "127.0.0.1", tmp_path / "other.pub")


def test_opt_in_records_the_key_of_each_hop(sshd: SshServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    with FabricRemote(_through_itself(sshd, known_hosts, accept_new=True)) as remote:
        remote.run([Step("probe", ("true",))])
    recorded = known_hosts.read_text()
    assert recorded == _known_line(sshd, "127.0.0.1") + _known_line(sshd, "localhost")


def test_batch_runs_in_one_shell_and_returns_one_result_per_step(remote: FabricRemote) -> None:
    script_pid = ("sh", "-c", "cut -d' ' -f4 /proc/$PPID/stat")  # parent of `timeout`: the batch's shell
    results = remote.run([Step("a", script_pid), Step("b", ("printf", "%s", "no newline")),
                          Step("c", script_pid), Step("d", ("sh", "-c", "echo err >&2; exit 3"), ok=frozenset({3}))])
    assert remote.round_trips == 1
    assert [r.step.name for r in results] == ["a", "b", "c", "d"]
    assert results[0].stdout == results[2].stdout and results[0].stdout.strip().isdigit()
    assert results[1].stdout == "no newline"
    assert (results[3].exit_code, results[3].stdout, results[3].stderr) == (3, "", "err\n")


def test_a_round_trip_ends_when_the_exit_status_arrives_not_at_a_poll(remote: FabricRemote,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """invoke's wait slept 10 ms between looks at the channel, which every round trip paid up to once more."""
    import invoke.runners

    from deploy_lib.remote import runner
    invoke_naps: list[float] = []
    monkeypatch.setattr(invoke.runners, "time", type("Clock", (), {"sleep": staticmethod(invoke_naps.append)}))
    [result] = remote.run([Step("a while", ("sleep", "0.3"))])
    assert result.exit_code == 0 and invoke_naps == [] and runner.EXIT_POLL_S <= 0.001


def test_a_groups_host_waits_on_its_exit_status_not_on_polls(remote: FabricRemote,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's hosts run in worker threads (ops.fleet.in_parallel), where the wait is woken by the exit status:
    8 threads each looking every millisecond took the interpreter lock from one another (failed before: the worker
    slept between its looks, as the main thread still does)."""
    from deploy_lib.remote import connection
    naps: list[float] = []
    clock = type("Clock", (), {"sleep": staticmethod(naps.append), "monotonic": staticmethod(time.monotonic)})
    monkeypatch.setattr(connection, "time", clock)
    [ran] = in_parallel([remote], lambda host: host.run([Step("a while", ("sh", "-c", "sleep 0.3; echo done"))]),
                        "host")
    assert [(result.exit_code, result.stdout) for result in ran.result()] == [(0, "done\n")] and naps == []


def test_each_hop_sends_its_small_packets_at_once(sshd: SshServer, tmp_path: Path) -> None:
    """A connection's socket has TCP_NODELAY, as OpenSSH's ssh sets it: with Nagle's algorithm every channel a round
    trip opened waited about 40 ms for the server's delayed ACK (failed before: the option was 0). Through a jump
    host, the jump host's own connection carries it."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(_known_line(sshd, "127.0.0.1") + _known_line(sshd, "localhost"))
    for target in (sshd.target(known_hosts), _through_itself(sshd, known_hosts)):
        with FabricRemote(target) as remote:
            assert remote.run([Step("probe", ("true",))])[0].exit_code == 0
            direct = remote._gateways[0] if remote._gateways else remote._connect()
            assert direct.transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_hostile_arguments_and_binary_stdin_arrive_unchanged(remote: FabricRemote) -> None:
    hostile = ("a b", "it's", '"q"', "$(touch /tmp/pwned)", "`id`", "line1\nline2", "*", "~", "-n", "")
    payload = bytes(range(256)) * 64
    results = remote.run([Step("args", ("printf", "%s\\0", *hostile)),
                          Step("stdin", ("sha256sum",), stdin=payload)])
    assert results[0].stdout.split("\0")[:-1] == list(hostile)
    assert results[1].stdout.split()[0] == hashlib.sha256(payload).hexdigest()


def test_failed_step_stops_the_batch_and_carries_the_tail(remote: FabricRemote, tmp_path: Path) -> None:
    never = tmp_path / "never-created"
    noisy = ("sh", "-c", "for i in $(seq 1 40); do echo out$i; echo err$i >&2; done; exit 7")
    with pytest.raises(StepFailed) as failed:
        remote.run([Step("ok", ("true",)), Step("noisy", noisy), Step("after", ("touch", str(never)))])
    error = failed.value
    assert error.step.name == "noisy" and error.result.exit_code == 7
    assert "err40" in str(error) and "out40" in str(error) and "err1\n" not in str(error)
    assert error.result.stdout.count("\n") == 40
    assert not never.exists()


def test_secret_step_is_masked_in_the_error(remote: FabricRemote) -> None:
    with pytest.raises(StepFailed) as failed:
        remote.run([Step("token", ("sh", "-c", "echo hunter2; exit 1"), secret=True)])
    assert "hunter2" not in str(failed.value) and "***" in str(failed.value)


def _processes_with_cmdline(cmdline: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == cmdline:
                found.append(int(entry.name))
        except OSError:
            continue  # exited while we looked
    return found


def test_step_past_its_timeout_is_killed_and_reported(remote: FabricRemote, tmp_path: Path) -> None:
    with pytest.raises(StepTimedOut) as timed_out:
        remote.run([Step("fast", ("true",)), Step("slower", ("sleep", "31.78"), timeout_s=0.5)])
    assert timed_out.value.step.name == "slower"
    assert "timed out after 0.5 s" in str(timed_out.value)
    assert _processes_with_cmdline(b"sleep\x0031.78\x00") == []
    assert remote.run([Step("still usable", ("echo", "ok"))])[0].stdout == "ok\n"


def test_dropped_connection_is_reported_and_the_next_batch_reconnects(remote: FabricRemote) -> None:
    kill_own_session = ("sh", "-c", 'p=$$; until case $(cat /proc/$p/comm) in sshd*) true;; *) false;; esac; '
                                    'do p=$(cut -d" " -f4 /proc/$p/stat); done; kill -9 $p; sleep 5')
    with pytest.raises(ConnectionLost, match="lost during step 'drop'"):
        remote.run([Step("drop", kill_own_session)])
    assert remote.run([Step("again", ("echo", "back"))])[0].stdout == "back\n"


_FIND_OWN_SSHD = ('p=$$; until case $(cat /proc/$p/comm) in sshd*) true;; *) false;; esac; '
                  'do p=$(cut -d" " -f4 /proc/$p/stat); done; ')


def test_a_dropped_read_is_sent_again_on_a_new_connection_and_a_restart_is_not(sshd: SshServer,
                                                                             tmp_path: Path) -> None:
    """The connection drops once (the step kills its own sshd session the first time it runs): a step marked safe
    to repeat is sent again on a new connection and its result comes back; one that is not is sent once."""
    runs = tmp_path / "runs"
    # the kill waits a second: sshd killed while a step before it in the round trip had its result in sshd's buffer
    # lost that result too (clean-clone CI: the loss named 'before', whose result never came), not what is tested
    drop_once = ("sh", "-c", f'echo run >>"$1"; [ "$(wc -l <"$1")" -gt 1 ] && {{ echo answered; exit 0; }}; '
                             f'sleep 1; {_FIND_OWN_SSHD}kill -9 $p; sleep 5', "sh", str(runs))
    fast = SSH_RECONNECT.copy(wait=wait_none())
    with FabricRemote(sshd.target(sshd.known_hosts(tmp_path)), reconnect_policy=fast) as remote:
        [result] = remote.run([Step("read", drop_once, repeatable=True)])
        assert result.stdout == "answered\n" and runs.read_text() == "run\nrun\n"
        runs.unlink()
        with pytest.raises(ConnectionLost, match="'restart' is not safe to repeat") as lost:
            remote.run([Step("before", ("true",)), Step("restart", drop_once)])
        assert runs.read_text() == "run\n" and lost.value.completed == ("before",)


@pytest.mark.parametrize("thread", ["main", "a group's host"])
def test_a_round_trip_that_hears_nothing_past_its_steps_timeouts_is_a_dead_connection(sshd: SshServer,
                                                                                      tmp_path: Path,
                                                                                      thread: str) -> None:
    """A half-open connection: the step stops its own sshd session (SIGSTOP), so the channel stays open and silent.
    The round trip ends after the step's timeout, `timeout`'s kill delay and the grace, as a lost connection, in the
    main thread (which sleeps between its looks) and in a group's worker thread (woken by the channel's event)."""
    pid_file = tmp_path / "sshd.pid"
    freeze = ("sh", "-c", f'{_FIND_OWN_SSHD}echo $p >"$1"; kill -STOP $p; sleep 30', "sh", str(pid_file))
    remote = FabricRemote(sshd.target(sshd.known_hosts(tmp_path)), silence_grace_s=1)
    try:
        def send(host: FabricRemote) -> object:
            return host.run([Step("frozen", freeze, timeout_s=1)])
        with pytest.raises(ConnectionLost, match=r"nothing arrived for .* a dead connection"):
            send(remote) if thread == "main" else in_parallel([remote], send, "host")[0].result()
    finally:
        remote.close()
        if pid_file.exists():  # the session this test stopped: continued, then ended (unless already gone)
            frozen = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
                os.kill(frozen, signal.SIGKILL)
    assert FabricRemote(sshd.target(sshd.known_hosts(tmp_path))).run([Step("after", ("echo", "ok"))])[0].stdout == \
        "ok\n"


def test_a_round_trip_whose_channel_never_opens_is_a_dead_connection_and_sent_again(
        sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link that died between two round trips: the connection's sshd session is stopped (SIGSTOP) after the first,
    so the next one's channel open is never answered (paramiko would wait an hour for it, and without end for the
    exec's reply). Past the bound (2 s here, 30 s by default) it is a dead connection: a step safe to repeat is sent
    again on a new connection, one that is not ends in ConnectionLost saying why."""
    monkeypatch.setattr("deploy_lib.remote.ssh.CHANNEL_OPEN_S", 2.0)
    fast = SSH_RECONNECT.copy(wait=wait_none())
    frozen: list[int] = []
    own_sshd = ("sh", "-c", f"{_FIND_OWN_SSHD}echo $p")
    try:
        with FabricRemote(sshd.target(sshd.known_hosts(tmp_path)), reconnect_policy=fast) as remote:
            for step in (Step("read", ("echo", "answered"), repeatable=True), Step("restart", ("true",))):
                frozen.append(int(remote.run([Step("own sshd", own_sshd)])[0].stdout))
                os.kill(frozen[-1], signal.SIGSTOP)
                if step.repeatable:
                    assert remote.run([step])[0].stdout == "answered\n"
                else:
                    with pytest.raises(ConnectionLost, match=r"its channel did not open within 2 s: a dead conn"):
                        remote.run([step])
    finally:
        for pid in frozen:  # the sessions this test stopped: continued, then ended (unless already gone)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def test_a_put_whose_sftp_channel_never_opens_is_a_dead_connection_and_sent_again(
        sshd: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same dead link under an upload: the connection's sshd session is stopped before its first Put, so the
    SFTP channel's open is never answered. Before, the upload waited there (paramiko's hour for the open; the
    subsystem's start without end); now past the bound (2 s here) it is a dead connection and the Put, safe to
    repeat, is sent again on a new one. (A small Put goes inline in a round trip's script, under the run's bound.)"""
    monkeypatch.setattr("deploy_lib.remote.ssh.CHANNEL_OPEN_S", 2.0)
    dest, data = tmp_path / "weights.bin", b"w" * (MAX_INLINE_STDIN + 1)  # too large to go inline: over SFTP
    frozen: list[int] = []
    try:
        with FabricRemote(sshd.target(sshd.known_hosts(tmp_path)),
                          reconnect_policy=SSH_RECONNECT.copy(wait=wait_none())) as remote:
            frozen.append(int(remote.run([Step("own sshd", ("sh", "-c", f"{_FIND_OWN_SSHD}echo $p"))])[0].stdout))
            os.kill(frozen[-1], signal.SIGSTOP)
            [result] = remote.run([Put(PurePosixPath(dest), data, 0o600)])
    finally:
        for pid in frozen:  # the session this test stopped: continued, then ended (unless already gone)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    assert result.exit_code == 0 and dest.read_bytes() == data
    assert remote.round_trips == 3, "the read, the upload cut off, the upload sent again on a new connection"


def test_put_writes_atomically_with_mode_before_rename(remote: FabricRemote, tmp_path: Path) -> None:
    dest = tmp_path / "dir with space" / "app.env"
    dest.parent.mkdir()
    dest.write_text("OLD=1\n")
    old_inode = dest.stat().st_ino
    remote.run([Put(PurePosixPath(dest), b"TOKEN=s3cr3t\n", 0o600, secret=True)])
    assert dest.read_bytes() == b"TOKEN=s3cr3t\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert dest.stat().st_ino != old_inode  # replaced by a rename, never rewritten in place
    assert sorted(p.name for p in dest.parent.iterdir()) == ["app.env"]


def test_put_into_a_missing_directory_fails_without_leftovers(remote: FabricRemote, tmp_path: Path) -> None:
    with pytest.raises(StepFailed) as failed:
        remote.run([Put(PurePosixPath(tmp_path / "missing" / "f"), b"x", 0o644), Step("after", ("true",))])
    assert failed.value.step.dest.name == "f"
    assert remote.round_trips == 1


def test_connection_is_reused_across_batches(remote: FabricRemote) -> None:
    session = ("sh", "-c", 'p=$$; until case $(cat /proc/$p/comm) in sshd*) true;; *) false;; esac; '
                           'do p=$(cut -d" " -f4 /proc/$p/stat); done; echo $p')
    first = remote.run([Step("session", session)])[0].stdout
    second = remote.run([Step("session", session)])[0].stdout
    assert first.strip().isdigit() and first == second
    assert remote.round_trips == 2


# The store's batches against real coreutils/findutils over SSH, in a root path full of shell metacharacters.

HOSTILE_DIR = "it's a \"store\" $(touch pwned) `id` *\nline"


def _tags(release_id: str) -> Tags:
    return Tags("ops@laptop", "gpu1", release_id, "glm5-nvfp4", "ph", {"sglang": "0.5.9"})


def _stage_and_switch(remote: FabricRemote, layout: StoreLayout, release_id: str, staged_at: datetime) -> None:
    remote.run(stage_release(layout, release_id, f"[Unit]\nDescription={release_id}\n", "HF_TOKEN=hunter2\n",
                             release_json({"id": release_id}, _tags(release_id), staged_at)))
    remote.run(switch_current(layout, release_id))


def test_store_cycle_over_ssh(remote: FabricRemote, tmp_path: Path) -> None:
    root = tmp_path / HOSTILE_DIR
    layout = StoreLayout("sglang", root=PurePosixPath(root), unit_dir=PurePosixPath(tmp_path / "systemd"))
    (tmp_path / "systemd").mkdir()
    empty = read_store_facts(remote, layout)
    assert replace(empty, digest=None) == StoreFacts(None, (), (), (), None)
    assert empty.digest == f"{hashlib.sha256(b'').hexdigest()}  -", "nothing there: the digest of no output"
    for n, release_id in enumerate(["r1", "r2", "r3"]):
        remote.run(acquire_lock(layout, this_process_owner(release_id, datetime.now(UTC))))
        _stage_and_switch(remote, layout, release_id, datetime(2026, 11, 29, 10, n, tzinfo=UTC))
        outcome = "failed" if release_id == "r3" else HEALTHY
        remote.run(append_history(layout, history_entry("deploy", outcome, _tags(release_id),
                                                        datetime.now(UTC), timings={"stage": 0.1})))
        remote.run(remove_lock(layout))
    service_dir = root / "sglang"
    assert os.readlink(service_dir / "current") == "releases/r3"
    assert (tmp_path / "systemd" / "sglang.service").read_text() == "[Unit]\nDescription=r3\n"
    assert stat.S_IMODE((service_dir / "releases" / "r3" / "sglang.env").stat().st_mode) == 0o600
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()

    (service_dir / "releases" / "r4.tmp").mkdir()  # a staging dir left by a dropped connection
    facts = read_store_facts(remote, layout)
    assert facts.current == "r3" and [r.id for r in facts.releases] == ["r1", "r2", "r3"]
    assert facts.incomplete == ("r4.tmp",) and facts.last_healthy() == "r2"
    assert [(e.event, e.outcome, e.tags.release) for e in facts.history] == [
        ("deploy", HEALTHY, "r1"), ("deploy", HEALTHY, "r2"), ("deploy", "failed", "r3")]

    doomed = releases_to_prune(facts, keep=1)
    assert doomed == ("r1", "r4.tmp")
    remote.run(prune_releases(layout, doomed))
    assert sorted(p.name for p in (service_dir / "releases").iterdir()) == ["r2", "r3"]


def test_a_store_changed_after_the_read_stops_the_first_change_over_ssh(remote: FabricRemote, tmp_path: Path) -> None:
    """Input tried: the hostile store path; another command appends a history line between this command's read and
    its first change (the lock's compare-and-set), then the same without that line."""
    layout = StoreLayout("sglang", root=PurePosixPath(tmp_path / HOSTILE_DIR), unit_dir=PurePosixPath(tmp_path))
    _stage_and_switch(remote, layout, "r1", datetime(2026, 11, 29, 10, 0, tzinfo=UTC))
    change = Step("a change", ("touch", "--", str(tmp_path / "changed")))
    with pytest.raises(LockHeld, match="changed after this command read it"):
        with lock_on_first_change(remote, layout, "deploy", "gpu1") as locked:
            read = read_store_facts(locked, layout)
            locked.decided_from(read.lock, read.digest)
            assert read.digest == read_store_facts(remote, layout).digest, "the same store reads the same digest"
            remote.run(append_history(layout, history_entry("stop", "stopped", _tags("r1"), datetime.now(UTC))))
            locked.run([change])
    assert not (tmp_path / "changed").exists() and not Path(layout.lock).exists(), "nothing changed, lock released"
    with lock_on_first_change(remote, layout, "deploy", "gpu1") as locked:
        read = read_store_facts(locked, layout)
        locked.decided_from(read.lock, read.digest)
        locked.run([change])
        assert Path(layout.lock_owner).exists() and (tmp_path / "changed").exists()
    assert not Path(layout.lock).exists(), "released at the end"


def test_switch_to_a_missing_release_changes_nothing(remote: FabricRemote, tmp_path: Path) -> None:
    layout = StoreLayout("sglang", root=PurePosixPath(tmp_path), unit_dir=PurePosixPath(tmp_path))
    (tmp_path / "sglang").mkdir()
    with pytest.raises(StepFailed, match="release is complete"):
        remote.run(switch_current(layout, "nope"))
    assert sorted(p.name for p in (tmp_path / "sglang").iterdir()) == []


def test_lock_over_ssh_held_then_taken_over_then_unlocked(remote: FabricRemote, tmp_path: Path) -> None:
    """A lock whose owner process on this machine is gone is taken over by the next take, with one line and a
    history record; from another machine the same lock is only held; `unlock --force` clears a live one."""
    layout = StoreLayout("sglang", root=PurePosixPath(tmp_path / HOSTILE_DIR))
    first = LockOwner("o'brien", "laptop", 999_999_999, "2026-11-29T10:00:00+00:00", "r1", "tok1")
    lines: list[str] = []
    here = LockContext(where="gpu1", this_host="laptop", is_alive=lambda pid: pid != first.pid, note=lines.append)
    elsewhere = LockContext(where="gpu1", this_host="ci-runner", is_alive=lambda pid: True)
    take_lock(remote, layout, first, here)
    with pytest.raises(LockHeld, match=r"held by o'brien@laptop \(pid 999999999\)"):
        take_lock(remote, layout, this_process_owner("r2", datetime.now(UTC)), elsewhere)
    second = this_process_owner("r2", datetime.now(UTC))
    take_lock(remote, layout, second, here)
    assert lines == [f"took over the deploy lock on gpu1 from {first}: its owner, pid 999999999 on this machine "
                     "(laptop), is no longer running"]
    assert LockOwner.from_json((Path(str(layout.lock_owner))).read_text()) == second
    record = json.loads(Path(str(layout.history)).read_text().splitlines()[-1])
    assert (record["event"], record["outcome"], record["cause"]) == ("lock", "taken-over", lines[0])
    with pytest.raises(LockHeld, match="--force"):
        unlock(remote, layout, force=False, context=elsewhere)
    assert unlock(remote, layout, force=True, context=elsewhere) is not None
    assert not Path(str(layout.lock)).exists()


def test_a_history_line_torn_by_a_power_loss_is_kept_and_the_next_line_is_not_glued_to_it(
        remote: FabricRemote, tmp_path: Path) -> None:
    """Input tried: history.jsonl whose last line was cut off mid-way (no newline), as a power cut leaves it."""
    layout = StoreLayout("sglang", root=PurePosixPath(tmp_path / HOSTILE_DIR))
    history = Path(str(layout.history))
    history.parent.mkdir(parents=True)
    tags = Tags("ops@laptop", "gpu1", "r1", "glm5-nvfp4", "ph", {})
    whole = history_entry("deploy", HEALTHY, tags, datetime.now(UTC)).to_json()
    history.write_bytes(whole + whole[:40])
    remote.run(append_history(layout, history_entry("rollback", HEALTHY, tags, datetime.now(UTC))))
    entries, unreadable = parse_history(history.read_text())
    assert [e.event for e in entries] == ["deploy", "rollback"] and unreadable == 1
    assert history.read_bytes().startswith(whole + whole[:40] + b"\n"), "the torn line is kept as it was"


def test_each_result_is_reported_as_it_arrives_failures_included(sshd: SshServer, tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    remote = FabricRemote(sshd.target(sshd.known_hosts(tmp_path)),
                          on_result=lambda result: seen.append((result.step.name, result.exit_code)))
    with remote, pytest.raises(StepFailed):
        remote.run([Step("a", ("true",)), Put(PurePosixPath(tmp_path / "f"), b"x", 0o644),
                    Step("b", ("false",)), Step("c", ("true",))])
    assert seen == [("a", 0), (f"put {tmp_path / 'f'}", 0), ("b", 1)]


def test_ctrl_c_during_a_streamed_step_closes_it_and_the_remote_command_stops(remote: FabricRemote,
                                                                            tmp_path: Path) -> None:
    """Without closing the channel, invoke waits for the command to end before raising (here: DONE written)."""
    done = tmp_path / "DONE"
    loop = Step("long", ("sh", "-c", f"for i in $(seq 30); do echo $i; sleep 0.1; done; touch {done}"))
    seen: list[str] = []

    def ctrl_c_at_first_line(line: str) -> None:
        if line.strip().isdigit() and not seen:
            seen.append(line)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        remote.run([loop], on_output=ctrl_c_at_first_line)
        time.sleep(10)  # the signal is handled in the main thread at its next instruction
    time.sleep(0.5)  # the loop's next echo meets the closed channel
    assert seen and not done.exists()
    assert remote.run([Step("after", ("echo", "ok"))])[0].stdout == "ok\n"  # the connection still works


def test_push_directory_sends_changed_files_and_links_the_rest(remote: FabricRemote, tmp_path: Path) -> None:
    local = tmp_path / "weights"
    local.mkdir()
    (local / "config.json").write_text("{}")
    (local / "shard.safetensors").write_bytes(b"x" * 300_000)
    first, second = tmp_path / "host" / "v1", tmp_path / "host" / "v2"
    first.mkdir(parents=True)
    lines: list[str] = []
    remote.push_directory(local, PurePosixPath(first), None, on_output=lines.append)
    assert (first / "shard.safetensors").read_bytes() == b"x" * 300_000 and any("100%" in line for line in lines)
    shard = local / "shard.safetensors"
    shard.write_bytes(b"y" * 300_000)
    # rsync's quick check compares size and mtime (docs/deploy.md: "as rsync's own quick check"): an edit of the
    # same size within the same second as the first push is invisible to it, so the test edits later, as users do
    later = (first / "shard.safetensors").stat().st_mtime + 5
    os.utime(shard, (later, later))
    remote.push_directory(local, PurePosixPath(second), PurePosixPath(first))
    assert (second / "shard.safetensors").read_bytes() == b"y" * 300_000
    assert (second / "config.json").stat().st_ino == (first / "config.json").stat().st_ino
    with pytest.raises(StepFailed, match="push"):
        remote.push_directory(tmp_path / "absent", PurePosixPath(second), None)


def test_after_ctrl_c_at_any_point_of_a_round_trip_the_next_step_runs(remote: FabricRemote) -> None:
    """Input tried: SIGINT landing at 40 points spread over a round trip's life (opening the channel, the command,
    reading its result). A CI run saw the rollback's first step after an interrupt fail with 'connection lost'.

    The loop ends once the handler has run, not only on the KeyboardInterrupt: one landing in paramiko's
    `Channel.__del__` (paramiko 4.0.0 and 5.1.0 channel.py: a bare `except: pass` around close, run whenever a
    dropped channel is collected) is swallowed, and a loop waiting for it ran for ever on a loaded machine."""
    handled = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        handled.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        for attempt in range(40):
            handled.clear()
            timer = threading.Timer(0.001 + attempt * 0.004, os.kill, (os.getpid(), signal.SIGINT))
            try:
                timer.start()  # inside the try: on a busy machine the signal can land before the loop's first step
                while not handled.is_set():
                    remote.run([Step("busy", ("sh", "-c", "echo x")), Step("next", ("true",))])
            except KeyboardInterrupt:
                pass
            timer.join()
            assert remote.run([Step("after", ("echo", "ok"))])[0].stdout == "ok\n", f"attempt {attempt}"
    finally:
        signal.signal(signal.SIGINT, previous)
