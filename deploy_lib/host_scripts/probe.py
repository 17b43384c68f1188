"""Readiness probe that runs ON THE HOST: deploy_lib.health sends this file's text to `python3 -` on stdin.

Standard library only, and no syntax newer than Python 3.8, since it runs on whatever python3 the host
has (before 3.10 a timeout is reported by its OS error text rather than as "timeout"). health.probe appends
one call, `run_probe_and_print(<config JSON>)`. The probe gathers a snapshot of the unit, the port, the
health endpoint and optionally a real generation; with `wait_s` it looks again every `poll_s` until what the
ladder decides on (`state_of`) differs from the state the caller saw last (`seen`) or the time is up, so one
round trip waits on the server instead of one round trip per look. It adds the unit's newest journal line and
prints exactly one JSON object. It never raises and always exits 0: every failure becomes a field of the
snapshot, so one round trip always yields a verdict.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from typing import Any  # the config and the snapshot are JSON objects

UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "ExecMainPID", "ExecMainStatus", "ExecMainCode",
                   "Result", "InvocationID")
BODY_EXCERPT_CHARS = 300
MARK_WINDOW = 5000  # entries read for marks when the unit had no journal before the restart
MAX_MARKS = 500  # marked lines sent back by one probe (every TP rank logs each)
GENERATION_RETRY_S = 0.25  # while waiting, a generation that failed is sent again at most this often
READ_CHUNK = 65536


def parse_systemctl_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B` output (KEY=VALUE lines) -> {KEY: VALUE}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def unit_state(unit: str) -> tuple[dict[str, str] | None, str | None]:
    """The unit's properties from systemctl, or None and why not."""
    if shutil.which("systemctl") is None:
        return None, "systemctl not found"
    argv = ["systemctl", "show", unit, "--no-pager", "-p", ",".join(UNIT_PROPERTIES)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"systemctl show: {exc}"
    if done.returncode != 0:
        return None, f"systemctl show exited {done.returncode}: {done.stderr.strip()[-BODY_EXCERPT_CHARS:]}"
    return parse_systemctl_show(done.stdout), None


def journal_message(entry: dict[str, Any]) -> str:
    """MESSAGE of a `journalctl -o json` entry; journald sends non-UTF-8 text as a list of byte values."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        return bytes(message).decode("utf-8", "replace")
    return "" if message is None else str(message)


def last_journal_line(matches: list[str], after_cursor: str | None) -> tuple[dict[str, str] | None, str | None]:
    """The unit's newest journal entry after `after_cursor` as {text, cursor}, or None and why not; `matches` are
    journalctl's for the unit (deploy_lib.facts.diagnose.unit_matches, the same as every other read of its journal)."""
    if shutil.which("journalctl") is None:
        return None, "journalctl not found"
    # The newest entry, compared with the cursor: `-n 1 --after-cursor` would give the OLDEST entry after it.
    argv = ["journalctl", "-n", "1", "-o", "json", "--no-pager", "-q", *matches]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"journalctl: {exc}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        return None, f"journalctl exited {done.returncode}" if done.returncode != 0 else None
    try:
        entry = json.loads(lines[-1])
    except ValueError:
        return None, "journalctl printed no JSON"
    cursor = str(entry.get("__CURSOR", ""))
    if after_cursor and cursor == after_cursor:
        return None, None  # nothing logged since
    return {"text": journal_message(entry), "cursor": cursor}, None


def journal_since(matches: list[str], after_cursor: str | None, patterns: list[str]
                  ) -> tuple[dict[str, str] | None, list[dict[str, Any]], str | None]:
    """The unit's newest entry after `after_cursor` (as `last_journal_line`) and every entry since it whose text
    matches one of `patterns` as {text, usec} (the journal's time), from one read, so no line falls between two."""
    if shutil.which("journalctl") is None:
        return None, [], "journalctl not found"
    # every entry after the cursor (the ladder's previous look); without one, this unit's newest MARK_WINDOW
    window = ["--after-cursor=" + after_cursor] if after_cursor else ["-n", str(MARK_WINDOW)]
    argv = ["journalctl", "-o", "json", "--no-pager", "-q", *window, *matches]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, [], f"journalctl: {exc}"
    if done.returncode != 0:  # a cursor journald no longer knows (rotated, vacuumed): the newest line alone, no marks
        newest, error = last_journal_line(matches, after_cursor)
        return newest, [], error or f"journalctl --after-cursor exited {done.returncode}: no startup lines"
    compiled = [re.compile(pattern) for pattern in patterns]
    newest = None
    marks: list[dict[str, Any]] = []
    for line in done.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        text = journal_message(entry)
        newest = {"text": text, "cursor": str(entry.get("__CURSOR", ""))}
        if any(pattern.search(text) for pattern in compiled) and len(marks) < MAX_MARKS:
            marks.append({"text": text[:BODY_EXCERPT_CHARS], "usec": int(entry.get("__REALTIME_TIMESTAMP") or 0)})
    return newest, marks, None


def port_open(host: str, port: int, timeout_s: float) -> tuple[bool, str | None]:
    """Whether a TCP connection to host:port succeeds; if not, the reason in a word or two."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, None
    except ConnectionRefusedError:
        return False, "refused"
    except TimeoutError:
        return False, "timeout"
    except OSError as exc:
        return False, exc.strerror or str(exc)


def health_get(host: str, port: int, path: str) -> bytes:
    """The health endpoint's GET as both probes send it (this one from the host, deploy_lib.host.readiness's through
    the SSH connection), closed after its answer."""
    name = "[" + host + "]" if ":" in host else host
    return ("GET " + (path or "/") + " HTTP/1.1\r\nHost: " + name + ":" + str(port) + "\r\nConnection: close\r\n"
            "Accept: */*\r\n\r\n").encode()


def answer_status(answer: bytes) -> tuple[int | None, bool | None]:
    """An HTTP/1.x answer's status code (None: no status line yet) and whether it is whole: its body as long as its
    Content-Length, or its last chunk come (True); more to come (False); None where only the server's close ends
    it (no length given). What is not HTTP, or not the chunks it claims, is whole without a status: more would not
    help."""
    if b"\r\n" not in answer:  # no whole status line yet: more to come while it can still become one
        return None, not b"HTTP/".startswith(answer[:5]) and not answer.startswith(b"HTTP/")
    head, separator, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    first = lines[0].split()
    if len(first) < 2 or not first[0].startswith(b"HTTP/") or not first[1].isdigit():
        return None, True
    status = int(first[1])
    if not separator:
        return status, False
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    if status < 200 or status in (204, 304):  # no body, whatever the headers say (RFC 9112 6.3)
        return status, True
    if b"chunked" in headers.get(b"transfer-encoding", b""):
        at = 0
        while True:  # each chunk: its size in hex, CRLF, the data, CRLF; the last one's size is 0
            end = body.find(b"\r\n", at)
            if end < 0:
                return status, False
            try:
                size = int(body[at:end].split(b";")[0], 16)
            except ValueError:
                return None, True
            if size == 0:
                return status, True
            at = end + 2 + size + 2
    length = headers.get(b"content-length", b"")
    return status, len(body) >= int(length) if length.isdigit() else None


def health_reading(answer: bytes, error: str | None) -> tuple[int | None, str | None]:
    """(status, error) of the health endpoint from its answer, read until it was whole (answer_status), the server
    closed, or `error` (timeout, reset) ended the read: the one decision of both probes. A status counts only from
    a whole answer: a server stalled after its status line, or cut off in its body, has not answered."""
    status, whole = answer_status(answer)
    if status is not None and (whole or (whole is None and error is None)):
        return status, None
    if status is None:
        return None, error or "no HTTP answer"
    return None, error or "the server closed the connection before its whole answer"


def exchange(host: str, port: int, data: bytes, timeout_s: float) -> tuple[bytes, str | None]:
    """One TCP exchange from the host: `data` sent, the answer read until it is whole (answer_status) or the server
    closes; the error that ended it otherwise, in a word or two (as port_open)."""
    chunks: list[bytes] = []
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(data)
            while answer_status(b"".join(chunks))[1] is not True:
                chunk = connection.recv(READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
    except ConnectionRefusedError:
        return b"".join(chunks), "refused"
    except (TimeoutError, socket.timeout):  # noqa: UP041  (socket.timeout is TimeoutError only from Python 3.10)
        return b"".join(chunks), "timeout"
    except OSError as exc:
        return b"".join(chunks), exc.strerror or str(exc)
    return b"".join(chunks), None


def http_request(url: str, timeout_s: float, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int | None, str, str | None]:
    """(status, body excerpt, error) of one request; an HTTP error status is a result, not an error. Straight to
    the server with http.client (half urllib.request's imports): proxies from the environment never see it."""
    import http.client  # here, for the generation only: deploy_lib.host.readiness imports this file into a no-op
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        connection.request("POST" if body else "GET", parts.path + ("?" + parts.query if parts.query else ""),
                           body=body, headers=headers or {})
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        return response.status, text if response.status < 400 else text[:BODY_EXCERPT_CHARS], None
    except ConnectionRefusedError:
        return None, "", "refused"
    except (TimeoutError, socket.timeout):  # noqa: UP041  (socket.timeout is TimeoutError only from Python 3.10)
        return None, "", "timeout"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        # http.client.RemoteDisconnected and friends: the server closed the connection mid-answer.
        return None, "", f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


def generated_text(payload: object) -> str | None:
    """The text of a /generate, /v1/completions or /v1/chat/completions answer; None if it has none."""
    if isinstance(payload, list) and payload:
        payload = payload[0]
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("text"), str):
        return payload["text"]
    choices = payload.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        if isinstance(choice.get("text"), str):
            return choice["text"]
        message = choice.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            return message["content"]
    return None


