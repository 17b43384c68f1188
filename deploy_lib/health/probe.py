"""Where and how one server is probed: the probe's one remote step (host_scripts/probe.py under the host's python),
and its JSON snapshot parsed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import ValidationError

from deploy_lib.errors import ReadinessFailed
from deploy_lib.facts.diagnose import unit_matches
from deploy_lib.health.snapshot import Rung, Snapshot
from deploy_lib.remote import Step, StepResult

# One probe waits on the host up to this long for a change: the server's newest log line shows at least this often.
WATCH_S = 2.0
# How often the waiting probe looks: a change is noticed within this (plus one look) of happening.
POLL_S = 0.05


@dataclass(frozen=True)
class GenerationProbe:
    """The one real request of the last rung; `path` is /generate (native) or /v1/completions (needs `model`)."""

    path: str = "/generate"
    prompt: str = "The capital of France is"
    # the prefill's token and one decode step's: the decode path (its CUDA graphs) runs, at one token's time (was 4,
    # three decode steps: 0.12 s more at the reference rig's 17 tok/s per request); SGLang's /health_generate asks 1
    max_new_tokens: int = 2
    timeout_s: float = 60.0
    model: str | None = None

    def body(self) -> dict[str, Any]:
        if self.path == "/generate":
            return {"text": self.prompt, "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0}}
        return {"model": self.model or "default", "prompt": self.prompt, "max_tokens": self.max_new_tokens,
                "temperature": 0}


@dataclass(frozen=True)
class ProbeTarget:
    """Where and how to probe one server. The API key is a secret value: kept out of repr and logs."""

    unit: str | None
    port: int
    host: str = "127.0.0.1"
    health_path: str | None = "/health"
    generation: GenerationProbe | None = field(default_factory=GenerationProbe)
    api_key: str | None = field(default=None, repr=False)
    python: str = "python3"
    connect_timeout_s: float = 0.5
    http_timeout_s: float = 5.0  # /health on SGLang < 0.5.20 runs a real 1-token generation

    @property
    def probe_host(self) -> str:
        return reachable_host(self.host)


# A server bound to every address: its own host reaches it on loopback, clients elsewhere at the host's address.
_ANY_ADDRESS_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def reachable_host(bind_host: str, host_address: str | None = None) -> str:
    """Where a server bound to `bind_host` is reached: a specific address as it is; an any-address bind on
    loopback from the host itself, or at `host_address` (the inventory's address) from elsewhere."""
    if bind_host not in _ANY_ADDRESS_LOOPBACK:
        return bind_host
    return host_address or _ANY_ADDRESS_LOOPBACK[bind_host]


def http_url(host: str, port: int | str) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


PROBE_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("probe.py").read_text(encoding="utf-8")


def probe_step(target: ProbeTarget, rung: Rung, after_cursor: str | None = None, seen: str | None = None,
               wait_s: float = 0.0, marks: Sequence[str] = ()) -> Step:
    """One remote step running the probe for every rung up to `rung`: one look, or with `wait_s` a look every
    POLL_S until the state differs from `seen` (the `state` of the caller's last snapshot). With `marks` (regexes:
    startup.MARKER_PATTERNS) it also sends back every journal line since `after_cursor` that matches one."""
    wants_generation = rung is Rung.GENERATE and target.generation is not None
    generation = target.generation if wants_generation else None
    config = {
        "unit": target.unit,
        "journal_matches": list(unit_matches(target.unit)) if target.unit else None,
        "journal_after_cursor": after_cursor,
        "journal_marks": list(marks) or None,
        "seen": seen,
        "wait_s": wait_s,
        "poll_s": POLL_S,
        "host": target.probe_host,
        "port": target.port,
        "connect_timeout_s": target.connect_timeout_s,
        "health_path": target.health_path if rung.position >= Rung.HEALTH.position else None,
        "http_timeout_s": target.http_timeout_s,
        "generate": None if generation is None else {
            "path": generation.path, "body": generation.body(), "timeout_s": generation.timeout_s,
            "api_key": target.api_key,
        },
    }
    stdin = f"{PROBE_SOURCE}\nrun_probe_and_print({json.dumps(config)!r})\n".encode()
    timeout_s = 15 + wait_s + target.http_timeout_s + (generation.timeout_s if generation else 0)
    # sudo: reading a system unit's journal needs root or the systemd-journal group. -I -S: the probe is standard
    # library only, so neither the environment nor site-packages' .pth files (43 ms of a 55 ms start measured on
    # the development machine's python3) are read on every look
    return Step(name=f"readiness probe ({rung})", argv=(target.python, "-I", "-S", "-"), sudo=True, stdin=stdin,
                timeout_s=timeout_s, secret=bool(generation and target.api_key), repeatable=True)


def parse_snapshot(result: StepResult, rung: Rung) -> Snapshot:
    """The probe's JSON line; anything else means the probe itself is broken, which waiting cannot fix."""
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    try:
        payload = json.loads(lines[-1])
        if "probe_error" in payload:
            raise ValueError(payload["probe_error"])
        return Snapshot.model_validate(payload)
    except (IndexError, ValueError, ValidationError) as exc:
        raise ReadinessFailed(f"the readiness probe printed no snapshot: {exc}", str(rung),
                              tuple(result.stdout.splitlines()[-5:] + result.stderr.splitlines()[-5:])) from exc
