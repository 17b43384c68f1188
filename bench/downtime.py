"""`make bench`'s downtime figures (issue 41): what the changed deploys of bench/run.py measured and printed
themselves (deploy_lib/health/downtime.py), from the old server's stop to the new one's first answer, split into the
server's own start and the rest, the tool's share (stopping the old server, systemd, the ladder's notice)."""

from __future__ import annotations

from collections.abc import Sequence

from bench.figures import Figure, seconds_figure
from bench.measure import ChangedRun

TOOL_SHARE_S = 0.5


def downtime_figures(changed: Sequence[ChangedRun]) -> list[Figure]:
    return [
        seconds_figure("changed deploy's downtime, as the deploy printed it (old server stopped -> new one answers)",
                       [run.downtime.total_s for run in changed], None),
        seconds_figure("  the server's own start in it (its process -> its first generation)",
                       [run.downtime.server_s for run in changed], None),
        seconds_figure("  the tool's share (the old server's stop, systemd, the ladder's notice)",
                       [run.downtime.tool_s for run in changed], TOOL_SHARE_S),
        seconds_figure("  - of it the old server's stop (journal: systemd's Stopping -> Started; its drain, its exit)",
                       [run.old_stop_s for run in changed], None),
        seconds_figure("  - the rest (the restart's steps on the host, the ladder noticing the first answer)",
                       [run.downtime.tool_s - run.old_stop_s for run in changed], None),
    ]
