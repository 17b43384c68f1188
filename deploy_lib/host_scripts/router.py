"""SGLang router control that runs ON THE ROUTER'S HOST: router.py sends this file's text to `python3 -` on stdin.

Standard library only, no syntax newer than Python 3.8 (it runs on whatever python3 the host has). router.py
appends one call, `run_and_print(<config JSON>)`. It talks to the router's worker-management API as sglang-router
0.3.2 serves it (the `/workers` routes of the model gateway: POST {"url": ...} queues a registration and answers
202, DELETE /workers/{id} queues a removal, GET /workers lists each worker's id, url and is_healthy), waits until
the router has done what was asked, and prints exactly one JSON object. It never raises and exits 0; a failure
is the object's `error`.

A router whose port refuses connections (not deployed yet, or stopped) is reported as `router_down`: it routes
nothing, so a replica behind it needs no draining.

Actions:
  ready   the router answers /health
  remove  the worker is no longer listed (no new request goes to it), then its running and waiting requests
          (SGLang's /v1/loads) are drained; a worker without /v1/loads, or already down, counts as drained; the
          router's counters (`metrics`) read just before the removal
  add     the worker is listed and healthy (the router has read its /health, /server_info and /model_info); the
          router's counters read once it is
  admit   every worker of `workers` that answers its own /health is listed healthy: the router's own
          registration of its --worker-urls is given `settle_s`, then one it has not listed is added as `add` does;
          a worker that does not answer is reported in `not_serving`
  list    the workers the router lists
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

POLL_S = 0.1


def request(method, url, body=None, timeout_s=5.0):
    """(status, parsed JSON or text); status "refused"/"error: ..." when there was no HTTP answer."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    call = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=timeout_s) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as failed:
        status, raw = failed.code, failed.read()
    except (urllib.error.URLError, OSError) as failed:
        reason = getattr(failed, "reason", failed)
        refused = isinstance(reason, ConnectionRefusedError)
        return ("refused" if refused else f"error: {reason}"), None
    try:
        return status, json.loads(raw.decode() or "null")
    except ValueError:
        return status, raw.decode(errors="replace")[:300]


class RouterDown(Exception):
    """Nothing listens on the router's port: no request goes through it, so there is nothing to drain."""


def listed(base, url):
    """The router's entries for this worker URL (trailing slash ignored), or None when the list cannot be read."""
    status, body = request("GET", base + "/workers")
    if status == "refused":
        raise RouterDown()
    if status != 200 or not isinstance(body, dict):
        return None
    wanted = url.rstrip("/")
    return [w for w in body.get("workers") or [] if str(w.get("url", "")).rstrip("/") == wanted]


def in_flight(url):
    """Running + waiting requests of every DP rank from the worker's /v1/loads; None when it cannot tell."""
    status, body = request("GET", url.rstrip("/") + "/v1/loads?include=core")
    if status != 200 or not isinstance(body, dict):
        return None
    return sum(int(load.get("num_running_reqs") or 0) + int(load.get("num_waiting_reqs") or 0)
               for load in body.get("loads") or [])


def counters(config):
    """The router's Prometheus text, only the families in `counted`, as `metrics`; `metrics_error` when it cannot be
    read (a router started with another --prometheus-port)."""
    try:
        with urllib.request.urlopen(config["metrics"], timeout=5.0) as answer:
            text = answer.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as failed:
        return {"metrics_error": "GET {}: {}".format(config["metrics"], getattr(failed, "reason", failed))}
    counted = set(config["counted"])
    return {"metrics": "".join(line + "\n" for line in text.splitlines() if family(line) in counted)}


def family(line):
    """The metric a line of Prometheus text is about: `# TYPE name counter`, or a sample's `name{...} value`."""
    words = line.split()
    if line.startswith("#"):
        return words[2] if len(words) > 2 else ""
    return words[0].split("{")[0] if words else ""


def wait_for(condition, deadline):
    """Poll condition() until it returns something truthy or the deadline passes; the last value."""
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(POLL_S)


def ready(config, deadline):
    base = config["router"]
    status = wait_for(lambda: request("GET", base + "/health")[0] == 200, deadline)
    return {} if status else {"error": f"the router at {base} did not answer /health with 200"}


def remove(config, deadline):
    base, url = config["router"], config["worker"]
    entries = listed(base, url)
    if entries is None:
        return {"error": f"the router at {base} did not list its workers (GET /workers)"}
    before = counters(config)
    for entry in entries:
        status, body = request("DELETE", "{}/workers/{}".format(base, entry["id"]))
        if status not in (200, 202, 204):
            return {"error": "DELETE /workers/{} answered {}: {}".format(entry["id"], status, body)}
    gone = wait_for(lambda: listed(base, url) == [], deadline)
    if not gone:
        return {"error": f"the router still lists {url} after its removal"}
    started, most = time.monotonic(), in_flight(url) or 0
    while True:
        count = in_flight(url)
        if not count:
            break
        most = max(most, count)
        if time.monotonic() >= deadline:
            return {"was_listed": bool(entries), "error": f"{count} requests still in flight on {url}"}
        time.sleep(POLL_S)
    return dict(before, was_listed=bool(entries), drained=most, drain_s=round(time.monotonic() - started, 3))


def add(config, deadline):
    base, url = config["router"], config["worker"]
    entries = listed(base, url)
    if entries is None:
        return {"error": f"the router at {base} did not list its workers (GET /workers)"}
    if not entries:
        status, body = request("POST", base + "/workers", {"url": url})
        if status not in (200, 201, 202):
            return {"error": f"POST /workers for {url} answered {status}: {body}"}
    healthy = wait_for(lambda: any(w.get("is_healthy") for w in listed(base, url) or []), deadline)
    if not healthy:
        return {"error": f"the router did not list {url} as a healthy worker: {listed(base, url)}"}
    return {"was_listed": bool(entries)}


def add_back(config, deadline):
    """`add`, then the router's counters once the worker is listed healthy."""
    answer = add(config, deadline)
    return answer if answer.get("error") else dict(counters(config), **answer)


def admit(config, deadline):
    base = config["router"]
    serving = [url for url in config["workers"] if request("GET", url.rstrip("/") + "/health")[0] == 200]

    def healthy(url):
        return any(w.get("is_healthy") for w in listed(base, url) or [])
    wait_for(lambda: all(healthy(url) for url in serving), min(deadline, time.monotonic() + float(config["settle_s"])))
    added = []
    for url in serving:
        if healthy(url):
            continue
        answer = add(dict(config, worker=url), deadline)
        if answer.get("error"):
            return answer
        added.append(url)
    return {"added": added, "not_serving": [url for url in config["workers"] if url not in serving]}


def workers(config, deadline):
    status, body = request("GET", config["router"] + "/workers")
    if status != 200 or not isinstance(body, dict):
        return {"error": f"GET /workers answered {status}: {body}"}
    return {"workers": [{"url": w.get("url"), "healthy": bool(w.get("is_healthy"))} for w in body.get("workers", [])]}


ACTIONS = {"ready": ready, "remove": remove, "add": add_back, "admit": admit, "list": workers}


def run_and_print(config_json):
    config = json.loads(config_json)
    started = time.monotonic()
    try:
        result = ACTIONS[config["action"]](config, started + float(config["deadline_s"]))
    except RouterDown:
        result = {"router_down": True}
    except Exception as unexpected:
        result = {"error": f"{type(unexpected).__name__}: {unexpected}"}
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    print(json.dumps(result))
