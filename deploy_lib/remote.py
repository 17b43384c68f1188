"""The only module that talks SSH: remote steps as data, and one reused Fabric connection that runs them.

Everything above this module builds `Step`/`Put` values; `FabricRemote.run` executes a batch of them over
one connection, several steps per round trip, and returns a `StepResult` per step. Host keys are checked
against a known_hosts file (Fabric's default accepts unknown keys; we refuse them unless the user opts in).
"""

from __future__ import annotations

import base64
import hashlib
import io
import secrets
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import fabric
import fabric.runners
import paramiko
from invoke.exceptions import CommandTimedOut
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from deploy_lib.errors import ConnectFailed, StepFailed, StepTimedOut, SudoPasswordRequired

MASK = "***"
# coreutils `timeout` exits 124 when it stopped the command; a step's code 124 reads as a timeout.
TIMED_OUT_EXIT = 124
# Seconds `timeout` waits after TERM before it sends KILL.
KILL_AFTER_S = 5
# Extra seconds a round trip may take beyond its steps' own timeouts before the channel is dropped.
ROUND_TRIP_GRACE_S = 15
# A round trip's script travels as one argv element; Linux caps one argument at 128 KiB.
MAX_SCRIPT_CHARS = 100_000
# Non-secret text stdin up to this size travels inside the script as a here-document ending in this line, so
# several steps with stdin (the facts batch: SGLang's options and the model plan) share one round trip.
MAX_INLINE_STDIN = 48 * 1024
HEREDOC_END = "SGLANG_DEPLOY_STDIN_END"
PUT_TIMEOUT_S = 120
TAIL_LINES = 12
DISK_FULL = "No space left on device"  # strerror(ENOSPC), as coreutils, sftp and Python print it
# What `sudo -n` prints when the user has no NOPASSWD rule (sudo 1.8 - 1.9, any step, any accepted exit code).
SUDO_PASSWORD_PROMPT = "sudo: a password is required"


@dataclass(frozen=True, repr=False)
class Step:
    """One remote command as data; remote.py quotes its argv once and adds sudo where needed."""

    name: str
    argv: tuple[str, ...]
    sudo: bool = False
    stdin: bytes | None = None
    ok: frozenset[int] = frozenset({0})
    timeout_s: float = 60
    secret: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.argv, tuple) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(f"step {self.name!r}: argv must be a non-empty tuple of str, got {self.argv!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"step {self.name!r}: timeout_s must be positive")

    def __repr__(self) -> str:
        argv = MASK if self.secret else repr(self.argv)
        stdin = "None" if self.stdin is None else (MASK if self.secret else f"<{len(self.stdin)} bytes>")
        return (f"Step(name={self.name!r}, argv={argv}, sudo={self.sudo}, stdin={stdin}, "
                f"ok={sorted(self.ok)}, timeout_s={self.timeout_s}, secret={self.secret})")


@dataclass(frozen=True, repr=False)
class Put:
    """Write `data` to `dest` atomically: temp file beside it, mode (and owner root) set, then renamed."""

    dest: PurePosixPath
    data: bytes
    mode: int
    sudo: bool = False
    secret: bool = False

    def __post_init__(self) -> None:
        if not self.dest.is_absolute() or self.dest.name in ("", ".", ".."):
            raise ValueError(f"put: dest must be an absolute file path, got {str(self.dest)!r}")

    @property
    def name(self) -> str:
        return f"put {self.dest}"

    def __repr__(self) -> str:
        data = MASK if self.secret else f"<{len(self.data)} bytes>"
        return (f"Put(dest={str(self.dest)!r}, data={data}, mode=0o{self.mode:o}, sudo={self.sudo}, "
                f"secret={self.secret})")


@dataclass(frozen=True, repr=False)
class StepResult:
    step: Step | Put
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    def __repr__(self) -> str:
        out, err = (MASK, MASK) if self.step.secret else (repr(self.stdout), repr(self.stderr))
        return (f"StepResult(step={self.step!r}, exit_code={self.exit_code}, stdout={out}, stderr={err}, "
                f"duration_s={self.duration_s:.3f})")


OutputLine = Callable[[str], None]


class Remote(Protocol):
    # stops at first code not in ok; on_output gets each stdout line of the steps as it arrives
    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]: ...

    # rsync a local directory's contents into dest on the host (only changed files travel); raises StepFailed
    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class JumpHost:
    """A host the connection goes through (OpenSSH's ProxyJump), e.g. the Proxmox node in front of its VM."""

    host: str
    port: int = 22
    user: str = "root"

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


