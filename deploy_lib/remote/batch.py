"""A batch as round trips: runs of steps and small Puts executed by one bash script (each step framed by marker
lines, under coreutils `timeout`), and the parser of that script's output. Pure: no connection."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from deploy_lib.remote.steps import OutputLine, Put, Step, StepResult

# Seconds `timeout` waits after TERM before it sends KILL.
KILL_AFTER_S = 5
# Extra seconds a round trip may take beyond its steps' own timeouts before the channel is dropped.
ROUND_TRIP_GRACE_S = 15
# Seconds a round trip's channel may see nothing beyond the longest timeout of its steps still running: past that the
# host's `timeout` would have ended the step and its end marker would have come, so the connection is dead.
SILENCE_GRACE_S = 15
# A round trip's script travels as one argv element; Linux caps one argument at 128 KiB.
MAX_SCRIPT_CHARS = 100_000
# Non-secret text stdin up to this size travels inside the script as a here-document ending in this line, so
# several steps with stdin (the facts batch: SGLang's options and the model plan) share one round trip.
MAX_INLINE_STDIN = 48 * 1024
HEREDOC_END = "SGLANG_DEPLOY_STDIN_END"
PUT_TIMEOUT_S = 120
# What a root run's bash (one `sudo -n` for consecutive root steps) exits with after a code a step does not accept;
# sudo itself exits 1 when it refuses, and a bash ended by a signal 128+.
ROOT_RUN_STOPPED = 3
# A script's length is judged as a non-root user's: its root runs travel quoted inside it, so it is the longer one.
LONGEST_SCRIPT_USER = "nonroot"
# With a sudo password (SSHTarget.sudo_password) the channel's first line is the password, which the script reads into
# a shell variable (never an argument: argv is in the host's process list). Each `sudo -S` gets it on its stdin followed
# by this line and then the step's own stdin: sudo reads the password byte by byte up to its newline and leaves the
# rest, and the root side (SKIP_PASSWORD) skips the password where sudo did not ask (a NOPASSWD rule), then this line.
SUDO_PASSWORD_END = "SGLANG_DEPLOY_SUDO_PASSWORD_END"
SKIP_PASSWORD = (f'IFS= read -r l; [ "$l" = {SUDO_PASSWORD_END} ] || IFS= read -r l; '
                 f'[ "$l" = {SUDO_PASSWORD_END} ] || exit 1; unset l; exec "$@"')
# `sudo -S -p ''` as the shell function the script defines: its arguments run as root, reading the function's stdin.
SUDO_WITH_PASSWORD = "sudo_pw"
_SUDO_WITH_PASSWORD_LINES = (
    "IFS= read -r pw",
    f"{SUDO_WITH_PASSWORD}() {{ {{ printf '%s\\n%s\\n' \"$pw\" {SUDO_PASSWORD_END}; cat; }} | "
    f"sudo -S -p '' -- bash -c {shlex.quote(SKIP_PASSWORD)} sglang-deploy \"$@\"; }}",
)


def command_line(step: Step, user: str) -> str:
    """The argv quoted once for a POSIX shell, behind `sudo -n --` when it needs root and user is not root."""
    argv = ("sudo", "-n", "--", *step.argv) if step.sudo and user != "root" else step.argv
    return shlex.join(argv)


def _timed(step: Step, command: str) -> str:
    return f"timeout -k {KILL_AFTER_S} {step.timeout_s:g} {command}"


def invocation(step: Step, user: str, with_password: bool) -> str:
    """The step's command under its `timeout`, as `user`; one that needs root behind `sudo -n --` (command_line), or
    with a sudo password behind SUDO_WITH_PASSWORD, whose root bash then runs the `timeout`."""
    if with_password and step.sudo and user != "root":
        return f"{SUDO_WITH_PASSWORD} {_timed(step, shlex.join(step.argv))}"
    return _timed(step, command_line(step, user))


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
    temp = put.temp_path(token)
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
        too_long = len(batch_script(script_steps([*run, step], "0" * 12), LONGEST_SCRIPT_USER,
                                    "0" * 16)) > MAX_SCRIPT_CHARS
        if run and ((needs_channel and channel_stdin(script_steps(run, "0" * 12)) is not None) or too_long):
            trips.append(tuple(run))
            run = []
        run.append(step)
    if run:
        trips.append(tuple(run))
    return trips


def put_results(trip: Sequence[Step | Put], results: Sequence[StepResult]) -> list[StepResult]:
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


def trip_steps_done(trip: Sequence[Step | Put], script_results: Sequence[StepResult]) -> int:
    """How many of a run's steps have all their results among `script_results` (a Put is its write and rename)."""
    count = index = 0
    for step in trip:
        index += 2 if isinstance(step, Put) else 1
        if index > len(script_results):
            break
        count += 1
    return count


