"""The only code that talks SSH: remote steps as data, and one reused Fabric connection that runs them.

Everything above this package builds `Step`/`Put` values; `FabricRemote.run` executes a batch of them over
one connection, several steps per round trip, and returns a `StepResult` per step. Host keys are checked
against a known_hosts file (Fabric's default accepts unknown keys; we refuse them unless the user opts in).

    steps       Step, Put, StepResult, the Remote protocol; how a step is shown; when a result is a failure
    batch       a batch as round trips: the bash script that runs several steps in one, and its output's parser
    ssh         SSHTarget, JumpHost, host keys, the connect policy and its errors, rsync's ssh options
    ssh_config  the user's OpenSSH config and the inventory's values resolved into one SSHTarget
    connection  FabricRemote: the connection, running round trips, uploads, pushing a directory
    forward     one TCP exchange forwarded through the connection (a direct-tcpip channel, as `ssh -L`)
    webhook     notifications POSTed to the inventory's notify_webhook, in the background, with retries
"""

from typing import TYPE_CHECKING, Any

from deploy_lib.remote.batch import (
    MAX_INLINE_STDIN,
    MAX_SCRIPT_CHARS,
    batch_script,
    channel_stdin,
    command_line,
    concurrently,
    parse_batch_output,
    round_trips,
    script_steps,
)
from deploy_lib.remote.forward import NOT_SENT, Forwarded, Forwarder, forward
from deploy_lib.remote.ssh import SSH_CONNECT, JumpHost, SSHTarget, rsync_argv
from deploy_lib.remote.steps import (
    MASK,
    TIMED_OUT_EXIT,
    OutputLine,
    Put,
    Remote,
    Step,
    StepResult,
    check_result,
    describe,
    display,
)

if TYPE_CHECKING:
    from deploy_lib.remote.connection import FabricRemote


def __getattr__(name: str) -> Any:
    """FabricRemote on first use: the steps, the inventory's SSH settings and a plan need no Fabric (PEP 562)."""
    if name == "FabricRemote":
        from deploy_lib.remote.connection import FabricRemote
        return FabricRemote
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MASK",
    "MAX_INLINE_STDIN",
    "MAX_SCRIPT_CHARS",
    "NOT_SENT",
    "SSH_CONNECT",
    "TIMED_OUT_EXIT",
    "FabricRemote",
    "Forwarded",
    "Forwarder",
    "JumpHost",
    "OutputLine",
    "Put",
    "Remote",
    "SSHTarget",
    "Step",
    "StepResult",
    "batch_script",
    "channel_stdin",
    "check_result",
    "command_line",
    "concurrently",
    "describe",
    "display",
    "forward",
    "parse_batch_output",
    "round_trips",
    "rsync_argv",
    "script_steps",
]
