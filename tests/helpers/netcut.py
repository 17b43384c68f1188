"""A sandbox guest's network cut and restored from this machine, as a flaky link between the operator and the host
does: the host end of the guest's veth taken down (what is in flight is lost; both ends keep the connection open),
the guest's end of its SSH connections dropped (`ss -K` in the guest's network namespace: a guest that gave up on
them), and the link up again after a while, when the client's next packet meets the guest's reset."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence

from deploy_lib.errors import ConnectionLost
from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
from sandbox import manage


def set_link(guest: manage.Guest, up: bool) -> None:
    subprocess.run(["ip", "link", "set", "dev", guest.veth, "up" if up else "down"], check=True)


def drop_guest_connections(guest: manage.Guest) -> int:
    """Abort the guest's established SSH connections (its sshd sessions end); how many were aborted."""
    killed = subprocess.run(["ip", "netns", "exec", guest.netns, "ss", "-K", "-H", "-tn", "state", "established",
                             "sport", "=", ":22"], check=True, capture_output=True, text=True).stdout
    return len(killed.splitlines())


class CutDuring:
    """A Remote that cuts the guest's link just before it sends a batch holding a step whose name starts with `when`
    (the first such batch, or the one after `after` such batches went through), and restores it `down_s` later (the
    batch waits on the dead connection meanwhile); `back_when_lost`: at once when that batch ends in ConnectionLost
    instead (the link returns just after the tool gave up, so its last round trips, the lock's release, reach the
    host)."""

    def __init__(self, inner: FabricRemote, guest: manage.Guest, when: str, down_s: float = 3.0, after: int = 0,
                 back_when_lost: bool = False) -> None:
        self.inner, self.guest, self.when, self.down_s = inner, guest, when, down_s
        self.passed_before_cut, self.back_when_lost = after, back_when_lost
        self.aborted: int | None = None  # the guest's connections aborted at the cut; None: no cut yet
        self._restore: threading.Timer | None = None

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        if self.aborted is None and any(step.name.startswith(self.when) for step in batch):
            if self.passed_before_cut:
                self.passed_before_cut -= 1
                return self.inner.run(batch, on_output)
            set_link(self.guest, up=False)
            self.aborted = drop_guest_connections(self.guest)
            self._restore = threading.Timer(self.down_s, set_link, (self.guest, True))
            self._restore.start()
            try:
                return self.inner.run(batch, on_output)
            except ConnectionLost:
                if self.back_when_lost:
                    self.restore()
                raise
        return self.inner.run(batch, on_output)

    def restore(self) -> None:
        """The link up again now, whatever happened (the test's cleanup)."""
        if self._restore is not None:
            self._restore.cancel()
        set_link(self.guest, up=True)

    def close(self) -> None:
        self.inner.close()
