"""A page opened in headless Chromium (Debian's `chromium`, a host tool of sandbox/testhost.sh), in a network
namespace of its own so nothing it sends leaves this machine: what it logged to the console, which requests the
page started (Chromium's net log), its DOM after load and a screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
                  "--v=0", "--virtual-time-budget=10000")  # virtual time: the page settles however busy the machine


@dataclass(frozen=True)
class Opened:
    console: list[str]        # every console message of the page (Chromium logs them as INFO:CONSOLE lines)
    page_requests: list[str]  # URLs other than file:// that the page itself started
    dom: str
    screenshot: Path


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("Debian's chromium is not installed: `sandbox/testhost.sh deps` installs the host tools")
    return found


def _chromium(page: Path, work: Path, name: str, *options: str) -> subprocess.CompletedProcess[str]:
    # unshare --net: Chromium's own background requests (and any of the page) reach no network at all
    argv = ["unshare", "--net", chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={work / name}", *options,
            page.resolve().as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)


def _page_requests(net_log: Path) -> list[str]:
    """URL requests whose network isolation key is the file's (the page's), other than file:// itself."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [event["params"]["url"] for event in log["events"]
            if event["type"] == start and "file://" in event["params"].get("network_isolation_key", "")
            and not event["params"]["url"].startswith("file:")]


def open_page(page: Path, work: Path, width: int = 1100, height: int = 6000) -> Opened:
    """Load the page twice: once for the DOM, console and net log, once for a screenshot of `width` x `height`."""
    net_log, shot = work / "net-log.json", work / "screenshot.png"
    dumped = _chromium(page, work, "profile-dom", f"--log-net-log={net_log}", "--dump-dom")
    _chromium(page, work, "profile-shot", f"--screenshot={shot}", f"--window-size={width},{height}")
    # Chromium's own UI pages (source: chrome://...) log to the same stream, e.g. "Slow network is detected" on a busy
    # machine: only the page's own messages count
    console = [line for line in dumped.stderr.splitlines() if ":CONSOLE" in line and "source: chrome://" not in line]
    return Opened(console=console, page_requests=_page_requests(net_log), dom=dumped.stdout, screenshot=shot)


class _Charts(HTMLParser):
    """Each <figure class="chart">'s id and the ids of the series drawn in it (matplotlib's gid `series-...`)."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, list[str]] = {}
        self._open: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "figure" and found.get("class") == "chart":
            self._open, self._depth = str(found.get("id")), 0
            self.charts[self._open] = []
        elif self._open is not None:
            self._depth += tag == "figure"
            if (found.get("id") or "").startswith("series-"):
                self.charts[self._open].append(str(found["id"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self._open is not None:
            if self._depth == 0:
                self._open = None
            self._depth -= 1


def series_per_chart(dom: str) -> dict[str, list[str]]:
    parser = _Charts()
    parser.feed(dom)
    return parser.charts


MIN_FRAME_PX = 400
# the host's page: its charts, and their plotting areas (throughput and TTFT, concurrency, power and utilisation,
# phases, events), plus one per release in the downtime chart (each release switched to with a server running before)
REPORT_CHARTS = ("chart-throughput", "chart-concurrency", "chart-power", "chart-starts", "chart-downtime",
                 "chart-events")
REPORT_AREAS = 7
# a tuning sweep's page (`report --tune ID`): throughput against concurrency, power and utilisation
SWEEP_CHARTS = ("chart-tune-concurrency", "chart-tune-power")
SWEEP_AREAS = 3
MIN_DRAWN_PX = 50


def chart_areas(png: Path) -> list[tuple[int, int, int]]:
    """Each chart's plotting area in the screenshot as (top row, bottom row, drawn pixels inside it): an area lies
    between two axis frame lines (a row holding an unbroken dark run of MIN_FRAME_PX: matplotlib's spines, never a
    dashed line, text or the page's light table borders), and its drawn pixels are strongly coloured ones (not
    white, grey or black), so a chart whose data is missing counts 0."""
    import numpy as np
    from PIL import Image  # matplotlib's own dependencies

    with Image.open(png) as image:
        rgb = np.asarray(image.convert("RGB")).astype(int)
    dark = (rgb.max(axis=2) < 190) & ((rgb.max(axis=2) - rgb.min(axis=2)) < 40)  # grey to black: a spine, antialiased
    coloured = (rgb.max(axis=2) - rgb.min(axis=2)) > 60  # the events chart's green #2e7d32 spans 79
    frames: list[tuple[int, int, int]] = []  # (row, first column, last column) of each frame line
    for row in range(dark.shape[0]):
        columns = np.flatnonzero(dark[row])
        if len(columns) < MIN_FRAME_PX:
            continue
        breaks = np.flatnonzero(np.diff(columns) > 1)
        starts, ends = np.r_[0, breaks + 1], np.r_[breaks, len(columns) - 1]
        longest = int(np.argmax(ends - starts))
        if ends[longest] - starts[longest] + 1 >= MIN_FRAME_PX:
            if frames and row - frames[-1][0] <= 3:  # one antialiased line over two or three rows
                continue
            frames.append((row, int(columns[starts[longest]]), int(columns[ends[longest]])))
    areas = []
    for (top, left, right), (bottom, _, _) in zip(frames[::2], frames[1::2], strict=False):
        inside = coloured[top + 3:bottom - 1, left + 2:right - 1]
        areas.append((top, bottom, int(inside.sum())))
    return areas


def assert_page_drawn(page: Path, work: Path, charts: tuple[str, ...], area_count: int) -> None:
    """The page opened in Chromium: no console message, no request it started, each of `charts` (and no other) with
    series in the DOM, and `area_count` plotting areas in the screenshot, each with drawn pixels."""
    opened = open_page(page, work)
    assert opened.console == [] and opened.page_requests == [], (opened.console, opened.page_requests)
    drawn = series_per_chart(opened.dom)
    assert set(drawn) == set(charts) and all(drawn[chart] for chart in charts), drawn
    areas = chart_areas(opened.screenshot)
    assert len(areas) == area_count and all(pixels >= MIN_DRAWN_PX for *_, pixels in areas), areas
