"""Replicas behind SGLang's own router (the `sglang-router` wheel): where it runs, what its release is, and taking a
replica out of it and back during a rolling deploy.

The inventory chooses the router's host (host var `router`, usually set on the group) and its port; the router
runs there as its own systemd unit (`sglang-router.service`) and release, in its own store beside the server's,
from a venv built from a hashed lock of sglang-router and its dependencies. The replicas' URLs are rendered from
the group's hosts and each host's profile port. During a deploy of a replica, `RouterMembership` removes the
replica from the router through the router's worker-management API before the server stops (and waits for its
requests in flight to finish), and adds it back once the host serves a verified release again. The API calls run
on the router's host (deploy_lib/host_scripts/router.py), so the router's port need not be reachable from here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from deploy_lib.bundled import TEMPLATES_DIR
from deploy_lib.deploy.project import Project, Target, load_for_target
from deploy_lib.errors import ConfigError, RouterFailed
from deploy_lib.health import ProbeTarget
from deploy_lib.inventory.model import Host, Inventory, RouterPolicy
from deploy_lib.metrics.router_counters import (
    COUNTED,
    ROUTER_METRICS_PORT,
    ClientsSaw,
    RouterCounters,
    clients_saw,
    parse_counters,
)
from deploy_lib.profile import RestartPolicy, read_stored_profile
from deploy_lib.progress import Progress
from deploy_lib.release.render import EnvSpec, UnitSpec, render_env, render_unit
from deploy_lib.remote import Remote, Step, StepResult
from deploy_lib.remote.readings import ABSENT_OK
from deploy_lib.store import RELEASE_FILE, StoreLayout

SERVICE = "sglang-router"
# the sglang-router the bundled lock pins; its /workers API is what host_scripts/router.py calls
ROUTER_VERSION = "0.3.2"
DEFAULT_LOCK = TEMPLATES_DIR / "sglang-router.lock"
SCRIPT_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("router.py").read_text(encoding="utf-8")
MEMBERSHIP_DEADLINE_S = 300.0  # removal + drain of a replica, or its registration, before the rollout gives up
READY_DEADLINE_S = 120.0       # a restarted router answering /health
# a started router answers /health before it has registered every one of its --worker-urls (sglang-router 0.3.2
# queues their registration); a serving worker it has not listed by then is registered by the tool
ADMIT_SETTLE_S = 30.0


def worker_url(host: Host, port: int) -> str:
    """The URL the router reaches a replica at: the host's inventory address and its server's port."""
    address = host.address
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


@dataclass(frozen=True)
class RouterSite:
    """Where a group's router runs and how: the inventory host, its port and policy, and its venv's sources."""

    host: Host
    port: int
    policy: RouterPolicy
    lock: Path
    wheelhouse: Path | None
    index: str | None

    @property
    def base_url(self) -> str:
        """The router as the script on its own host reaches it."""
        return f"http://127.0.0.1:{self.port}"


def router_site(inventory: Inventory, hosts: Sequence[Host]) -> RouterSite | None:
    """The router in front of these hosts, from their `router` var; None when none names one. One router per
    group: hosts that name different routers, ports or policies are refused."""
    named = {(h.vars.router, h.vars.router_port, h.vars.router_policy, h.vars.router_lock, h.vars.router_wheelhouse,
              h.vars.router_index) for h in hosts if h.vars.router is not None}
    if not named:
        return None
    if len(named) > 1 or any(h.vars.router is None for h in hosts):
        described = ", ".join(f"{h.name}: {h.vars.router or 'none'}" for h in hosts)
        raise ConfigError(f"{inventory.path}: the hosts name different routers ({described})",
                          "set `router` (and router_port, router_policy) once, on the group")
    name, port, policy, lock, wheelhouse, index = named.pop()
    if wheelhouse and index:
        raise ConfigError(f"{inventory.path}: router_wheelhouse and router_index are both set",
                          "give one: a local directory of wheels, or an index the router host downloads from")
    if name not in inventory.hosts:
        raise ConfigError(f"{inventory.path}: router host {name!r} is not in the inventory",
                          f"hosts: {', '.join(sorted(inventory.hosts))}")
    base = inventory.path.parent
    return RouterSite(inventory.hosts[name], port, policy, base / lock if lock else DEFAULT_LOCK,
                      base / wheelhouse if wheelhouse else None,
                      index if index or wheelhouse else "https://pypi.org/simple")


def replica_urls(project: Project, profile: str | None, inventory: Inventory, targets: Sequence[Target]) -> list[str]:
    """The group's servers as the router reaches them: each host's address and its profile's port. A server behind
    an API key is refused: the router registers a worker by reading its /server_info and /model_info, which SGLang
    guards with the key, and its --worker-urls carry none (docs/router.md)."""
    urls = []
    for target in targets:
        loaded = load_for_target(project, profile, inventory, target)
        if loaded.profile.server.api_key is not None:
            raise ConfigError(f"{loaded.path}: server.api_key is set: the router in front of {target.host.name} "
                              "cannot register a server that needs a key",
                              "serve the replicas without server.api_key behind the router (its own --api-key for "
                              "clients is not set by this tool either)")
        urls.append(worker_url(target.host, loaded.profile.server.port))
    return urls


# ---------------------------------------------------------------------------------------------------------------
# Talking to the router (one step on the router's host per action)


def router_step(site: RouterSite, action: str, worker: str | None = None,
                deadline_s: float = MEMBERSHIP_DEADLINE_S, workers: Sequence[str] = ()) -> Step:
    config = {"action": action, "router": site.base_url, "worker": worker, "deadline_s": deadline_s,
              "workers": list(workers), "settle_s": ADMIT_SETTLE_S, "counted": list(COUNTED),
              "metrics": f"http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics"}
    stdin = f"{SCRIPT_SOURCE}\nrun_and_print({json.dumps(config)!r})\n".encode()
    return Step(f"router: {action}{f' {worker}' if worker else ''}", ("python3", "-"), stdin=stdin,
                timeout_s=deadline_s + 30)


def parse_answer(result: StepResult, site: RouterSite, what: str) -> dict[str, Any]:
    """The script's JSON object; RouterFailed naming the router and what was asked when it reports an error."""
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": f"no answer from the router script: {result.stderr.strip()[-300:] or 'no output'}"}
    if answer.get("error"):
        raise RouterFailed(f"router on {site.host.name}: {what}: {answer['error']}",
                           hint=f"`invoke router.status` shows the router's workers; its journal: "
                                f"`invoke logs -H {site.host.name} -s {SERVICE}`")
    return dict(answer)


