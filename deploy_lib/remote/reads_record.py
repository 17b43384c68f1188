"""What a command line reads first, remembered for its next run (remote/read_ahead.py sends it ahead): the record,
a JSON file per command line in the user's cache directory, and each remote's part, the results sent ahead to its
target, taken while they are what it sends.

Only what changes nothing is remembered: a batch whose every step is marked `read` (facts.readings.read marks its
steps so) and holds no secret, and a forwarded HTTP GET (a safe method, RFC 9110 9.2.1); a target that may accept a
new host key is not. The file is written by its owner alone, and one that others may write is ignored (as OpenSSH's
StrictModes ignores such a config)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from deploy_lib.remote.ssh import JumpHost, SSHTarget
from deploy_lib.remote.steps import Step, StepResult

if TYPE_CHECKING:
    from deploy_lib.remote.forward import Forwarded

FORMAT = 1
MAX_OPS = 4  # a no-op's reads: the facts' round trip(s) and the probe's request; more would be sent ahead for nothing
MAX_HOSTS = 64  # a larger fleet's command line reads ahead for its first 64 hosts
MAX_RECORDS = 100  # command lines remembered; the oldest file goes first
FINISH_WAIT_S = 1.0  # at the command's end, for a read in flight that nobody took
CONNECTION_WAIT_S = 2.0  # for the read in flight on the connection opened ahead, before the command opens its own


@dataclass(frozen=True)
class Exchange:
    """A forwarded TCP exchange (remote/forward.py) as sent: where to, what, and how long it may take."""

    host: str
    port: int
    data: bytes
    timeout_s: float


Op = tuple[Step, ...] | Exchange  # a round trip's steps, or a forwarded exchange


def sent_ahead(op: Op) -> bool:
    """May `op` be sent before the command asks for it? Only when it changes nothing on the host."""
    if isinstance(op, Exchange):
        return op.data.startswith(b"GET ")
    return bool(op) and all(step.read and not step.secret for step in op)


def record_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "sglang-deploy" / "read-ahead"


def record_path(directory: Path, command: Sequence[str], cwd: str) -> Path:
    return directory / (hashlib.sha256(json.dumps([cwd, list(command)]).encode()).hexdigest()[:32] + ".json")


# -- the record: JSON of targets and ops ------------------------------------------------------------------------


def _target_json(target: SSHTarget) -> dict[str, Any]:
    jump = target.jump
    return {"host": target.host, "port": target.port, "user": target.user,
            "key_files": [str(path) for path in target.key_files], "identities_only": target.identities_only,
            "known_hosts_file": str(target.known_hosts_file), "connect_timeout_s": target.connect_timeout_s,
            "jump": None if jump is None else {"host": jump.host, "port": jump.port, "user": jump.user}}


def _target(data: dict[str, Any]) -> SSHTarget:
    jump = data["jump"]
    return SSHTarget(host=str(data["host"]), port=int(data["port"]), user=str(data["user"]),
                     key_files=tuple(Path(str(path)) for path in data["key_files"]),
                     identities_only=bool(data["identities_only"]),
                     known_hosts_file=Path(str(data["known_hosts_file"])),
                     connect_timeout_s=float(data["connect_timeout_s"]),
                     jump=None if jump is None else JumpHost(str(jump["host"]), int(jump["port"]), str(jump["user"])))


def _bytes_json(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


def _op_json(op: Op) -> dict[str, Any]:
    if isinstance(op, Exchange):
        return {"exchange": {"host": op.host, "port": op.port, "data": _bytes_json(op.data),
                             "timeout_s": op.timeout_s}}
    return {"trip": [{"name": step.name, "argv": list(step.argv), "sudo": step.sudo, "stdin": _bytes_json(step.stdin),
                      "ok": sorted(step.ok), "timeout_s": step.timeout_s, "concurrent": step.concurrent,
                      "repeatable": step.repeatable} for step in op]}


def _op(data: dict[str, Any]) -> Op:
    if "exchange" in data:
        sent = data["exchange"]
        return Exchange(str(sent["host"]), int(sent["port"]), _bytes(sent["data"]) or b"", float(sent["timeout_s"]))
    return tuple(Step(str(step["name"]), tuple(str(arg) for arg in step["argv"]), sudo=bool(step["sudo"]),
                      stdin=_bytes(step["stdin"]), ok=frozenset(int(code) for code in step["ok"]),
                      timeout_s=float(step["timeout_s"]), concurrent=bool(step["concurrent"]),
                      repeatable=bool(step["repeatable"]), read=True) for step in data["trip"])


def _private(path: Path) -> bool:
    """Written by this user alone: owned by them, writable by nobody else."""
    found = path.stat()
    return found.st_uid == os.getuid() and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def load(path: Path, command: Sequence[str], cwd: str) -> list[tuple[SSHTarget, tuple[Op, ...]]]:
    """The hosts and reads remembered for this command line; none when there is no usable record."""
    try:
        if not (_private(path.parent) and _private(path)):
            return []
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("command") != list(command) or data.get("cwd") != cwd:
            return []
        hosts = [(_target(host["target"]), tuple(_op(op) for op in host["ops"])) for host in data["hosts"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # an unreadable record is no record: the command reads as it would without one
    return [(target, ops) for target, ops in hosts[:MAX_HOSTS] if ops and all(sent_ahead(op) for op in ops)]


def save(path: Path, command: Sequence[str], cwd: str, hosts: Sequence[tuple[SSHTarget, tuple[Op, ...]]]) -> None:
    """Write the record atomically, private to this user; keep at most MAX_RECORDS of them. A cache: a failure to
    write it changes nothing else."""
    document = {"format": FORMAT, "command": list(command), "cwd": cwd,
                "hosts": [{"target": _target_json(target), "ops": [_op_json(op) for op in ops]}
                          for target, ops in hosts[:MAX_HOSTS]]}
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(document, out)
        os.replace(temp, path)
        records = sorted(path.parent.glob("*.json"), key=lambda each: each.stat().st_mtime)
        for old in records[:-MAX_RECORDS]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


# -- in this process ----------------------------------------------------------------------------------------------


class Sent(Protocol):
    """One host's reads sent ahead (read_ahead.Ahead)."""

    target: SSHTarget

    def start(self) -> None: ...
    def result(self, index: int, op: Op) -> list[StepResult] | Forwarded | None: ...
    def take_connection(self, wait_s: float) -> Any: ...  # the FabricRemote it opened, or None
    def let_finish(self, wait_s: float) -> None: ...


