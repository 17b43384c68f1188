"""FabricRemote: one lazily opened, reused Fabric connection that runs batches, uploads files and pushes
directories."""

from __future__ import annotations

import io
import logging
import os
import secrets
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import fabric
import fabric.runners
import paramiko
from invoke.exceptions import CommandTimedOut
from tenacity import Retrying, retry_if_exception

from deploy_lib.errors import ConnectFailed, ConnectionLost, SudoPasswordRefused
from deploy_lib.remote.batch import (
    KILL_AFTER_S,
    PUT_TIMEOUT_S,
    ROUND_TRIP_GRACE_S,
    SILENCE_GRACE_S,
    Dropped,
    LineSink,
    SilenceBound,
    batch_script,
    channel_stdin,
    parse_batch_output,
    put_results,
    round_trips,
    script_steps,
    trip_steps_done,
)
from deploy_lib.remote.forward import Forwarded, exchange
from deploy_lib.remote.runner import OPENING, SILENCE, WholeStdinRemote
from deploy_lib.remote.sftp import open_sftp, put_directly, remove_quietly, upload
from deploy_lib.remote.ssh import (
    KEEPALIVE_S,
    SSH_CONNECT,
    SSH_RECONNECT,
    ChannelWatch,
    JumpHost,
    KnownHostsPolicy,
    SSHTarget,
    connect_error,
    connect_kwargs,
    open_hop,
    rsync_argv,
    rsync_env,
    unreachable,
)
from deploy_lib.remote.steps import (
    TIMED_OUT_EXIT,
    OutputLine,
    Put,
    Step,
    StepResult,
    check_result,
    repeatable,
)

# paramiko's transport thread logs a failed connection with its traceback ("Error reading SSH protocol banner"),
# which Python's last-resort handler would print; the failure reaches the user as ConnectFailed/ConnectionLost.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