@dataclass(frozen=True)
class SSHTarget:
    """Connection settings of one host, as the inventory gives them.

    A jump host is reached with the same key and known_hosts file as the target; each hop's host key is checked.
    """

    host: str
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts_file: Path = field(default_factory=lambda: Path("~/.ssh/known_hosts"))
    connect_timeout_s: float = 10
    accept_new_host_key: bool = False
    jump: JumpHost | None = None

    @property
    def known_hosts_path(self) -> Path:
        return self.known_hosts_file.expanduser()

    @property
    def address(self) -> str:
        direct = f"{self.user}@{self.host}:{self.port}"
        return f"{direct} via {self.jump.address}" if self.jump else direct


# ---------------------------------------------------------------------------------------------------------
# Pure parts: command lines, dry-run text, round-trip planning, the batch script and its parser, failures.


def command_line(step: Step, user: str) -> str:
    """The argv quoted once for a POSIX shell, behind `sudo -n --` when it needs root and user is not root."""
    argv = ("sudo", "-n", "--", *step.argv) if step.sudo and user != "root" else step.argv
    return shlex.join(argv)


def display(step: Step | Put) -> str:
    """How a step is shown to a person: in dry runs, progress and error messages; secrets masked."""
    if isinstance(step, Put):
        size = MASK if step.secret else f"{len(step.data)} bytes, sha256 {_short_sha(step.data)}"
        return f"put {shlex.quote(str(step.dest))} (mode 0{step.mode:o}{', sudo' if step.sudo else ''}, {size})"
    if step.secret:
        return f"{'sudo ' if step.sudo else ''}{MASK}"
    text = ("sudo " if step.sudo else "") + shlex.join(step.argv)
    if step.stdin is not None:
        text += f" < stdin ({len(step.stdin)} bytes)"
    return text


def describe(batch: Sequence[Step | Put]) -> list[str]:
    """The dry-run lines of a batch: one per step, in order."""
    return [display(step) if isinstance(step, Put) else f"{step.name}: {display(step)}" for step in batch]


def _short_sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def inline_stdin(step: Step) -> str | None:
    """The step's stdin as here-document text, when it may travel inside the script: not secret (the script is
    visible in the host's process list), small, text without NUL or the closing line, ending in a newline (as a
    here-document does). None: it needs the channel."""
    if step.stdin is None or step.secret or len(step.stdin) > MAX_INLINE_STDIN:
        return None
    try:
        text = step.stdin.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in text or HEREDOC_END in text or not text.endswith("\n"):
        return None
    return text


def channel_stdin(steps: Sequence[Step]) -> bytes | None:
    """What the round trip sends on the channel's stdin: the stdin of its one step that cannot be inlined."""
    return next((step.stdin for step in steps if step.stdin is not None and inline_stdin(step) is None), None)


def put_steps(put: Put, token: str) -> tuple[Step, Step]:
    """A small Put as two steps of a run: its data from stdin into a temp file beside dest (the mode, and owner root
    for sudo, set as it is created), then the rename."""
    temp = put.dest.parent / f".{put.dest.name}.tmp-{token}"
    owner = ("-o", "root", "-g", "root") if put.sudo else ()
    return (Step(f"{put.name}: write", ("install", "-m", f"0{put.mode:o}", *owner, "-T", "--", "/dev/stdin", str(temp)),
                 sudo=put.sudo, stdin=put.data, timeout_s=PUT_TIMEOUT_S, secret=put.secret),
            Step(f"{put.name}: rename", ("mv", "-T", "--", str(temp), str(put.dest)), sudo=put.sudo))


def script_steps(trip: Sequence[Step | Put], token: str) -> list[Step]:
    """The steps a run's script executes: each Put of the run as its write and rename."""
    return [expanded for step in trip for expanded in (put_steps(step, token) if isinstance(step, Put) else (step,))]


