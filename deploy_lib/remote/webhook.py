"""Notifications to a webhook (the inventory's `notify_webhook`; in remote/ as the one connection that is not SSH):
a JSON document with a Slack-compatible `text` for each event a person should hear of without running `status` (a
rollback, a gate failure, a crash loop given up, a deploy done). Sent in the background with retries; a
notification never fails nor holds up the command: what could not be sent is a result the caller reports.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from deploy_lib.outcomes import Action

SEND_TIMEOUT_S = 5.0  # one POST


class HTTPRefused(OSError):
    """A status that is not 2xx (a 5xx or 429 is retried: a receiver restarting answers 502 or 503)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


def _retryable(error: BaseException) -> bool:
    """A network error or a 5xx/429 may pass; a 4xx (a wrong URL, a revoked token) will not."""
    return isinstance(error, OSError) and (not isinstance(error, HTTPRefused) or error.status >= 500
                                            or error.status == 429)


NOTIFY_RETRY = Retrying(stop=stop_after_attempt(4) | stop_after_delay(20), wait=wait_exponential(min=0.5, max=4),
                        retry=retry_if_exception(_retryable), reraise=True, name="notify")
WAIT_AT_EXIT_S = 10.0  # how long the command waits, at its end, for notifications still being sent
USER_AGENT = "sglang-deploy"


class NotifyEvent(StrEnum):
    deployed = Action.deployed.word
    rolled_back = Action.rolled_back.word
    gate_failed = "gate-failed"
    crash_loop = "crash-loop-given-up"
    failed = Action.failed.word  # a start that failed with no earlier release to go back to, or whose rollback failed


_ICONS = {NotifyEvent.deployed: ":white_check_mark:", NotifyEvent.rolled_back: ":leftwards_arrow_with_hook:",
          NotifyEvent.gate_failed: ":chart_with_downwards_trend:", NotifyEvent.crash_loop: ":rotating_light:",
          NotifyEvent.failed: ":x:"}


@dataclass(frozen=True)
class Notification:
    event: NotifyEvent
    host: str
    service: str
    message: str  # the one-line outcome, as the command printed it
    release_id: str | None = None
    serving_id: str | None = None  # the release serving now
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    figures: Mapping[str, float] = field(default_factory=dict)  # a watch's rollback: both windows', as in history

    def document(self) -> dict[str, Any]:
        """The JSON body: `text` for Slack-compatible receivers, the fields for everything else (`figures` only
        where there are some)."""
        return {"text": f"{_ICONS[self.event]} sglang-deploy {self.host} ({self.service}): {self.message}",
                "event": self.event.value, "host": self.host, "service": self.service, "message": self.message,
                "release": self.release_id, "serving": self.serving_id,
                "at": self.at.isoformat(timespec="seconds")} | ({"figures": dict(self.figures)} if self.figures else {})


@dataclass(frozen=True)
class SendResult:
    notification: Notification
    delivered: bool
    error: str | None = None  # why not, for the caller to show


def post_json(url: str, document: dict[str, Any], timeout_s: float = SEND_TIMEOUT_S) -> None:
    """One POST; HTTPRefused or OSError when it did not land."""
    request = urllib.request.Request(url, data=json.dumps(document).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as error:
        raise HTTPRefused(error.code, str(error.reason)) from None


def send(url: str, notification: Notification, policy: Retrying = NOTIFY_RETRY) -> SendResult:
    """Send with retries; never raises."""
    try:
        policy.copy()(post_json, url, notification.document())
    except OSError as error:
        return SendResult(notification, False, str(error) or type(error).__name__)
    return SendResult(notification, True)


class Notifier:
    """Sends each notification on a thread of its own; `close` waits a bounded time for those still going and
    returns every result (one not finished by then is reported as such)."""

    def __init__(self, url: str | None, policy: Retrying = NOTIFY_RETRY,
                 sender: Callable[[str, Notification, Retrying], SendResult] = send) -> None:
        self.url = url
        self.policy = policy
        self.sender = sender
        self._sending: list[tuple[Notification, threading.Thread, list[SendResult]]] = []

    def notify(self, notification: Notification) -> None:
        if self.url is None:
            return
        out: list[SendResult] = []
        url = self.url
        thread = threading.Thread(target=lambda: out.append(self.sender(url, notification, self.policy)),
                                  name=f"notify-{notification.event}", daemon=True)
        thread.start()
        self._sending.append((notification, thread, out))

    def close(self, wait_s: float = WAIT_AT_EXIT_S) -> list[SendResult]:
        deadline = time.monotonic() + wait_s
        results = []
        for notification, thread, out in self._sending:
            thread.join(max(0.0, deadline - time.monotonic()))
            results.append(out[0] if out else SendResult(notification, False, f"still sending after {wait_s:g} s"))
        self._sending.clear()
        return results