def serving_step(layout: StoreLayout) -> Step:
    """The record of the release the replica serves now (`current`), for the port the router reaches it at."""
    return Step("router: serving release", ("cat", "--", str(layout.current / RELEASE_FILE)), ok=ABSENT_OK)


def serving_url(host: Host, result: StepResult) -> str | None:
    """The URL the router reaches the replica's current release at (its recorded profile's port); None when no
    release is current. A record that cannot be read gives the default port, as a rollback reads it."""
    if result.exit_code != 0:
        return None
    try:
        metadata = json.loads(result.stdout)
    except ValueError:
        metadata = None
    recorded = metadata.get("profile") if isinstance(metadata, dict) else None
    return worker_url(host, read_stored_profile(recorded).server.port)


@dataclass
class RouterMembership:
    """One replica's place in the router while its server restarts. Before the server stops, the URL the router
    reaches the release serving NOW is taken out (and its requests in flight drained); once the host serves a
    verified release again, that release's URL is added back: a deploy or rollback that changes the server's port
    takes out the old URL and adds the new one. The deploy calls `before_restart` (only the first call acts); the
    caller calls `readmit` after."""

    site: RouterSite
    router: Callable[[], Remote]           # the router's host, connected on first use
    serving: Callable[[], str | None]      # the replica's current release's URL, read from its host
    progress: Progress
    restarted: bool = False
    taken_out: str | None = None           # the URL removed from the router
    router_down: bool = False
    counters_before: RouterCounters | str | None = None  # the router's counters just before the removal
    clients: ClientsSaw | None = None      # what the router's clients saw from the removal to the add back

    def _ask(self, action: str, worker: str, what: str) -> dict[str, Any]:
        name = f"router: {'drain' if action == 'remove' else 'add back'}"
        self.progress.phase_started(name)
        answer = parse_answer(self.router().run([router_step(self.site, action, worker)])[0], self.site, what)
        self.progress.step_done(name, float(answer.get("elapsed_s", 0)))
        self.router_down = bool(answer.get("router_down"))
        return answer

    def before_restart(self) -> None:
        if self.restarted:
            return
        self.restarted = True
        worker = self.serving()
        if worker is None:
            self.progress.note("router: no release is current here, so no request reaches it: nothing to drain")
            return
        answer = self._ask("remove", worker, f"taking {worker} out")
        if self.router_down:
            self.progress.note(f"router: nothing listens on {self.site.host.name}:{self.site.port}, so no request "
                               f"goes to {worker} through it; its server stops without a drain")
            return
        self.taken_out = worker
        self.counters_before = _counters(answer)
        if answer.get("drained"):
            drained = answer["drained"]
            self.progress.note(f"router: {drained} request{'s' if drained != 1 else ''} in flight on {worker} "
                               "finished first")

    def readmit(self) -> None:
        if not self.restarted or self.router_down:
            return
        worker = self.serving()
        if worker is None:  # a verified release is current: unreachable unless the host changed under us
            return
        answer = self._ask("add", worker, f"adding {worker} back")
        if self.counters_before is not None and not self.router_down:
            seen = clients_saw(self.counters_before, _counters(answer))
            self.clients = None if isinstance(seen, str) else seen
            self.progress.note(seen.line(worker) if isinstance(seen, ClientsSaw) else
                               f"router: what its clients saw while {worker} was out is not known ({seen})")
        if self.router_down:
            self.progress.note(f"router: nothing listens on {self.site.host.name}:{self.site.port} now; it lists "
                               f"{worker} when it starts only if its --worker-urls name it (`invoke router.deploy`)")
        elif self.taken_out is not None and worker != self.taken_out:
            self.progress.note(f"router: the server moved from {self.taken_out} to {worker}; the router routes to "
                               f"the new URL, but its own release still names {self.taken_out} (--worker-urls) "
                               "until `invoke router.deploy` for the group renders it again")
        self.taken_out = None


