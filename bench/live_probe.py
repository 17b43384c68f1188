"""What the no-op's live probe costs the guest (issue 30): the host probe (host_scripts/probe.py under `python3 -I
-S`, with sudo, systemctl, journalctl and its requests: what a host whose sshd refuses forwarding still runs)
against the forwarded one (one `systemctl show` on the host, the health request through the SSH connection), each
on a connection of its own, less a connection that runs only `true` as often; interleaved, so a change of load hits
all three. Each connection probes REPEAT times: the kernel counts CPU in 10 ms ticks."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from bench.figures import Figure
from bench.measure import PROFILE, Rig
from deploy_lib.deploy.project import load_for_host
from deploy_lib.health import ProbeTarget, Rung, probe_step
from deploy_lib.host.readiness import health_request, live_unit_step
from deploy_lib.host.switch import live_target
from deploy_lib.remote import FabricRemote, Step

REPEAT = 10


@dataclass(frozen=True)
class LiveProbeRun:
    host_s: float  # the guest's CPU for one host probe in a round trip, a bare round trip's taken off
    forwarded_s: float  # ... for the unit's systemctl show in one and the forwarded health request


def live_probe_cpu(rig: Rig, metadata: dict[str, object]) -> LiveProbeRun:
    loaded, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
    probe = live_target(target.layout(loaded.profile.service.name), metadata, {})

    def guest_cpu(work: Callable[[FabricRemote, ProbeTarget], object]) -> float:
        before = rig.ssh_cpu.seconds()
        with FabricRemote(target.ssh) as remote:
            for _ in range(REPEAT):
                work(remote, probe)
        return (rig.ssh_cpu.seconds() - before) / REPEAT

    def forwarded(remote: FabricRemote, probe: ProbeTarget) -> None:
        remote.run([live_unit_step(probe)])
        answer = remote.forward(probe.probe_host, probe.port, health_request(probe), probe.http_timeout_s)
        assert answer.sent and answer.connected, answer

    bare = guest_cpu(lambda remote, _: remote.run([Step("connect", ("true",))]))
    host = guest_cpu(lambda remote, probe: remote.run([probe_step(probe, Rung.HEALTH)]))
    return LiveProbeRun(host - bare, guest_cpu(forwarded) - bare)


def live_probe_figures(runs: list[LiveProbeRun]) -> list[Figure]:
    host, forwarded = (statistics.median(values) for values in zip(*((r.host_s, r.forwarded_s) for r in runs),
                                                                   strict=True))
    return [Figure("the no-op's live probe, the guest's CPU (less a bare connection's)",
                   f"forwarded {forwarded:.3f} s | on the host {host:.3f} s", len(runs), "", None)]