class FabricRemote:
    """Runs batches over one lazily opened, reused Fabric connection to `target`."""

    def __init__(self, target: SSHTarget, connect_policy: Retrying = SSH_CONNECT,
                 on_result: Callable[[StepResult], None] | None = None, reconnect_policy: Retrying = SSH_RECONNECT,
                 silence_grace_s: float = SILENCE_GRACE_S) -> None:
        self.target = target
        self.connect_policy = connect_policy
        self.reconnect_policy = reconnect_policy
        self.silence_grace_s = silence_grace_s
        self.on_result = on_result
        self.round_trips = 0  # SSH execs, uploads and forwarded exchanges so far: what batching saves (`make bench`)
        self._connection: fabric.Connection | None = None
        self._gateways: list[fabric.Connection] = []  # the jump hosts' connections, the first hop first
        # connections an interrupt left behind, closed with this remote (see `run`)
        self._interrupted: list[fabric.Connection] = []

    # -- connection ------------------------------------------------------------------------------------

    def _connect(self) -> fabric.Connection:
        if self._connection is not None and self._connection.is_connected:
            return self._connection
        self._close_connection()
        target = self.target
        # Each jump host is opened on its own, through the one before it, so that a refusal names the hop it came from.
        chain = target.jump.chain if target.jump is not None else ()
        opened: list[fabric.Connection] = []
        try:
            for index, hop in enumerate(chain):
                opened.append(self._open_hop(hop, opened[-1] if opened else None, chain[index - 1] if index else None,
                                             True, hop.proxy_command))
            self._connection = self._open_hop(JumpHost(target.host, target.port, target.user),
                                              opened[-1] if opened else None, target.jump, False, target.proxy_command)
        except ConnectFailed:
            for gateway in reversed(opened):
                gateway.close()
            raise
        self._gateways = opened
        self._check_sudo_password()
        return self._connection

    def _check_sudo_password(self) -> None:
        """With a sudo password, one root `true` before any step: a password sudo refuses ends here, nothing changed
        (and no later `sudo -S` reads a step's stdin as a second try)."""
        password = self.target.password_for_sudo
        if password is None:
            return
        [checked] = self._run_steps((Step("check the sudo password", ("true",), sudo=True),))
        if checked.exit_code == 0:
            return
        self.close()
        said = checked.stderr.strip().splitlines()[-1] if checked.stderr.strip() else f"exit {checked.exit_code}"
        raise SudoPasswordRefused(
            f"sudo on {self.target.address} refused the password of {self.target.user} from {password.source}: "
            f"{said}; nothing was changed",
            hint="give the password sudo asks that user for (`sudo -v` as that user on the host checks it), or a "
                 "passwordless sudoers rule")

    def _open_hop(self, hop: JumpHost, gateway: fabric.Connection | None, through: JumpHost | None, is_jump: bool,
                  proxy_command: str | None) -> fabric.Connection:
        """One SSH connection (through `gateway`, the connection to the hop `through`, when given; else over
        `proxy_command` or a socket of ours), its host key checked against known_hosts."""
        target = self.target
        # an empty ssh config: the user's was read into `target` already (remote/ssh_config.py)
        config = fabric.Config(lazy=True, ssh_config=paramiko.SSHConfig(),
                               overrides={"runners": {"remote": WholeStdinRemote}})
        connection = fabric.Connection(host=hop.host, user=hop.user, port=hop.port, config=config,
                                       connect_kwargs=connect_kwargs(target), gateway=gateway or False)
        client = connection.client
        client.set_missing_host_key_policy(KnownHostsPolicy(target.known_hosts_path, target.accept_new_host_key))
        try:
            if target.known_hosts_path.exists():
                client.load_host_keys(str(target.known_hosts_path))
            self.connect_policy.copy()(lambda: open_hop(connection, hop, target.connect_timeout_s, gateway is None,
                                                        proxy_command))
            connection.transport.set_keepalive(KEEPALIVE_S)
        except (paramiko.SSHException, OSError, EOFError) as error:
            client.close()
            raise connect_error(target, error, hop, through=through, is_jump=is_jump,
                                proxy_command=proxy_command) from error
        return connection

    def close(self) -> None:
        self._close_connection()

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        while self._gateways:  # Fabric closes a connection, never its gateway: the hop nearest the host first
            self._gateways.pop().close()
        while self._interrupted:
            self._interrupted.pop().close()

    def __enter__(self) -> FabricRemote:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------------------

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results: list[StepResult] = []
        try:
            for trip in round_trips(batch):
                for result in self._send(trip, on_output):
                    if self.on_result is not None:
                        self.on_result(result)
                    check_result(result, self.target.address, self.target.user)
                    results.append(result)
        except KeyboardInterrupt:
            # raised inside paramiko (a channel half opened) it can leave the transport unusable, so the steps that
            # follow (a rollback's) run on a fresh connection; the old one stays open until `close`, so that sshd
            # handles the closed channel and the interrupted command meets it (closed at once, a download ran on)
            self._interrupted.extend(c for c in (self._connection, *reversed(self._gateways)) if c is not None)
            self._connection, self._gateways = None, []
            raise
        return results

    def _send(self, trip: Put | tuple[Step | Put, ...], on_output: OutputLine | None) -> list[StepResult]:
        """One round trip; when its connection drops, the steps whose results had not come are sent again on a new
        connection (`reconnect_policy`), if every one of them is safe to repeat (`steps.repeatable`). Otherwise, or
        when no new connection works, ConnectionLost names the step whose result never came."""
        token = secrets.token_hex(6)  # the same temp names on every attempt: a Put sent again overwrites its own file
        left: tuple[Step | Put, ...] = (trip,) if isinstance(trip, Put) else trip
        done: list[StepResult] = []
        drops: list[Dropped] = []
        attempts = 0

        def attempt() -> list[StepResult]:
            nonlocal left, attempts
            attempts += 1
            try:
                if isinstance(trip, Put):  # a new temp name: SFTP creates it exclusively
                    return [*done, self._put(trip, secrets.token_hex(6))]
                return [*done, *self._run_trip(left, token, on_output)]
            except Dropped as dropped:
                self.close()
                if not isinstance(trip, Put):  # the steps whose results came are not sent again
                    count = trip_steps_done(left, dropped.results)
                    done.extend(put_results(left[:count], dropped.results))
                    left = left[count:]
                drops.append(dropped)
                raise

        def may_send_again(error: BaseException) -> bool:
            after_drop = isinstance(error, Dropped) or (
                bool(drops) and isinstance(error, ConnectFailed) and unreachable(error))
            return after_drop and all(repeatable(step) for step in left)

        try:
            try:
                return attempt()  # the first connect failing raises ConnectFailed from here: nothing was sent
            except Dropped as dropped:
                if not may_send_again(dropped):
                    raise
            # the policy's attempts and delay count from the drop, not from a long step's start
            return self.reconnect_policy.copy(retry=retry_if_exception(may_send_again))(attempt)
        except (Dropped, ConnectFailed) as error:
            if not drops:
                raise
            raise self._lost(left, drops[0], attempts - 1, error, tuple(result.step.name for result in done)
                             ) from error

    def _lost(self, left: tuple[Step | Put, ...], first: Dropped, resent: int, last: Exception,
              completed: tuple[str, ...]) -> ConnectionLost:
        """The error for a round trip that could not be finished: its step whose result never came, and why."""
        unsafe = next((step for step in left if not repeatable(step)), None)
        if unsafe is not None:
            again = f"not sent again: {unsafe.name!r} is not safe to repeat"
        else:
            again = f"sent again on a new connection {resent} time(s), the last: {last}"
        step = left[0]
        return ConnectionLost(
            f"connection to {self.target.address} lost during step {step.name!r} ({first.reason}); {again}",
            step=step, completed=completed,
            hint="the host may have run that step and the ones after it in its round trip; `invoke status` shows "
                 "what it serves")

    def _run_trip(self, trip: tuple[Step | Put, ...], token: str, on_output: OutputLine | None = None
                  ) -> list[StepResult]:
        return put_results(trip, self._run_steps(tuple(script_steps(trip, token)), on_output))

    def _run_steps(self, steps: tuple[Step, ...], on_output: OutputLine | None = None) -> list[StepResult]:
        connection = self._connect()
        marker = secrets.token_hex(8)
        password = self.target.password_for_sudo
        script = batch_script(steps, self.target.user, marker, with_password=password is not None)
        stdin = channel_stdin(steps)
        if password is not None:  # the script's first read (remote/batch.py)
            stdin = f"{password.value}\n".encode() + (stdin or b"")
        deadline = sum(step.timeout_s + KILL_AFTER_S for step in steps) + ROUND_TRIP_GRACE_S
        started = time.monotonic()
        self.round_trips += 1
        timed_out = False
        silence = SilenceBound(steps, marker, self.silence_grace_s)
        opening = ChannelWatch(connection.transport)
        watching, watching_open = SILENCE.set(silence), OPENING.set(opening.start())
        try:
            # streamed: invoke copies stdout to out_stream only when it is not hidden
            streaming = {"hide": "err", "out_stream": LineSink(on_output)} if on_output else {"hide": True}
            raw = connection.run(shlex.join(("bash", "-c", script)), warn=True, encoding="utf-8",
                                 in_stream=io.BytesIO(stdin) if stdin is not None else False, timeout=deadline,
                                 **streaming)
        except CommandTimedOut as error:
            raw, timed_out = error.result, True
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise Dropped([], steps[0], f"its channel did not open within {opening.bound_s:.0f} s: a dead connection"
                          if opening.fired else str(error) or type(error).__name__) from error
        finally:
            opening.started()
            SILENCE.reset(watching)
            OPENING.reset(watching_open)
        results, out, err = parse_batch_output(steps, marker, raw.stdout, raw.stderr)
        if len(results) == len(steps) or (results and results[-1].exit_code not in steps[len(results) - 1].ok):
            return results
        running = steps[len(results)]
        elapsed = time.monotonic() - started
        if silence.gave_up_after_s is not None:
            raise Dropped(results, running, f"nothing arrived for {silence.gave_up_after_s:.0f} s, longer than "
                                             "its steps' timeouts allow: a dead connection")
        if timed_out:
            return [*results, StepResult(running, TIMED_OUT_EXIT, out, err, elapsed)]
        if self._connection is None or not self._connection.is_connected:
            raise Dropped(results, running, "the connection closed")
        # The script itself died (no bash on the host, or killed): report it against the step it was running.
        return [*results, StepResult(running, raw.exited or -1, out, err or raw.stderr, elapsed)]

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        """One TCP exchange with host:port as the host reaches it, through this connection (remote/forward.py)."""
        transport = self._connect().transport
        self.round_trips += 1
        return exchange(transport, host, port, data, timeout_s)

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        argv = rsync_argv(self.target, local_dir, dest, link_dest)
        step = Step(f"push {local_dir} -> {dest}", tuple(argv), timeout_s=48 * 3600)
        started = time.monotonic()
        self.round_trips += 1
        sink = LineSink(on_output or (lambda line: None))
        with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a chatty stderr cannot block the progress
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                       env=rsync_env(self.target, dict(os.environ)))
            assert process.stdout is not None
            # typeshed types Popen.stdout as IO[bytes]; with bufsize left at -1 it is a BufferedReader, which has read1
            for chunk in iter(lambda: process.stdout.read1(65536), b""):  # type: ignore[union-attr,attr-defined]
                sink.write(chunk.decode(errors="replace").replace("\r", "\n"))  # progress2 redraws with \r
            code = process.wait()
            errors.seek(0)
            stderr = errors.read().decode(errors="replace")
        result = StepResult(step, code, "", stderr, time.monotonic() - started)
        check_result(result, self.target.address)
        return result

    def _put(self, put: Put, token: str) -> StepResult:
        connection = self._connect()
        started = time.monotonic()
        self.round_trips += 1
        try:
            sftp = open_sftp(connection, PUT_TIMEOUT_S)
            if put.sudo and self.target.user != "root":
                code, stderr = self._put_via_sudo(sftp, put, token)
            else:
                code, stderr = put_directly(sftp, put, token)
        except (TimeoutError, ConnectionError, paramiko.SSHException, EOFError) as error:
            raise Dropped([], put, str(error) or type(error).__name__) from error
        except OSError as error:  # what the SFTP server refused: no such directory, permission, disk full
            code, stderr = 1, str(error.strerror or error)
        return StepResult(put, code, "", stderr, time.monotonic() - started)

    def _put_via_sudo(self, sftp: paramiko.SFTPClient, put: Put, token: str) -> tuple[int, str]:
        """Upload into a private directory, then `install` (mode, owner root) beside dest and `mv -T` as root."""
        private = PurePosixPath(f"/tmp/sglang-deploy-{token}")
        staged = private / put.dest.name
        temp = put.temp_path(token)
        sftp.mkdir(str(private), 0o700)
        try:
            upload(sftp, staged, put.data, 0o600)
            results = self._run_steps((
                Step(f"{put.name}: install", ("install", "-m", f"0{put.mode:o}", "-o", "root", "-g", "root",
                                              "-T", "--", str(staged), str(temp)), sudo=True),
                Step(f"{put.name}: rename", ("mv", "-T", "--", str(temp), str(put.dest)), sudo=True),
            ))
            failed = next((result for result in results if result.exit_code != 0), None)
            if failed is None:
                return 0, ""
            self._run_steps((Step(f"{put.name}: clean up", ("rm", "-f", "--", str(temp)), sudo=True),))
            return failed.exit_code, failed.stderr
        finally:
            remove_quietly(sftp, staged)
            remove_quietly(sftp, private, directory=True)