def _counters(answer: Mapping[str, Any]) -> RouterCounters | str:
    """The router's counters the script read with its answer, or why it could not."""
    if "metrics" not in answer:
        return f"its metrics were not read: {answer.get('metrics_error', 'no answer')}"
    return parse_counters(str(answer["metrics"]))


def router_probe(layout: StoreLayout, metadata: Mapping[str, Any]) -> ProbeTarget:
    """The router release's readiness probe, on the router's host: its unit running, its port open and /health
    answering 200 (sglang_router's liveness route); no generation rung, the router serves none of its own."""
    port = int(dict(metadata.get("router") or {}).get("port") or 0)
    return ProbeTarget(unit=layout.unit_name, port=port, health_path="/health", generation=None)


def admit_workers(remote: Remote, site: RouterSite, workers: Sequence[str], progress: Progress) -> tuple[str, ...]:
    """Once the router answers, every one of `workers` that serves is listed healthy by it (registered by the tool
    when the router's own start-up registration has not listed it within ADMIT_SETTLE_S); the workers that do not
    answer their /health, each said in a note. RouterFailed when the router does not take a serving worker."""
    progress.phase_started("router: workers")
    answer = parse_answer(remote.run([router_step(site, "admit", workers=workers)])[0], site, "listing its workers")
    if answer.get("router_down"):
        raise RouterFailed(f"router on {site.host.name}: it stopped answering on port {site.port} after it started",
                           hint=f"its journal: `invoke logs -H {site.host.name} -s {SERVICE}`")
    progress.step_done("router: workers", float(answer.get("elapsed_s", 0)))
    for url in answer["added"]:
        progress.note(f"router: it had not listed {url} {ADMIT_SETTLE_S:.0f} s after it started; added it "
                      "(POST /workers)")
    for url in answer["not_serving"]:
        progress.note(f"router: {url} does not answer /health; a deploy or `invoke start` of its host adds it to "
                      "the router once it serves")
    return tuple(answer["not_serving"])


def router_workers(remote: Remote, site: RouterSite) -> list[dict[str, Any]]:
    answer = parse_answer(remote.run([router_step(site, "list", deadline_s=10)])[0], site, "listing its workers")
    return list(answer["workers"])


# ---------------------------------------------------------------------------------------------------------------
# The router's release


@dataclass(frozen=True)
class RouterRelease:
    id: str
    unit_text: str
    env_text: str
    metadata: Mapping[str, Any]


def router_argv(python: PurePosixPath, site: RouterSite, workers: Sequence[str]) -> tuple[str, ...]:
    """sglang_router.launch_router's command line (its argparse in sglang_router/router_args.py, 0.3.2)."""
    return (str(python), "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(site.port),
            "--policy", site.policy.value, "--worker-urls", *workers)


ROUTER_STOP_TIMEOUT_S = 60  # the router's TimeoutStopSec=


def build_router_release(site: RouterSite, venv: PurePosixPath, venv_hash: str, workers: Sequence[str],
                         env_file: Callable[[str], PurePosixPath], group: str) -> RouterRelease:
    """The unit, env file and metadata of the router serving these workers; the id is their digest, so the same
    workers, port, policy and venv make the same release."""
    argv = router_argv(venv / "bin" / "python3", site, workers)
    env_text = render_env(EnvSpec({"PYTHONUNBUFFERED": "1"}))
    release_id = hashlib.sha256(json.dumps([argv, env_text, venv_hash, group]).encode()).hexdigest()[:12]
    unit_text = render_unit(UnitSpec(
        description=f"SGLang router (sglang-router) for group {group}", user="nobody", group="nogroup",
        working_directory="/", environment_file=str(env_file(release_id)), exec_argv=argv, timeout_start_s=120,
        timeout_stop_s=ROUTER_STOP_TIMEOUT_S, restart=RestartPolicy.on_failure, restart_sec=2, start_limit_burst=5,
        start_limit_interval_s=300, limit_nofile=65536, syslog_identifier=SERVICE))
    metadata = {"kind": "router", "profile_name": SERVICE, "router": {"version": ROUTER_VERSION, "port": site.port,
                "policy": site.policy.value, "workers": list(workers), "group": group}, "venv": str(venv),
                "venv_hash": venv_hash}
    return RouterRelease(release_id, unit_text, env_text, metadata)


__all__ = ["ADMIT_SETTLE_S", "DEFAULT_LOCK", "ROUTER_VERSION", "SERVICE", "RouterMembership", "RouterRelease",
           "RouterSite", "admit_workers", "build_router_release", "parse_answer", "replica_urls", "router_argv",
           "router_probe", "router_site", "router_step", "router_workers", "serving_step", "serving_url",
           "worker_url"]