def round_trips(batch: Sequence[Step | Put]) -> list[Put | tuple[Step | Put, ...]]:
    """Split a batch into what each costs one round trip: a run of steps and small Puts, or a large Put alone (SFTP).

    A run holds at most one step whose stdin needs the channel (the others read a here-document or /dev/null)
    and a script short enough to travel as one argument.
    """
    trips: list[Put | tuple[Step | Put, ...]] = []
    run: list[Step | Put] = []
    for step in batch:
        if isinstance(step, Put) and len(step.data) > MAX_INLINE_STDIN:
            if run:
                trips.append(tuple(run))
                run = []
            trips.append(step)
            continue
        added = script_steps([step], "0" * 12)
        needs_channel = channel_stdin(added) is not None
        too_long = len(batch_script(script_steps([*run, step], "0" * 12), "root", "0" * 16)) > MAX_SCRIPT_CHARS
        if run and ((needs_channel and channel_stdin(script_steps(run, "0" * 12)) is not None) or too_long):
            trips.append(tuple(run))
            run = []
        run.append(step)
    if run:
        trips.append(tuple(run))
    return trips


def _as_puts(trip: Sequence[Step | Put], results: Sequence[StepResult]) -> list[StepResult]:
    """The results of a run's script steps, each Put's write and rename joined into one result for the Put."""
    joined: list[StepResult] = []
    remaining = iter(results)
    for step in trip:
        first = next(remaining, None)
        if first is None:
            break
        if not isinstance(step, Put):
            joined.append(first)
            continue
        second = next(remaining, None) if first.exit_code == 0 else None
        last = second or first
        joined.append(StepResult(step, last.exit_code, first.stdout + (second.stdout if second else ""),
                                 first.stderr + (second.stderr if second else ""),
                                 first.duration_s + (second.duration_s if second else 0.0)))
    return joined


def batch_script(steps: Sequence[Step], user: str, marker: str) -> str:
    """A bash script running `steps` in order, each framed by marker lines on stdout and stderr.

    Each step runs under coreutils `timeout` (its own timeout, then KILL), its exit code and start/end
    times go into the closing marker, and the script stops after the first code not in the step's ok set.
    """
    lines = []
    for index, step in enumerate(steps):
        ok = "|".join(str(code) for code in sorted(step.ok))
        inline = inline_stdin(step)
        if inline is not None:
            redirect = f" <<'{HEREDOC_END}'\n{inline}{HEREDOC_END}"
        else:
            redirect = "" if step.stdin is not None else " </dev/null"
        lines += [
            f"printf '%s\\n' '{marker} {index} start'; printf '%s\\n' '{marker} {index} start' >&2",
            "t0=$EPOCHREALTIME",
            f"timeout -k {KILL_AFTER_S} {step.timeout_s:g} {command_line(step, user)}{redirect}",
            "rc=$?",
            f"printf '\\n%s %s %s %s\\n' '{marker} {index} end' \"$rc\" \"$t0\" \"$EPOCHREALTIME\"",
            f"printf '\\n%s %s %s %s\\n' '{marker} {index} end' \"$rc\" \"$t0\" \"$EPOCHREALTIME\" >&2",
            f"case $rc in {ok}) ;; *) exit 0 ;; esac",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Section:
    text: str
    exit_code: int | None  # None: the step started but its end marker never came
    duration_s: float


def _sections(stream: str, marker: str, count: int) -> list[_Section]:
    sections = []
    for index in range(count):
        opening = f"{marker} {index} start\n"
        start = stream.find(opening)
        if start < 0:
            break
        body_start = start + len(opening)
        closing = f"\n{marker} {index} end "
        end = stream.find(closing, body_start)
        if end < 0:
            sections.append(_Section(stream[body_start:], None, 0.0))
            break
        fields = stream[end + len(closing):].split("\n", 1)[0].split()
        sections.append(_Section(stream[body_start:end], int(fields[0]), _elapsed(fields[1:])))
    return sections


def _elapsed(stamps: list[str]) -> float:
    try:
        t0, t1 = (float(s.replace(",", ".")) for s in stamps)  # EPOCHREALTIME follows the locale's decimal point
    except ValueError:
        return 0.0
    return max(t1 - t0, 0.0)


def parse_batch_output(steps: Sequence[Step], marker: str, stdout: str, stderr: str) -> tuple[
        list[StepResult], str, str]:
    """Results of the steps that finished, plus the stdout/stderr of the one still running (if any)."""
    outs, errs = _sections(stdout, marker, len(steps)), _sections(stderr, marker, len(steps))
    results = []
    for step, out, err in zip(steps, outs, errs, strict=False):
        if out.exit_code is None:
            break
        results.append(StepResult(step, out.exit_code, out.text, err.text, out.duration_s))
    running_out = outs[len(results)].text if len(outs) > len(results) else ""
    running_err = errs[len(results)].text if len(errs) > len(results) else ""
    return results, running_out, running_err


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines()[-lines:])


