"""FakeRemote: a test double for deploy_lib.remote.Remote, shared by every test that needs a host.

It records each batch, answers each step with a canned reply chosen by argv, by step name or by a
predicate (the last matching rule wins, so a test can override a broad default), keeps the last Put per
destination, and fails exactly as FabricRemote does: it stops at the first exit code a step does not
accept and raises StepFailed/StepTimedOut through the same `check_result`.

    remote = FakeRemote()
    remote.reply(("readlink", "--", "/opt/x/current"), stdout="releases/r1\n")
    remote.reply(lambda step: step.name == "lock: take", exit_code=1)
    remote.reply("restart", raises=ConnectFailed("connection lost"))
    remote.forward_reply(30000, Forwarded(sent=True, connected=True, answer=b"HTTP/1.1 200 OK\r\n\r\n"))
    remote.run(batch)
    assert remote.ran_names() == [...]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from deploy_lib.errors import DeployError
from deploy_lib.remote import NOT_SENT, Forwarded, OutputLine, Put, Step, StepResult, check_result

Match = tuple[str, ...] | str | Callable[[Step | Put], bool]


@dataclass
class _Rule:
    matches: Callable[[Step | Put], bool]
    exit_code: int
    stdout: str
    stderr: str
    raises: DeployError | None
    times: int | None  # None: forever; otherwise how many more steps it answers


def _matcher(match: Match) -> Callable[[Step | Put], bool]:
    if callable(match):
        return match
    if isinstance(match, tuple):
        return lambda step: isinstance(step, Step) and step.argv == match
    return lambda step: step.name == match


class FakeRemote:
    """Records steps and answers canned results; a Put succeeds and is kept in `files` unless a rule says no. A
    forwarded exchange is answered by `forward_reply` for its port; without one the host forwards nothing (as an
    sshd with AllowTcpForwarding no)."""

    def __init__(self, where: str = "fake@host:22") -> None:
        self.where = where
        self.batches: list[list[Step | Put]] = []
        self.results: list[StepResult] = []
        self.files: dict[PurePosixPath, Put] = {}
        self.closed = False
        self.pushes: list[tuple[Path, PurePosixPath, PurePosixPath | None]] = []
        self.push_stdout = ""  # what a push_directory reports as rsync's progress output
        self._rules: list[_Rule] = []
        self.forwards: list[tuple[str, int, bytes]] = []  # every forwarded exchange asked for: host, port, data
        self._forward_replies: dict[int, Forwarded] = {}

    def reply(self, match: Match, exit_code: int = 0, stdout: str = "", stderr: str = "", *,
              raises: DeployError | None = None, times: int | None = None) -> FakeRemote:
        """Answer steps matching `match` (argv tuple, step name, or predicate) with this result or error."""
        self._rules.append(_Rule(_matcher(match), exit_code, stdout, stderr, raises, times))
        return self

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        """Answers each step; a streamed run hands the canned stdout to on_output line by line first."""
        self.batches.append(list(batch))
        results = []
        for step in batch:
            rule = next((r for r in reversed(self._rules) if r.times != 0 and r.matches(step)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
            if rule is not None and rule.raises is not None:
                raise rule.raises
            result = StepResult(step, rule.exit_code if rule else 0, rule.stdout if rule else "",
                                rule.stderr if rule else "", 0.0)
            if on_output is not None:
                for line in result.stdout.splitlines():
                    on_output(line)
            self.results.append(result)
            check_result(result, self.where)
            if isinstance(step, Put):
                self.files[step.dest] = step
            results.append(result)
        return results

    def forward_reply(self, port: int, answer: Forwarded) -> FakeRemote:
        """Answer every exchange forwarded to `port` with `answer` (the host's sshd forwards from now on)."""
        self._forward_replies[port] = answer
        return self

    def forward(self, host: str, port: int, data: bytes, timeout_s: float) -> Forwarded:
        self.forwards.append((host, port, data))
        return self._forward_replies.get(port, NOT_SENT)

    def close(self) -> None:
        self.closed = True

    @property
    def ran(self) -> list[Step | Put]:
        """Every step that ran (got a result), in order, across batches."""
        return [result.step for result in self.results]

    def ran_names(self) -> list[str]:
        return [step.name for step in self.ran]

    def ran_argvs(self) -> list[tuple[str, ...]]:
        return [step.argv for step in self.ran if isinstance(step, Step)]

    def file_text(self, dest: str | PurePosixPath) -> str:
        return self.files[PurePosixPath(dest)].data.decode()

    def push_directory(self, local_dir: Path, dest: PurePosixPath, link_dest: PurePosixPath | None,
                       on_output: OutputLine | None = None) -> StepResult:
        """Records the push; a rule on the step name `push` can make it fail."""
        self.pushes.append((local_dir, dest, link_dest))
        for line in self.push_stdout.splitlines():
            if on_output is not None:
                on_output(line)
        return self.run([Step("push", ("rsync", str(local_dir), str(dest)))])[0]
