"""A dropped connection: which steps are sent again on a new connection, how often, what never is, and the silence
bound of a round trip. FabricRemote runs over a fake transport here (its round trip replaced by a function that
drops or answers); tests/test_remote_ssh.py drops a real OpenSSH connection."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import pytest
from helpers.recording_progress import RecordingProgress
from tenacity import stop_after_delay, wait_none

from deploy_lib.errors import ConnectFailed, ConnectionLost
from deploy_lib.health import ProbeTarget, Rung, probe_step
from deploy_lib.remote import FabricRemote, Put, SSHTarget, Step, StepResult
from deploy_lib.remote.batch import KILL_AFTER_S, Dropped, SilenceBound
from deploy_lib.remote.readings import read
from deploy_lib.remote.ssh import SSH_RECONNECT
from deploy_lib.remote.steps import repeatable
from deploy_lib.store import StoreLayout, switch_current

READ = Step("read current", ("readlink", "--", "/opt/x/current"), repeatable=True)
RESTART = Step("systemd: restart", ("systemctl", "restart", "--", "sglang.service"), sudo=True)


class FakeTransport:
    """Stands in for the channel: each round trip gets the script steps it would send; `drops` says how many round
    trips die before answering, and after how many results."""

    def __init__(self, drops: int, results_before_drop: int = 0) -> None:
        self.drops, self.results_before_drop = drops, results_before_drop
        self.sent: list[list[str]] = []

    def run_steps(self, steps: tuple[Step, ...], on_output: Callable[[str], None] | None = None) -> list[StepResult]:
        self.sent.append([step.name for step in steps])
        answered = [StepResult(step, 0, f"{step.name}\n", "", 0.0) for step in steps]
        if len(self.sent) <= self.drops:
            cut = min(self.results_before_drop, len(steps) - 1)
            raise Dropped(answered[:cut], steps[cut], "the connection closed")
        return answered


def _remote(transport: FakeTransport, monkeypatch: pytest.MonkeyPatch) -> FabricRemote:
    remote = FabricRemote(SSHTarget(host="192.0.2.1"), reconnect_policy=SSH_RECONNECT.copy(wait=wait_none()))
    monkeypatch.setattr(remote, "_run_steps", transport.run_steps)
    return remote


def test_a_dropped_read_is_sent_again_on_a_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport(drops=2)
    [result] = _remote(transport, monkeypatch).run([READ])
    assert result.stdout == "read current\n"
    assert transport.sent == [["read current"]] * 3


def test_the_steps_whose_results_came_are_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    second = Step("read unit", ("systemctl", "show", "--", "sglang.service"), repeatable=True)
    transport = FakeTransport(drops=1, results_before_drop=1)
    results = _remote(transport, monkeypatch).run([READ, second])
    assert [r.step.name for r in results] == ["read current", "read unit"]
    assert transport.sent == [["read current", "read unit"], ["read unit"]]


def test_reconnecting_is_bounded_and_ends_in_connection_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = FakeTransport(drops=1000)
    with pytest.raises(ConnectionLost, match=r"lost during step 'read current'.*sent again on a new connection 6 "
                                             "time") as lost:
        _remote(transport, monkeypatch).run([READ])
    assert len(transport.sent) == 7  # the round trip, then SSH_RECONNECT's six attempts (or 60 s from the drop)
    assert lost.value.step == READ and lost.value.exit_code == 11


def test_a_drop_after_a_long_round_trip_is_still_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy's delay counts from the drop: a probe found dead after its silence bound (minutes) is sent again."""
    transport = FakeTransport(drops=1)
    remote = _remote(transport, monkeypatch)
    remote.reconnect_policy = SSH_RECONNECT.copy(wait=wait_none(), stop=stop_after_delay(0.05))
    sent = transport.run_steps

    def slow_first(steps: tuple[Step, ...], on_output: Callable[[str], None] | None = None) -> list[StepResult]:
        if not transport.sent:
            time.sleep(0.1)  # longer than the whole reconnect budget
        return sent(steps, on_output)

    monkeypatch.setattr(remote, "_run_steps", slow_first)
    assert remote.run([READ])[0].stdout == "read current\n" and len(transport.sent) == 2


def test_a_restart_or_a_switch_is_never_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = StoreLayout(root=PurePosixPath("/opt/sglang-deploy"), service="sglang")
    for batch in ([RESTART], [READ, RESTART], switch_current(layout, "r1")):
        transport = FakeTransport(drops=1, results_before_drop=1 if batch[0] is READ else 0)
        with pytest.raises(ConnectionLost, match="is not safe to repeat") as lost:
            _remote(transport, monkeypatch).run(batch)
        assert len(transport.sent) == 1, f"{batch[-1].name} was sent again"
        assert lost.value.completed == (("read current",) if batch[0] is READ else ())


def test_a_drop_before_a_repeatable_tail_resends_only_that_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart whose result came, then a read: the read goes again, the restart does not."""
    transport = FakeTransport(drops=1, results_before_drop=1)
    results = _remote(transport, monkeypatch).run([RESTART, READ])
    assert [r.step.name for r in results] == ["systemd: restart", "read current"]
    assert transport.sent == [["systemd: restart", "read current"], ["read current"]]


def test_a_put_is_sent_again_as_its_write_and_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    put = Put(PurePosixPath("/opt/x/releases/.r1.tmp/app.env"), b"A=1\n", 0o600, sudo=True)
    transport = FakeTransport(drops=1, results_before_drop=1)  # the write came, the rename did not
    [result] = _remote(transport, monkeypatch).run([put])
    assert result.step == put and result.exit_code == 0
    first, again = transport.sent
    assert again == first, "the whole Put again, to the same temp file"


def test_a_first_connect_that_fails_is_not_a_lost_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that is down before anything was sent: ConnectFailed at once (nothing changed), not retried here."""
    calls: list[int] = []

    def refuse(steps: Sequence[Step], on_output: object = None) -> list[StepResult]:
        calls.append(1)
        raise ConnectFailed("cannot connect to host root@192.0.2.1:22: timed out")

    remote = FabricRemote(SSHTarget(host="192.0.2.1"), reconnect_policy=SSH_RECONNECT.copy(wait=wait_none()))
    monkeypatch.setattr(remote, "_run_steps", refuse)
    with pytest.raises(ConnectFailed) as failed:
        remote.run([READ])
    assert not isinstance(failed.value, ConnectionLost) and calls == [1]


