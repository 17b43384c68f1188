"""Progress lines of a transfer (a download or a push): rate over the transfer so far, and the ETA."""

from __future__ import annotations

from dataclasses import dataclass

from deploy_lib.models.facts import size_text
from deploy_lib.progress import Progress

PROGRESS_EVERY_S = 5.0       # the host reports every second; the user sees a line this often


@dataclass
class TransferMeter:
    """Progress lines of a transfer from (bytes done, total) samples: rate over the transfer so far, and the ETA."""

    started_at: float
    every_s: float = PROGRESS_EVERY_S
    first_done: int | None = None
    shown_at: float | None = None
    last: tuple[int, int] | None = None
    last_shown: bool = False

    def sample(self, done: int, total: int, now: float, final: bool = False) -> str | None:
        self.last = (done, total)
        if self.first_done is None:
            self.first_done = done  # bytes a resumed transfer already had do not count toward the rate
        self.last_shown = final or self.shown_at is None or now - self.shown_at >= self.every_s
        if not self.last_shown:
            return None
        self.shown_at = now
        elapsed = max(now - self.started_at, 1e-9)
        rate = (done - self.first_done) / elapsed
        percent = 100 * done / total if total else 100.0
        line = f"{size_text(done)} / {size_text(total)} ({percent:.0f}%), {size_text(rate)}/s"
        if rate > 0 and done < total:
            line += f", ETA {_duration((total - done) / rate)}"
        return line


    def finish(self, now: float) -> str | None:
        """The last sample if it was not shown (the previous line was too recent): the transfer's end state."""
        return self.sample(*self.last, now, final=True) if self.last and not self.last_shown else None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def show_end(meter: TransferMeter, progress: Progress, what: str, now: float) -> None:
    if (line := meter.finish(now)) is not None:
        progress.transfer(f"{what}: {line}")