def failure_message(result: StepResult, where: str, what: str) -> str:
    """`<step> <what> on <where>` plus the tail of its stderr and stdout (hidden for secret steps)."""
    step = result.step
    message = f"step {step.name!r} {what} on {where}: {display(step)}"
    # A secret command may echo its secret; a Put's output is only the OS error about its path, never the data.
    if step.secret and isinstance(step, Step):
        return message + "\n  (output of a secret step is not shown)"
    for label, text in (("stderr", result.stderr), ("stdout", result.stdout)):
        if text.strip():
            message += f"\n  {label} (last lines):\n{_tail(text)}"
    return message


def check_result(result: StepResult, where: str, user: str | None = None) -> None:
    """Raise StepTimedOut or StepFailed unless the result's exit code is one its step accepts.

    A sudo step that met a password prompt fails whatever its accepted codes: a read that accepts exit 1 as
    "file absent" would otherwise turn a missing sudoers rule into wrong facts (drift, no release)."""
    step = result.step
    if step.sudo and SUDO_PASSWORD_PROMPT in result.stderr:
        who = user or where.split("@", 1)[0]
        raise SudoPasswordRequired(
            f"sudo on {where} asks {who} for a password (step {step.name!r}); every root step runs as "
            "`sudo -n`, which cannot answer a prompt", step=step, result=result,
            hint=f"give the inventory's ansible_user passwordless sudo; as root on the host: "
                 f"`echo '{who} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{who} && "
                 f"chmod 0440 /etc/sudoers.d/{who} && visudo -c`")
    accepted = step.ok if isinstance(step, Step) else frozenset({0})
    if result.exit_code in accepted:
        return
    if result.exit_code == TIMED_OUT_EXIT and isinstance(step, Step):
        raise StepTimedOut(failure_message(result, where, f"timed out after {step.timeout_s:g} s"),
                           step=step, result=result, hint="raise the step's timeout or look at the host's load")
    disk_full = DISK_FULL in result.stderr
    raise StepFailed(failure_message(result, where, f"failed with exit code {result.exit_code}"),
                     step=step, result=result,
                     hint="the host's filesystem is full (ENOSPC): free space there (`df -h`) and rerun; the steps "
                          "after this one did not run" if disk_full else None)


def host_key_fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a host key, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# ---------------------------------------------------------------------------------------------------------
# Acting: the connection.

# Errors that mean "the host is not reachable yet"; host key, authentication and DNS errors are final.
TRANSIENT_SSH: tuple[type[BaseException], ...] = (
    paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError, ConnectionResetError,
    TimeoutError,
)

SSH_CONNECT = Retrying(
    stop=stop_after_attempt(4) | stop_after_delay(30),
    wait=wait_exponential_jitter(max=5),
    retry=retry_if_exception_type(TRANSIENT_SSH),
    reraise=True,
    name="ssh-connect",
)


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for hosts absent from known_hosts: refuse, or record and accept on opt-in."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise _UnknownHostKey(hostname, key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = self.known_hosts.read_bytes() if self.known_hosts.exists() else b""
        separator = b"" if not existing or existing.endswith(b"\n") else b"\n"
        with self.known_hosts.open("ab") as known:
            known.write(separator + f"{hostname} {key.get_name()} {key.get_base64()}\n".encode())
        if not existing:
            self.known_hosts.chmod(0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)


class _WholeStdinRemote(fabric.runners.Remote):
    """Sends a step's stdin in one write, then EOF: invoke's own pump moves one byte per 10 ms. On Ctrl-C it closes
    the channel: invoke would otherwise wait for the remote command to end before raising (it joins its output
    threads without a timeout, invoke 2.x runners.py `_run_body`), e.g. for the whole of a model download."""

    def handle_stdin(self, input_: Any, output: Any, echo: bool = False) -> None:
        self.channel.sendall(input_.getvalue())
        self.channel.shutdown_write()

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.channel.close()  # the remote command sees its output closed and stops at its next write
        raise interrupt