def generate(base_url: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One real generation request; the API key goes only into the Authorization header."""
    headers = {"Content-Type": "application/json"}
    if spec.get("api_key"):
        headers["Authorization"] = f"Bearer {spec['api_key']}"
    started = time.monotonic()
    status, body, error = http_request(base_url + str(spec["path"]), float(spec["timeout_s"]),
                                       json.dumps(spec["body"]).encode(), headers)
    result: dict[str, Any] = {"status": status, "text": None, "error": error,
                                 "seconds": round(time.monotonic() - started, 3), "body": None}
    if status == 200:
        try:
            result["text"] = generated_text(json.loads(body))
        except ValueError:
            result["error"] = "answer is not JSON"
    if result["text"] is None:
        result["body"] = body[:BODY_EXCERPT_CHARS]
    return result


def look(config: dict[str, Any], generation: dict[str, Any] | None = None) -> dict[str, Any]:
    """One look at the unit, port and health endpoint, and a generation once they pass (`generation`: the answer
    to reuse instead of sending another); later rungs are only tried once the earlier ones pass, so a loading
    server costs little."""
    snapshot: dict[str, Any] = {"unit": None, "unit_error": None, "port_open": False, "port_error": None,
                                   "health_status": None, "health_error": None, "generation": None,
                                   "last_log": None, "journal_error": None}
    unit = config.get("unit")
    if unit:
        snapshot["unit"], snapshot["unit_error"] = unit_state(str(unit))
    host, port = str(config["host"]), int(config["port"])
    snapshot["port_open"], snapshot["port_error"] = port_open(host, port, float(config["connect_timeout_s"]))
    base_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    health_ok = snapshot["port_open"]
    if snapshot["port_open"] and config.get("health_path"):
        answer, error = exchange(host, port, health_get(host, port, str(config["health_path"])),
                                 float(config["http_timeout_s"]))
        snapshot["health_status"], snapshot["health_error"] = health_reading(answer, error)
        health_ok = snapshot["health_status"] == 200
    if health_ok and config.get("generate"):
        snapshot["generation"] = generation or generate(base_url, config["generate"])
    return snapshot


def state_of(snapshot: dict[str, Any]) -> str:
    """Everything the ladder's verdict depends on, as one string (no error texts, no durations)."""
    unit = dict(snapshot["unit"] or {})
    generation = dict(snapshot["generation"] or {})
    return json.dumps([[unit.get(name) for name in UNIT_PROPERTIES], snapshot["unit_error"] is None,
                       snapshot["port_open"], snapshot["health_status"], snapshot["health_error"] is None,
                       generation.get("status"), bool(generation.get("text"))])


def probe(config: dict[str, Any]) -> dict[str, Any]:
    """A snapshot once its state differs from `seen`, or the last one when `wait_s` has passed."""
    started = time.monotonic()
    wait_until = started + float(config.get("wait_s") or 0)
    poll_s = float(config.get("poll_s") or 0.05)
    generation, generation_at = None, 0.0
    while True:
        reuse = generation if time.monotonic() - generation_at < GENERATION_RETRY_S else None
        snapshot = look(config, reuse)
        if snapshot["generation"] is not None and snapshot["generation"] is not reuse:
            generation, generation_at = snapshot["generation"], time.monotonic()
        state = state_of(snapshot)
        if state != config.get("seen") or time.monotonic() + poll_s >= wait_until:
            break
        time.sleep(poll_s)
    matches = config.get("journal_matches")
    patterns = config.get("journal_marks")
    if matches and patterns:
        snapshot["last_log"], snapshot["marks"], snapshot["journal_error"] = journal_since(
            [str(match) for match in matches], config.get("journal_after_cursor"), [str(p) for p in patterns])
    elif matches:
        snapshot["last_log"], snapshot["journal_error"] = last_journal_line(
            [str(match) for match in matches], config.get("journal_after_cursor"))
    snapshot["state"] = state
    snapshot["probe_s"] = round(time.monotonic() - started, 3)
    return snapshot


def run_probe_and_print(config_json: str) -> None:
    """Entry point appended by health.probe: print one snapshot, whatever happens."""
    try:
        snapshot = probe(json.loads(config_json))
    except Exception as exc:  # the contract is one JSON object on stdout, never a traceback
        snapshot = {"probe_error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(snapshot))