def concurrently(steps: Sequence[Step]) -> list[Step]:
    """The same steps, run at the same time when they follow one another in a batch."""
    return [replace(step, concurrent=True) for step in steps]


def _groups(steps: Sequence[Step]) -> list[list[int]]:
    """Step indexes in the order they run: each step alone, or a run of consecutive concurrent steps together."""
    groups: list[list[int]] = []
    for index, step in enumerate(steps):
        if step.concurrent and groups and steps[groups[-1][-1]].concurrent:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _redirect(step: Step, channel: str) -> str:
    inline = inline_stdin(step)
    if inline is not None:
        return f" <<'{HEREDOC_END}'\n{inline}{HEREDOC_END}"
    return channel if step.stdin is not None else " </dev/null"


def _markers(marker: str, index: int, times: str) -> list[str]:
    return [f"printf '\\n%s %s\\n' '{marker} {index} end' \"{times}\"",
            f"printf '\\n%s %s\\n' '{marker} {index} end' \"{times}\" >&2"]


def _starts(marker: str, index: int) -> str:
    return f"printf '%s\\n' '{marker} {index} start'; printf '%s\\n' '{marker} {index} start' >&2"


def _segments(steps: Sequence[Step], user: str) -> list[tuple[bool, list[list[int]]]]:
    """The script's groups in order, each consecutive two or more steps that need root (and `user` is not root)
    gathered into one root run (True): one `sudo -n` runs them all. A concurrent group joins a run only whole, a step
    that reads the channel never (the run's bash reads its own lines from stdin)."""
    segments: list[tuple[bool, list[list[int]]]] = []
    for group in _groups(steps):
        root = user != "root" and all(steps[index].sudo and channel_stdin([steps[index]]) is None for index in group)
        if root and segments and segments[-1][0]:
            segments[-1][1].append(group)
        else:
            segments.append((root, [group]))
    return [(root and sum(len(group) for group in groups) > 1, groups) for root, groups in segments]


def _group_lines(steps: Sequence[Step], group: list[int], marker: str, command: Callable[[Step], str],
                 stop: str) -> list[str]:
    """One group's lines: its step (or its concurrent steps; `command` gives each one's invocation) framed by markers,
    then `stop` after a code not in a step's ok set."""
    oks = [f"case $rc{index} in {'|'.join(str(code) for code in sorted(steps[index].ok))}) ;; *) {stop} ;; esac"
           for index in group]
    if len(group) == 1:
        [index] = group
        step = steps[index]
        return [_starts(marker, index), "t0=$EPOCHREALTIME", f"{command(step)}{_redirect(step, ' <&3')}",
                f"rc{index}=$?", *_markers(marker, index, f"$rc{index} $t0 $EPOCHREALTIME"), *oks]
    lines = ['[ -n "$d" ] || { d=$(mktemp -d) && trap \'rm -rf -- "$d"\' EXIT; }']
    for index in group:
        step, files = steps[index], f'"$d/{index}"'
        lines += [f"( t0=$EPOCHREALTIME; {command(step)} >{files}.out 2>{files}.err{_redirect(step, ' <&3')}",
                  f"printf '%s %s %s' \"$?\" \"$t0\" \"$EPOCHREALTIME\" >{files}.rc ) &"]
    lines.append("wait")
    for index in group:
        files = f'"$d/{index}"'
        lines += [_starts(marker, index), f"cat -- {files}.out; cat -- {files}.err >&2",
                  f"read -r rc{index} t0 t1 <{files}.rc", *_markers(marker, index, f"$rc{index} $t0 $t1")]
    return lines + oks