def test_which_step_kinds_are_safe_to_repeat() -> None:
    layout = StoreLayout(root=PurePosixPath("/opt/sglang-deploy"), service="sglang")
    probe = probe_step(ProbeTarget(unit="sglang.service", port=30000), Rung.GENERATE)
    assert repeatable(probe) and repeatable(Put(PurePosixPath("/etc/x"), b"x", 0o644))
    assert not any(repeatable(step) for step in [RESTART, *switch_current(layout, "r1")])

    class Recorder:
        def __init__(self) -> None:
            self.batches: list[Sequence[Step | Put]] = []

        def run(self, batch: Sequence[Step | Put], on_output: object = None) -> list[StepResult]:
            self.batches.append(batch)
            return [StepResult(step, 0, "", "", 0.0) for step in batch]

    recorder = Recorder()
    read(recorder, [Step("a read", ("cat", "--", "/etc/hostname"))])  # type: ignore[arg-type]
    assert all(repeatable(step) for step in recorder.batches[0]), "every step of readings.read is a read"


def test_the_silence_bound_is_the_longest_timeout_of_the_steps_still_running() -> None:
    steps = [Step("quick", ("true",), timeout_s=5), Step("long", ("sleep", "1"), timeout_s=300),
             Step("last", ("true",), timeout_s=20)]
    bound = SilenceBound(steps, "cafe", grace_s=15)
    assert bound.bound_s == 300 + KILL_AFTER_S + 15
    bound.seen("cafe 0 start\nout\n\ncafe 0 end 0 1.0 1.1\ncafe 1 start\n")
    assert bound.bound_s == 300 + KILL_AFTER_S + 15
    bound.seen("\ncafe 1 e")  # a marker split over two chunks
    bound.seen("nd 0 1.1 2.0\n")
    assert bound.ended == 2 and bound.bound_s == 20 + KILL_AFTER_S + 15


def test_a_host_that_sends_no_ssh_banner_is_one_line_and_no_paramiko_traceback(tmp_path: Path) -> None:
    """A host powered off mid-boot, or a port that accepts and closes: paramiko's transport thread logged "Error
    reading SSH protocol banner" with its traceback through Python's last-resort handler, before the tool's error.
    Run in a child process: pytest's own log capture would hide what a user's terminal shows."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        closer = threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(2)], daemon=True)
        closer.start()
        script = ("from pathlib import Path\nfrom tenacity import stop_after_attempt\n"
                  "from deploy_lib.errors import ConnectFailed\n"
                  "from deploy_lib.remote import SSH_CONNECT, FabricRemote, SSHTarget, Step\n"
                  f"target = SSHTarget(host='127.0.0.1', port={port}, connect_timeout_s=5, "
                  f"known_hosts_file=Path({str(tmp_path / 'known_hosts')!r}))\n"
                  "try:\n"
                  "    FabricRemote(target, SSH_CONNECT.copy(stop=stop_after_attempt(1))).run([Step('x', ('true',))])\n"
                  "except ConnectFailed as failed:\n"
                  "    print(type(failed).__name__, failed.message)\n")
        ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.stdout.startswith("ConnectFailed cannot connect to host"), ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr and "protocol banner" not in ran.stderr, ran.stderr


@pytest.mark.parametrize("lost_at", ["stage:", "readiness probe (generate)"])
def test_a_deploy_that_cannot_finish_says_the_step_the_link_and_whether_it_was_verified(lost_at: str) -> None:
    """Input tried: the host's connection lost for good (ConnectionLost from the remote layer) at the first stage step
    (the round trip with the switch in flight) or at every probe of the ladder (switched; lost past the deadline)."""
    from helpers.deploy_plan import target
    from helpers.deploy_trips import with_service
    from helpers.rollback import a_host, changed_profile

    from deploy_lib.commands.deploy import Options, deploy

    host = a_host()
    error = ConnectionLost(f"connection to fake@host:22 lost during step {lost_at!r}", step=Step(lost_at, ("true",)))
    if lost_at.startswith("stage"):
        host.reply(lambda step: step.name.startswith(lost_at), raises=error)
    else:
        lost_everywhere = type("LostEverywhere", (dict,), {"__missing__": lambda self, key: [error]})()
        lost_everywhere["B"] = host.probes["B"]
        host.probes = lost_everywhere
    loaded = with_service(changed_profile(), startup_timeout_s=5)  # the least a profile takes
    with pytest.raises(ConnectionLost) as lost:
        deploy(loaded, target(), host, RecordingProgress(), Options(grace_s=0))
    message, new = lost.value.message, lost.value.release_id
    assert message.startswith(f"{target().host.name}: connection to fake@host:22 lost during step") and new != "B"
    if lost_at.startswith("stage"):
        assert f"current is B, or {new} if the host ran on" in message
        assert "systemd: restart" not in host.ran_names()
    else:
        assert f"current is {new};" in message
    assert f"release {new} was NOT verified" in message
    assert f"`invoke deploy --profile {loaded.name}`" in (lost.value.hint or "")
    assert lost.value.exit_code == 11