class ReadAhead:
    """This process's read-ahead: what was sent for it, and what its remotes read first, remembered at exit."""

    def __init__(self, path: Path, command: Sequence[str], cwd: str) -> None:
        self.path, self.command, self.cwd = path, tuple(command), cwd
        self._ahead: dict[SSHTarget, Sent] = {}
        self._read: dict[SSHTarget, tuple[object, tuple[Op, ...]]] = {}
        self.loaded: list[tuple[SSHTarget, tuple[Op, ...]]] = []  # the record as this command found it
        self._lock = threading.Lock()

    def send(self, hosts: Sequence[Sent]) -> None:
        for ahead in hosts:
            self._ahead[ahead.target] = ahead
            ahead.start()

    def claim(self, target: SSHTarget) -> Sent | None:
        """What was sent ahead to `target`, for the one remote that takes it."""
        with self._lock:
            return self._ahead.pop(target, None)

    def remember(self, reader: object, target: SSHTarget, ops: tuple[Op, ...]) -> None:
        """What `reader` (a remote) has read first from `target` so far; the first remote to read a target is kept."""
        if target.accept_new_host_key:
            return
        with self._lock:
            kept = self._read.get(target)
            if kept is None or kept[0] is reader:
                self._read[target] = (reader, ops)

    def finish(self) -> None:
        """At exit: close what nobody took, and write what this command read first, for its next run."""
        with self._lock:
            unclaimed, self._ahead = list(self._ahead.values()), {}
            read = [(target, ops) for target, (_, ops) in self._read.items()]
        if read and read != self.loaded:  # a record that says the same stays as it is
            save(self.path, self.command, self.cwd, read)
        for ahead in unclaimed:
            ahead.let_finish(FINISH_WAIT_S)


class RemoteReads:
    """One FabricRemote's side of it: the results sent ahead to its target, taken in order while they are what it
    sends, and what it reads first, remembered until its first op that is not a read."""

    def __init__(self, owner: ReadAhead, reader: object, target: SSHTarget) -> None:
        self.owner, self.reader, self.target = owner, reader, target
        self.ahead = owner.claim(target)
        self.index = 0
        self.first: list[Op] | None = []

    def take(self, op: Op) -> list[StepResult] | Forwarded | None:
        """`op`'s result sent ahead, or None: send it (and all after it) yourself."""
        result = self.ahead.result(self.index, op) if self.ahead is not None else None
        self.index += 1
        self.seen(op)
        return result

    def seen(self, op: Op | None) -> None:
        """The remote sends `op` (None: something that is not a read, an upload); remembered while all were reads."""
        if self.first is None:
            return
        if op is None or not sent_ahead(op) or len(self.first) >= MAX_OPS:
            self.first = None
            return
        self.first.append(op)
        self.owner.remember(self.reader, self.target, tuple(self.first))

    def connection(self) -> Any:
        """The connection opened ahead, for the remote's own round trips from here on (once, then None)."""
        ahead, self.ahead = self.ahead, None
        return ahead.take_connection(CONNECTION_WAIT_S) if ahead is not None else None

    def close(self) -> None:
        """The remote closes: a connection opened ahead that it never took (every op came from ahead) closes too."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.let_finish(0)


def reads_for(reader: object, target: SSHTarget) -> RemoteReads | None:
    return RemoteReads(_current, reader, target) if _current is not None else None


_current: ReadAhead | None = None


def current() -> ReadAhead | None:
    """This process's read-ahead, when its command line started one (`start`); library calls alone have none."""
    return _current


def install(read_ahead: ReadAhead) -> None:
    """This process's read-ahead (read_ahead.start), for its remotes to take from and remember into."""
    global _current
    _current = read_ahead
