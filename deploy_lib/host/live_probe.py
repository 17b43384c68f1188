"""The live probe of a running server, up to its health endpoint (a no-op's "is it serving right now?"): the host
reads only what must be read there, the unit's state (one `systemctl show`, which can ride in another round trip),
and the client sends the health request itself through the SSH connection it holds (remote/forward.py). A host
whose sshd forwards nothing is probed as the ladder probes it (host_scripts/probe.py, one round trip)."""

from __future__ import annotations

from pydantic import ValidationError

from deploy_lib.errors import ReadinessFailed
from deploy_lib.health.probe import ProbeTarget, parse_snapshot, probe_step
from deploy_lib.health.snapshot import Rung, Snapshot, UnitState
from deploy_lib.health.verdict import NotReady, Verdict, assess
from deploy_lib.host_scripts.probe import (
    UNIT_PROPERTIES,
    health_get,
    health_reading,
    parse_systemctl_show,
)
from deploy_lib.remote import Forwarded, Remote, Step, StepResult, forward

LIVE_UNIT = "live probe: unit state"
EVERY_EXIT = frozenset(range(256))  # a unit state that cannot be read is a reading (unit_error), not a failed batch


def live_unit_step(target: ProbeTarget) -> Step:
    """The host's part of the live probe: the unit's properties the verdict reads (the ladder's own set)."""
    unit = target.unit or ""
    return Step(LIVE_UNIT, ("systemctl", "show", "--no-pager", "-p", ",".join(UNIT_PROPERTIES), "--", unit),
                ok=EVERY_EXIT, timeout_s=10, repeatable=True)


def health_request(target: ProbeTarget) -> bytes:
    """The health endpoint's GET, as the host probe sends it; nothing for a target without one (the exchange only
    connects: the port rung)."""
    return b"" if target.health_path is None else health_get(target.probe_host, target.port, target.health_path)


def unit_reading(unit: StepResult) -> tuple[UnitState | None, str | None]:
    """The unit's state from live_unit_step's result, or None and why not."""
    if unit.exit_code != 0:
        return None, f"systemctl show exited {unit.exit_code}: {unit.stderr.strip()[-300:]}"
    try:
        return UnitState.model_validate(parse_systemctl_show(unit.stdout)), None
    except ValidationError as error:
        return None, f"systemctl show printed no unit state: {error.errors()[0]['msg']}"


def forwarded_snapshot(target: ProbeTarget, unit: StepResult | None, answer: Forwarded) -> Snapshot:
    """The snapshot the host probe would have printed, from the unit's `systemctl show` and the forwarded request."""
    state, unit_error = unit_reading(unit) if target.unit and unit is not None else (None, None)
    # the host probe's own decision of its answer: the same server state gets the same verdict either way
    status, health_error = health_reading(answer.answer, answer.error) if answer.connected and target.health_path \
        else (None, None)
    return Snapshot(unit=state, unit_error=unit_error, port_open=answer.connected,
                    port_error=None if answer.connected else answer.error, health_status=status,
                    health_error=health_error)


def live_verdict(remote: Remote, target: ProbeTarget, unit: StepResult | None = None) -> Verdict:
    """Is the server ready right now, up to its health endpoint? `unit` is the live_unit_step's result when a batch
    sent it already (the facts' round trip), else it is read here. A probe that cannot be read is NotReady."""
    answer = forward(remote, target.probe_host, target.port, health_request(target), target.http_timeout_s)
    try:
        if not answer.sent:
            [result] = remote.run([probe_step(target, Rung.HEALTH)])
            return assess(parse_snapshot(result, Rung.HEALTH), None, Rung.HEALTH)
        if unit is None and target.unit:
            [unit] = remote.run([live_unit_step(target)])
        return assess(forwarded_snapshot(target, unit, answer), None, Rung.HEALTH)
    except ReadinessFailed as broken:
        return NotReady(broken.message, broken.rung, broken.evidence)
