"""The watch around a deploy (profile `watch:`, issue 42): a window of the old release's live traffic read from its
/metrics just before the switch, one of the new release's once it is ready, and the verdict
(deploy_lib/metrics/watch.py). A regression raises WatchFailed, which the deploy rolls back as a failed gate.

A window is two reads of /metrics `window_s` apart, on the client's monotonic clock; the command stays attached and
says what it is waiting for. A window that cannot be read (no release serving, metrics off, the server restarted in
between) is said and keeps the release: the watch only ever rolls back on evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from deploy_lib.errors import WatchFailed
from deploy_lib.facts.diagnose import Diagnosis
from deploy_lib.health.probe import ProbeTarget
from deploy_lib.host.switch import probe_target
from deploy_lib.metrics.live import metrics_step, parse_metrics_result
from deploy_lib.metrics.recorded import watch_figures
from deploy_lib.metrics.watch import WatchVerdict, judge_watch
from deploy_lib.metrics.window import WindowFigures, window_figures
from deploy_lib.profile import read_stored_profile
from deploy_lib.profile.settings import WatchSettings
from deploy_lib.progress import Progress
from deploy_lib.remote import Remote
from deploy_lib.store import StoreFacts, StoreLayout

_sleep: Callable[[float], None] = time.sleep  # the wait between a window's reads where no `sleep` is given


def metrics_served(metadata: Mapping[str, Any]) -> bool:
    """Whether a release was started with --enable-metrics (its recorded profile's features.metrics)."""
    return read_stored_profile(metadata.get("profile")).features.metrics


def read_window(remote: Remote, probe: ProbeTarget, window_s: float, label: str, progress: Progress,
                clock: Callable[[], float], sleep: Callable[[float], None] | None = None) -> WindowFigures | str:
    """The traffic a server served over `window_s` seconds from now, or why it could not be read."""
    [first] = remote.run([metrics_step(probe)])
    start = parse_metrics_result(first, clock())
    if isinstance(start, str):
        return start
    progress.note(f"watch: reading {label}'s live traffic for {window_s:g} s")
    (sleep or _sleep)(window_s)
    [second] = remote.run([metrics_step(probe)])
    end = parse_metrics_result(second, clock())
    if isinstance(end, str):
        return end
    try:
        return window_figures(start, end)
    except ValueError as unusable:  # a counter went down: the server restarted within the window
        return str(unusable)


def _evidence(verdict: WatchVerdict) -> tuple[str, ...]:
    def line(label: str, figures: WindowFigures) -> str:
        def ms(value: float | None) -> str:
            return "?" if value is None else f"{value * 1000:.0f} ms"

        return (f"{label}: {figures.requests:.0f} requests in {figures.window_s:.0f} s, p50/p99 TTFT "
                f"{ms(figures.ttft_s.p50)}/{ms(figures.ttft_s.p99)}, p50/p99 inter-token "
                f"{ms(figures.inter_token_s.p50)}/{ms(figures.inter_token_s.p99)}, {figures.generation_tok_s:.1f} "
                f"tok/s generated, {figures.mean_in_flight or 0:.1f} in flight")

    return line("before the switch", verdict.before), line("after the switch", verdict.after)


def watch_after_ready(remote: Remote, probe: ProbeTarget, settings: WatchSettings,
                      before: WindowFigures | str | None, progress: Progress, clock: Callable[[], float],
                      sleep: Callable[[float], None] | None = None) -> WatchVerdict | None:
    """The new release's window against `before` (None: no window was taken, the reason already said). Raises
    WatchFailed on a regression; returns the verdict otherwise, None when there was nothing to judge."""
    if before is None:
        return None
    if isinstance(before, str):
        progress.note(f"watch: no window before the switch ({before}); the release is kept unwatched")
        return None
    after = read_window(remote, probe, settings.window_s, "the new release", progress, clock, sleep)
    if isinstance(after, str):
        progress.note(f"watch: the new release's window was not read ({after}); the release is kept")
        return None
    verdict = judge_watch(before, after, settings)
    progress.note(f"watch: {verdict.message}")
    if verdict.rolls_back:
        raise WatchFailed(verdict.message, rung="watch", evidence=_evidence(verdict),
                          hint="both windows' figures are in the diagnosis; widen the profile's watch: bounds if "
                               "this is noise, or deploy again at a comparable hour",
                          figures=watch_figures(verdict.before, verdict.after))
    return verdict


def window_before_switch(remote: Remote, layout: StoreLayout, store: StoreFacts, current_id: str | None,
                         serving: bool, settings: WatchSettings, progress: Progress, clock: Callable[[], float],
                         sleep: Callable[[float], None] | None = None) -> WindowFigures | str:
    """The old release's window, read just before the switch, or why there is none."""
    record = store.release(current_id) if current_id is not None else None
    if record is None or not serving:
        return "no release was serving"
    if not metrics_served(record.metadata):
        return f"release {record.id} serves no /metrics: its profile had features.metrics off"
    probe = probe_target(layout, record.metadata, environ={}, generation=False)  # /metrics needs no API key
    return read_window(remote, probe, settings.window_s, f"release {record.id}", progress, clock, sleep)


def watch_diagnosis(failure: WatchFailed) -> Diagnosis:
    """A release that served live traffic too slowly: the verdict is the cause, both windows' figures the evidence."""
    return Diagnosis("live_watch", failure.message, failure.hint or "", failure.evidence)