class FabricRemote:
    """Runs batches over one lazily opened, reused Fabric connection to `target`."""

    def __init__(self, target: SSHTarget, connect_policy: Retrying = SSH_CONNECT,
                 on_result: Callable[[StepResult], None] | None = None) -> None:
        self.target = target
        self.connect_policy = connect_policy
        self.on_result = on_result
        self.round_trips = 0  # SSH execs + uploads so far: what batching saves, shown by `make bench`
        self._connection: fabric.Connection | None = None
        self._gateway: fabric.Connection | None = None
        # connections an interrupt left behind, closed with this remote (see `run`)
        self._interrupted: list[fabric.Connection] = []

    # -- connection ------------------------------------------------------------------------------------

    def _connect(self) -> fabric.Connection:
        if self._connection is not None and self._connection.is_connected:
            return self._connection
        self.close()
        target = self.target
        # The jump host is opened first, on its own, so that a refusal names the hop it came from.
        gateway = self._open_hop(target.jump, None) if target.jump else None
        try:
            self._connection = self._open_hop(JumpHost(target.host, target.port, target.user), gateway)
        except ConnectFailed:
            if gateway is not None:
                gateway.close()
            raise
        self._gateway = gateway
        return self._connection

    def _open_hop(self, hop: JumpHost, gateway: fabric.Connection | None) -> fabric.Connection:
        """One SSH connection (through `gateway` when given), its host key checked against known_hosts."""
        target = self.target
        config = fabric.Config(lazy=True, ssh_config=paramiko.SSHConfig(),
                               overrides={"runners": {"remote": _WholeStdinRemote}})
        # Fabric truncates its own connect_timeout to an int; paramiko's timeouts take the float as given.
        connect_kwargs: dict[str, Any] = {"timeout": target.connect_timeout_s,
                                          "banner_timeout": target.connect_timeout_s,
                                          "auth_timeout": target.connect_timeout_s}
        if target.key_file is not None:
            connect_kwargs |= {"key_filename": str(target.key_file.expanduser()), "look_for_keys": False,
                               "allow_agent": False}
        connection = fabric.Connection(host=hop.host, user=hop.user, port=hop.port, config=config,
                                       connect_kwargs=connect_kwargs, gateway=gateway or False)
        client = connection.client
        client.set_missing_host_key_policy(_KnownHostsPolicy(target.known_hosts_path, target.accept_new_host_key))
        try:
            if target.known_hosts_path.exists():
                client.load_host_keys(str(target.known_hosts_path))
            self.connect_policy.copy()(connection.open)
        except (paramiko.SSHException, OSError, EOFError) as error:
            client.close()
            raise self._connect_error(error, hop, through_jump=gateway is not None) from error
        return connection

    def _connect_error(self, error: Exception, hop: JumpHost, through_jump: bool) -> ConnectFailed:
        known, jump = self.target.known_hosts_path, self.target.jump
        what = "jump host" if jump is not None and not through_jump else "host"
        via = f" via jump host {jump.address}" if through_jump and jump is not None else ""
        if isinstance(error, _UnknownHostKey):
            return ConnectFailed(
                f"host key of {what} {error.hostname}{via} is not in {known}: {error.key.get_name()} "
                f"{host_key_fingerprint(error.key)}; refusing to connect",
                hint=f"compare the fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the {what}, "
                     "then rerun with --accept-new-host-key to record it (or add it to known_hosts yourself)")
        if isinstance(error, paramiko.BadHostKeyException):
            return ConnectFailed(
                f"host key of {what} {hop.host}:{hop.port}{via} CHANGED: {known} has {error.expected_key.get_name()} "
                f"{host_key_fingerprint(error.expected_key)}, the server offers {error.key.get_name()} "
                f"{host_key_fingerprint(error.key)}; refusing to connect (possible man-in-the-middle)",
                hint=f"if the {what} was reinstalled, remove the old entry with "
                     f"`ssh-keygen -R {shlex.quote(_known_hosts_name(hop))} -f {shlex.quote(str(known))}` "
                     f"and connect again; --accept-new-host-key never replaces a changed key")
        if isinstance(error, paramiko.AuthenticationException):
            return ConnectFailed(f"SSH authentication as {hop.user!r} on {what} {hop.host}:{hop.port}{via} failed: "
                                 f"{error}", hint="check the inventory's user and key_file")
        if isinstance(error, paramiko.ChannelException) and jump is not None:
            return ConnectFailed(f"jump host {jump.address} cannot open a connection to {hop.host}:{hop.port}: "
                                 f"{error}", hint="is the host up, at the address the jump host sees it by?")
        return ConnectFailed(f"cannot connect to {what} {hop.address}{via}: {error or type(error).__name__}",
                             hint="is the host up and sshd listening on that port?")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._gateway is not None:  # Fabric closes a connection, never its gateway
            self._gateway.close()
            self._gateway = None
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
                trip_results = [self._put(trip)] if isinstance(trip, Put) else self._run_trip(trip, on_output)
                for result in trip_results:
                    if self.on_result is not None:
                        self.on_result(result)
                    check_result(result, self.target.address, self.target.user)
                    results.append(result)
        except KeyboardInterrupt:
            # raised inside paramiko (a channel half opened) it can leave the transport unusable, so the steps that
            # follow (a rollback's) run on a fresh connection; the old one stays open until `close`, so that sshd
            # handles the closed channel and the interrupted command meets it (closed at once, a download ran on)
            self._interrupted.extend(c for c in (self._connection, self._gateway) if c is not None)
            self._connection = self._gateway = None
            raise
        return results

    def _run_trip(self, trip: tuple[Step | Put, ...], on_output: OutputLine | None = None) -> list[StepResult]:
        return _as_puts(trip, self._run_steps(tuple(script_steps(trip, secrets.token_hex(6))), on_output))

    def _run_steps(self, steps: tuple[Step, ...], on_output: OutputLine | None = None) -> list[StepResult]:
        connection = self._connect()
        marker = secrets.token_hex(8)
        script = batch_script(steps, self.target.user, marker)
        stdin = channel_stdin(steps)
        deadline = sum(step.timeout_s + KILL_AFTER_S for step in steps) + ROUND_TRIP_GRACE_S
        started = time.monotonic()
        self.round_trips += 1
        timed_out = False
        try:
            # streamed: invoke copies stdout to out_stream only when it is not hidden
            streaming = {"hide": "err", "out_stream": _LineSink(on_output)} if on_output else {"hide": True}
            raw = connection.run(shlex.join(("bash", "-c", script)), warn=True, encoding="utf-8",
                                 in_stream=io.BytesIO(stdin) if stdin is not None else False, timeout=deadline,
                                 **streaming)
        except CommandTimedOut as error:
            raw, timed_out = error.result, True
        except (paramiko.SSHException, OSError, EOFError) as error:
            self.close()
            raise ConnectFailed(f"connection to {self.target.address} lost during step {steps[0].name!r}: "
                                f"{error}", hint="nothing after that step ran; rerun the command") from error
        results, out, err = parse_batch_output(steps, marker, raw.stdout, raw.stderr)
        if len(results) == len(steps) or (results and results[-1].exit_code not in results[-1].step.ok):
            return results
        running = steps[len(results)]
        elapsed = time.monotonic() - started
        if timed_out:
            return [*results, StepResult(running, TIMED_OUT_EXIT, out, err, elapsed)]
        if self._connection is None or not self._connection.is_connected:
            self.close()
            raise ConnectFailed(f"connection to {self.target.address} lost during step {running.name!r}",
                                hint="that step may or may not have finished; rerun the command")
        # The script itself died (no bash on the host, or killed): report it against the step it was running.
        return [*results, StepResult(running, raw.exited or -1, out, err or raw.stderr, elapsed)]

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        argv = rsync_argv(self.target, local_dir, dest, link_dest)
        step = Step(f"push {local_dir} -> {dest}", tuple(argv), timeout_s=48 * 3600)
        started = time.monotonic()
        self.round_trips += 1
        sink = _LineSink(on_output or (lambda line: None))
        with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a chatty stderr cannot block the progress
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors)
            assert process.stdout is not None
            for chunk in iter(lambda: process.stdout.read1(65536), b""):  # type: ignore[union-attr]
                sink.write(chunk.decode(errors="replace").replace("\r", "\n"))  # progress2 redraws with \r
            code = process.wait()
            errors.seek(0)
            stderr = errors.read().decode(errors="replace")
        result = StepResult(step, code, "", stderr, time.monotonic() - started)
        check_result(result, self.target.address)
        return result

    def _put(self, put: Put) -> StepResult:
        connection = self._connect()
        started = time.monotonic()
        token = secrets.token_hex(6)
        self.round_trips += 1
        try:
            sftp = connection.sftp()
            sftp.get_channel().settimeout(PUT_TIMEOUT_S)
            if put.sudo and self.target.user != "root":
                code, stderr = self._put_via_sudo(sftp, put, token)
            else:
                code, stderr = _put_directly(sftp, put, token)
        except (TimeoutError, ConnectionError, paramiko.SSHException, EOFError) as error:
            self.close()
            raise ConnectFailed(f"connection to {self.target.address} lost during {put.name}: {error}") from error
        except OSError as error:  # what the SFTP server refused: no such directory, permission, disk full
            code, stderr = 1, str(error.strerror or error)
        return StepResult(put, code, "", stderr, time.monotonic() - started)

    def _put_via_sudo(self, sftp: paramiko.SFTPClient, put: Put, token: str) -> tuple[int, str]:
        """Upload into a private directory, then `install` (mode, owner root) beside dest and `mv -T` as root."""
        private = PurePosixPath(f"/tmp/sglang-deploy-{token}")
        staged = private / put.dest.name
        temp = put.dest.parent / f".{put.dest.name}.tmp-{token}"
        sftp.mkdir(str(private), 0o700)
        try:
            _upload(sftp, staged, put.data, 0o600)
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
            _remove_quietly(sftp, staged)
            _remove_quietly(sftp, private, directory=True)


