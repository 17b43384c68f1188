"""The automatic rollback when the connection drops under it (issue 31, point 5): a deploy whose release fails its
verification rolls back, and the round trip that switches back and restarts loses its connection. The rollback's
steps are safe to send again on a new connection (the remote layer does, within its policy); when that does not
bring the host back, the error says which release failed, where `current` may point, that the rollback target was
not verified, and that `invoke rollback --to <target>` finishes it. The sandbox test with a real link cut:
tests/sandbox/test_netdrop_sandbox.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from helpers.deploy_plan import target
from helpers.recording_progress import RecordingProgress
from helpers.rollback import DEAD, LAYOUT, READY, ScriptedHost, a_host, changed_profile
from helpers.store_output import release_entries

from deploy_lib import store
from deploy_lib.commands.deploy import Options, deploy
from deploy_lib.commands.status import read_status
from deploy_lib.errors import ConnectionLost
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.remote.steps import repeatable

SWITCH = "switch: temp link"


class OnlyBServes(dict):  # type: ignore[type-arg]
    """Probe answers: B (the release serving before the deploy) is ready, any other release is dead."""

    def __missing__(self, release_id: str) -> list[object]:
        return [READY] if release_id == "B" else [DEAD]


def losing_the_rollback(host: ScriptedHost) -> list[list[Step | Put]]:
    """The host's round trips as the remote layer runs them, until the second switch (the rollback's), whose round
    trip is lost for good (ConnectionLost, as after its reconnects gave up); the switch batches sent, filled in."""
    switch_batches: list[list[Step | Put]] = []
    scripted_run = host.run

    def run(batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        switch = next((step for step in batch if step.name == SWITCH), None)
        if switch is not None:
            switch_batches.append(list(batch))
            if len(switch_batches) == 2:  # the rollback's: nothing of it came back
                raise ConnectionLost(f"connection to fake@host:22 lost during step {batch[0].name!r}",
                                     step=batch[0])
        return scripted_run(batch, on_output)

    host.run = run  # type: ignore[method-assign]
    return switch_batches


def test_a_rollback_whose_connection_is_lost_says_what_failed_where_current_is_and_what_to_run() -> None:
    """Input tried: the new release dead at its first probe, then the rollback's switch-and-restart round trip lost
    for good (ConnectionLost from the remote layer, as after its reconnects gave up)."""
    host = a_host()
    host.probes = OnlyBServes()
    switch_batches = losing_the_rollback(host)
    with pytest.raises(ConnectionLost) as lost:
        deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    new = lost.value.release_id
    message, hint = lost.value.message, lost.value.hint or ""
    assert new not in (None, "B") and lost.value.exit_code == 11
    assert f"release {new} failed (" in message and "the rollback to B did not finish" in message
    assert f"current is {new}, or B if the host ran on" in message, message
    assert "release B was NOT verified" in message
    assert "`invoke rollback --to B`" in hint and "`invoke status`" in hint
    assert all(repeatable(step) for step in switch_batches[1]), \
        "the rollback's round trip may be sent again on a new connection"
    assert not all(repeatable(step) for step in switch_batches[0]), "the deploy's own switch is not sent again"


def as_left_by_the_lost_rollback(host: ScriptedHost, current: str) -> ScriptedHost:
    """The host as the next command reads it: the history lines the deploy appended after the ones it had, the new
    release staged, `current` on `current` (the new release, or B if the host ran the lost round trip on)."""
    appended = "".join(step.stdin.decode() for step in host.ran
                       if isinstance(step, Step) and step.name == "history: append" and step.stdin)
    had, files = (result.stdout for result in host.run([Step(store.FACT_HISTORY, ("true",)),
                                                        Step(store.FACT_RELEASE_FILES, ("true",))]))
    staged = {put.dest.parent.name.removesuffix(".tmp"): put.data.decode() for put in host.files.values()
              if put.dest.name == "release.json"}
    [(new, release_json)] = staged.items()
    host.reply(store.FACT_HISTORY, stdout=had + appended)
    host.reply(store.FACT_RELEASE_DIRS, stdout=release_entries("A", "B", new))
    host.reply(store.FACT_RELEASE_FILES, stdout=files + f"{LAYOUT.releases}/{new}/release.json\0{release_json}\n")
    host.reply(store.FACT_CURRENT, stdout=f"releases/{current}\n")
    host.current = current
    return host


@pytest.mark.parametrize("ran_on", [False, True])
def test_status_after_a_lost_rollback_says_what_history_holds(ran_on: bool) -> None:
    """Input tried: `status` after the lost rollback above, `current` on the failed release, or on B when the host
    ran the lost round trip on. It said the current release "was switched to but never verified (the command that
    switched it did not finish: killed, or the host went down)", while history records the new release's failed
    verification and B's healthy deploy before it."""
    host = a_host()
    host.probes = OnlyBServes()
    losing_the_rollback(host)
    with pytest.raises(ConnectionLost) as lost:
        deploy(changed_profile(), target(), host, RecordingProgress(), Options(grace_s=0))
    new = lost.value.release_id
    assert new is not None
    report = read_status(target(), "sglang", as_left_by_the_lost_rollback(host, "B" if ran_on else new))
    advice = report.advice or ""
    assert not report.verified and "never verified" not in advice, advice
    assert f"release {new} failed its verification (deploy, " in advice
    assert "the unit failed (Result=exit-code, exit status 1)" in advice
    if ran_on:
        assert "release B is current again, but the rollback that switched back to it did not finish" in advice
        assert "`invoke rollback --to B` verifies it" in advice
    else:
        assert f"release {new} is still current: the rollback to release B after it did not finish" in advice
        assert "`invoke rollback --to B` finishes it" in advice