def _root_run_lines(steps: Sequence[Step], groups: list[list[int]], marker: str, with_password: bool) -> list[str]:
    """A root run: its steps' lines, as text in a variable, which one `sudo -n bash` reads from its stdin and runs,
    each step still under its own `timeout` with its own stdin and markers (on stdin, not in its command line: sudo
    logs a command line, and the facts' would hold SGLang's 36 KB option reader). The run's bash exits
    ROOT_RUN_STOPPED where a step's code was not accepted, and the batch stops there. Where sudo did not start that
    bash (it exits 1 when it asks for a password or refuses the command, 126/127 when it cannot be run), the same
    lines run here with `sudo -n --` before each step, so each step's result and its password prompt are what a step
    of its own would give (steps.check_result); a run's bash ended by a signal (128+) ends the batch without sending
    its steps again. With a sudo password the same, through SUDO_WITH_PASSWORD, which runs each step's `timeout` as
    root in that case."""
    def command(step: Step) -> str:
        argv = shlex.join(step.argv)
        return f'"${{as_root[@]}}" {_timed(step, argv)}' if with_password else _timed(step, f'"${{as_root[@]}}" {argv}')
    body = "\n".join(line for group in groups for line in _group_lines(steps, group, marker, command, 'exit "$stop"'))
    variable = f"r{groups[0][0]}"
    sudo = SUDO_WITH_PASSWORD if with_password else "sudo -n --"
    return [f"{variable}={shlex.quote(body)}",
            # lines it could not read end the batch (exit 2, the run's first step's code) rather than run none of them
            f"{sudo} bash -c 'as_root=() stop={ROOT_RUN_STOPPED}; run=$(</dev/stdin) || exit 2; eval \"$run\"; "
            f'exit 0\' sglang-deploy <<<"${variable}"',
            "rc=$?",
            f"case $rc in 0) ;; {ROOT_RUN_STOPPED}) exit 0 ;; 1|126|127) "
            f'as_root=({sudo}); stop=0; eval "${variable}"; as_root=() ;; *) exit "$rc" ;; esac']


def batch_script(steps: Sequence[Step], user: str, marker: str, with_password: bool = False) -> str:
    """A bash script running `steps` in order, each framed by marker lines on stdout and stderr.

    Each step runs under coreutils `timeout` (its own timeout, then KILL), its exit code and start/end
    times go into the closing marker, and the script stops after the first code not in the step's ok set.
    A run of concurrent steps starts together, each writing into files of a private directory, and is framed
    in order once all have ended. Consecutive steps that need root share one `sudo -n` (`_root_run_lines`).
    `with_password`: the channel's first line is the sudo password, and root steps run through `sudo -S`
    (SUDO_WITH_PASSWORD).
    """
    lines = [*(_SUDO_WITH_PASSWORD_LINES if with_password and user != "root" else ()),
             "exec 3<&0", "d="]  # a background job's stdin is /dev/null: a concurrent step reads the channel from fd 3
    for root, groups in _segments(steps, user):
        if root:
            lines += _root_run_lines(steps, groups, marker, with_password)
            continue
        [group] = groups
        lines += _group_lines(steps, group, marker, lambda step: invocation(step, user, with_password), "exit 0")
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


class Dropped(Exception):
    """The connection died during a round trip: the results that came before, the step whose result did not, why."""

    def __init__(self, results: Sequence[StepResult], running: Step | Put, reason: str) -> None:
        super().__init__(reason)
        self.results, self.running, self.reason = list(results), running, reason


class SilenceBound:
    """How long a round trip's channel may stay silent: the longest timeout of the steps whose end marker has not come
    (each runs under `timeout -k`), plus `grace_s`. Fed the stdout as it arrives; pure, no clock."""

    def __init__(self, steps: Sequence[Step], marker: str, grace_s: float = SILENCE_GRACE_S) -> None:
        self.steps, self.marker, self.grace_s = steps, marker, grace_s
        self.ended = 0  # steps whose end marker has arrived
        self._pending = ""  # the end of the stdout seen so far: a marker may arrive split over two chunks
        self.gave_up_after_s: float | None = None  # set by the waiter that found the channel silent past the bound

    def seen(self, text: str) -> None:
        self._pending += text
        while self.ended < len(self.steps):
            closing = f"{self.marker} {self.ended} end "
            at = self._pending.find(closing)
            if at < 0:
                break
            self._pending = self._pending[at + len(closing):]
            self.ended += 1
        self._pending = self._pending[-(len(self.marker) + 24):]

    @property
    def bound_s(self) -> float:
        running = self.steps[self.ended:]
        longest = max((step.timeout_s for step in running), default=0.0)
        return longest + KILL_AFTER_S + self.grace_s

class LineSink:
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