def rsync_argv(target: SSHTarget, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None) -> list[str]:
    """rsync over ssh with this target's key and host-key checking (its known_hosts, strict), as root on the host
    (sudo -n for another user); unchanged files hard-linked from link_dest; partial files kept for a resume."""
    checks = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
              "-o", f"UserKnownHostsFile={target.known_hosts_path}",
              "-o", f"ConnectTimeout={max(1, round(target.connect_timeout_s))}"]
    if target.key_file is not None:
        checks += ["-i", str(target.key_file.expanduser()), "-o", "IdentitiesOnly=yes"]
    ssh = ["ssh", "-p", str(target.port), *checks]
    if target.jump is not None:  # the jump hop gets the same key and host-key checks (ProxyJump would not pass -o)
        hop = ["ssh", "-p", str(target.jump.port), *checks, "-W", "%h:%p", f"{target.jump.user}@{target.jump.host}"]
        ssh += ["-o", f"ProxyCommand={shlex.join(hop)}"]
    argv = ["rsync", "-a", "--partial", "--protect-args", "--info=progress2", "--no-inc-recursive",
            "-e", shlex.join(ssh)]
    if target.user != "root":
        argv += ["--rsync-path", "sudo -n rsync"]
    if link_dest is not None:
        argv.append(f"--link-dest={link_dest}")
    return [*argv, f"{local_dir}/", f"{target.user}@{target.host}:{dest}/"]


class _LineSink:
    """A stream for invoke's out_stream that hands each complete line to a callback."""

    def __init__(self, on_line: OutputLine) -> None:
        self.on_line = on_line
        self.pending = ""

    def write(self, text: str) -> None:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.on_line(line)

    def flush(self) -> None:
        pass


def _put_directly(sftp: paramiko.SFTPClient, put: Put, token: str) -> tuple[int, str]:
    temp = put.dest.parent / f".{put.dest.name}.tmp-{token}"
    try:
        _upload(sftp, temp, put.data, put.mode)
        sftp.posix_rename(str(temp), str(put.dest))
    except OSError:
        _remove_quietly(sftp, temp)
        raise
    return 0, ""


def _upload(sftp: paramiko.SFTPClient, path: PurePosixPath, data: bytes, mode: int) -> None:
    """Create `path` exclusively, set its mode while still empty, then write: no moment with wider access."""
    with sftp.open(str(path), "wbx") as remote_file:
        remote_file.chmod(mode)
        remote_file.set_pipelined(True)
        remote_file.write(data)


def _remove_quietly(sftp: paramiko.SFTPClient, path: PurePosixPath, directory: bool = False) -> None:
    try:
        (sftp.rmdir if directory else sftp.remove)(str(path))
    except OSError:
        pass  # already gone, or never created


def _known_hosts_name(hop: JumpHost) -> str:
    return hop.host if hop.port == 22 else f"[{hop.host}]:{hop.port}"
