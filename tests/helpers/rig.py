"""The deploy rig the sandbox test modules share: the module's guest, a throw-away project (the repo's profiles plus
the module's own) with an inventory naming the guest, and what tests do to a service there through the deploy
engine: deploy, roll back, read the store, arm the simulator's faults.

    @pytest.fixture(scope="module")
    def rig(sandbox_venv, tmp_path_factory) -> Rig:
        return Rig.on(sandbox_venv, tmp_path_factory, PROFILES)

    @pytest.fixture
    def healthy(rig) -> str:
        return rig.healthy_release(FAULT_OF_HANG)   # the reference profile serving, no fault armed
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

import pytest

from deploy_lib.commands import deploy as engine
from deploy_lib.commands.status import StatusReport, read_status
from deploy_lib.deploy.project import Project, load_for_host
from deploy_lib.remote import FabricRemote
from helpers.json_doc import envelope, result
from helpers.projects import REPO, project_for_guest
from helpers.recording_progress import RecordingProgress
from helpers.waits import STATE_WAIT_S
from sandbox import manage

REFERENCE = "glm5-nvfp4"
# Test profiles on top of the reference one: a second healthy release, and one with a short deadline that reads
# its own fault file (SGLANG_SIM_FAULT), so a fault breaks only its release and not the rollback target.
FAULT_OF_SHORT = "/etc/sglang-sim/fault-short"  # read by releases of glm5-short and glm5-faulty
GUEST_FAULT = "/etc/sglang-sim/fault"  # read by every release on the guest
FAULT_OF_CRASHY = "/etc/sglang-sim/fault-crashy"
TEST_PROFILES = {
    "glm5-omp4": f"extends: {REFERENCE}\nenv:\n  OMP_NUM_THREADS: '4'\n",
    # other flags and environment, the reference's unit settings; and another unit setting
    "glm5-nometrics-omp4": f"extends: {REFERENCE}\nfeatures:\n  metrics: false\nenv:\n  OMP_NUM_THREADS: '4'\n",
    "glm5-slow-stop": f"extends: {REFERENCE}\nservice:\n  stop_timeout_s: 77\n",
    # the deadline is what a hang test waits out; a start on a busy machine can take longer, so only tests whose
    # release must not become ready use it
    "glm5-short": (f"extends: {REFERENCE}\nenv:\n  SGLANG_SIM_FAULT: {FAULT_OF_SHORT}\n"
                   "service:\n  startup_timeout_s: 8\n"),
    # the same fault file, the reference's deadline: for faults that must show (an OOM while loading, a death
    # after the first request) however long this machine takes to start a server
    "glm5-faulty": f"extends: {REFERENCE}\nenv:\n  SGLANG_SIM_FAULT: {FAULT_OF_SHORT}\n",
    "glm5-unknown-flag": f"extends: {REFERENCE}\nextra_args: ['--no-such-flag']\n",
    # restarted by systemd one second after a crash (the default waits 10 s); 3 restarts per 15 min, the default
    "glm5-crashy": f"extends: {REFERENCE}\nenv:\n  SGLANG_SIM_FAULT: {FAULT_OF_CRASHY}\nservice:\n  restart_sec: 1\n",
}
WAIT_READY = "until curl -sf -o /dev/null http://127.0.0.1:8000/ready; do sleep 0.2; done"
WAIT_HEALTHY = "until curl -sf -o /dev/null http://127.0.0.1:8000/health; do sleep 0.2; done"
GENERATE_UNTIL_REFUSED = (
    "while curl -sf -o /dev/null -H Content-Type:application/json "
    "-d '{\"text\": \"hi\", \"sampling_params\": {\"max_new_tokens\": 4}}' http://127.0.0.1:8000/generate; "
    "do :; done")


@dataclass
class Rig:
    guest: manage.Guest
    project: Project
    inventory: str
    service: str = "sglang"
    profile: str = REFERENCE  # the service's healthy profile: what connect/rollback/status load

    @classmethod
    def on(cls, guest: manage.Guest, tmp_path_factory: pytest.TempPathFactory,
           profiles: Mapping[str, str] = TEST_PROFILES, service: str = "sglang", profile: str = REFERENCE) -> Self:
        project, inventory = project_for_guest(tmp_path_factory.mktemp("project"), guest, profiles)
        return cls(guest, project, inventory, service, profile)

    @property
    def store(self) -> str:
        return f"/opt/sglang-deploy/{self.service}"

    # --- through the deploy engine ----------------------------------------------------------------------
    def target(self, profile: str | None = None) -> Any:
        """(loaded profile, target) of a profile on the guest."""
        return load_for_host(self.project, profile or self.profile, self.inventory, None)

    @contextmanager
    def connect(self, profile: str | None = None) -> Iterator[tuple[Any, FabricRemote]]:
        """The profile's target and a connection to it."""
        _, target = self.target(profile)
        with FabricRemote(target.ssh) as remote:
            yield target, remote

    def deploy(self, profile: str, progress: RecordingProgress | None = None, patched: engine.PatchedVenv | None = None,
               **options: object) -> engine.Outcome:
        loaded, target = self.target(profile)
        with FabricRemote(target.ssh) as remote:
            return engine.deploy(loaded, target, remote, progress or RecordingProgress(), engine.Options(**options),
                                 patched=patched)

    def rollback(self, to: str | None = None) -> engine.Outcome:
        with self.connect() as (target, remote):
            return engine.rollback(target, self.service, remote, RecordingProgress(), to, {})

    def status(self) -> StatusReport:
        with self.connect() as (target, remote):
            return read_status(target, self.service, remote)

    def healthy_release(self, *fault_paths: str) -> str:
        """The rig's profile deployed and serving with no fault armed (glm5-short's, the guest's and these); its
        release id (the deploy is a no-op when it already serves)."""
        for path in (FAULT_OF_SHORT, GUEST_FAULT, *fault_paths):
            self.fault(None, path)
        return self.deploy(self.profile).release_id

    # --- through the command line ----------------------------------------------------------------------
    def invoke(self, *argv: str) -> Any:
        """`invoke ARGV --json` run from the rig's project against the guest (its inventory and host): the host's
        result in the JSON document on stdout (checked against deploy_cli/envelope.py's shape); a non-zero exit fails
        the test with what the command said on stderr."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEPLOY_")}
        ran = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *argv, "--inventory",
                              self.inventory, "--host", self.guest.name, "--json"], cwd=self.project.root,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, env=environ, timeout=1800)
        assert ran.returncode == 0, f"invoke {' '.join(argv)}: exit {ran.returncode}\n{ran.stderr[-4000:]}"
        return result(envelope(ran.stdout, ran.returncode))

    # --- on the guest, as root --------------------------------------------------------------------------
    def root(self, command: str) -> str:
        return manage.run_on(self.guest, command, user="root")

    def current(self) -> str:
        return self.root(f"readlink {self.store}/current").strip().removeprefix("releases/")

    def history(self) -> list[dict[str, object]]:
        text = self.root(f"cat {self.store}/history.jsonl 2>/dev/null || true")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def release_dirs(self) -> set[str]:
        return set(self.root(f"ls {self.store}/releases 2>/dev/null || true").split())

    def write(self, path: str, text: str) -> None:
        """`text` into `path` as root, its directory made if missing."""
        manage.put_text(self.guest, path, text)

    def fault(self, text: str | None, path: str = FAULT_OF_SHORT) -> None:
        """Arm a sim fault (None: disarm it); by default only for releases of glm5-short, everywhere with
        GUEST_FAULT."""
        manage.put_text(self.guest, path, text)

    def unit_state(self, service: str | None = None) -> str:
        return self.root(f"systemctl is-active {service or self.service}.service || true").strip()

    def main_pid(self, service: str | None = None) -> str:
        return self.root(f"systemctl show -p MainPID --value {service or self.service}.service").strip()

    def wait_ready(self) -> None:
        self.root(f"timeout {STATE_WAIT_S} bash -c {shlex.quote(WAIT_READY)}")

    def wait_healthy(self) -> None:
        """Port 8000 answers /health (a server started by hand, outside the tool)."""
        self.root(f"timeout {STATE_WAIT_S} bash -c {shlex.quote(WAIT_HEALTHY)}")

    def serve_until_crash(self) -> None:
        """Wait for the server to be ready, send generations until it dies, wait for systemd to notice."""
        unit = f"{self.service}.service"
        before = self.root(f"systemctl show -p NRestarts --value {unit}").strip()
        self.wait_ready()
        self.root(f"timeout {STATE_WAIT_S} bash -c {shlex.quote(GENERATE_UNTIL_REFUSED)}")
        self.root(f"timeout {STATE_WAIT_S} bash -c " + shlex.quote(
            f"until systemctl is-failed -q {unit} || [ \"$(systemctl show -p NRestarts --value {unit})\" != "
            f"{before} ] || [ \"$(systemctl show -p SubState --value {unit})\" = auto-restart ]; do sleep 0.2; done"))

    def crashy_release(self) -> str:
        """glm5-crashy deployed healthy with `die-after 2` armed: the ladder's generation is its first request, so
        the server dies after the next one a user sends (and so does each restart of it, after its second)."""
        self.fault("die-after 2", FAULT_OF_CRASHY)
        outcome = self.deploy("glm5-crashy")
        assert outcome.action == "deployed" and self.unit_state() == "active"
        return outcome.release_id

    @contextmanager
    def hand_written_unit(self, service: str, unit: str) -> Iterator[None]:
        """`service` from a unit written by hand (port 8000: the rig's own service is stopped first), started and
        serving; removed with the store the tool made for it afterwards."""
        self.root(f"systemctl stop {self.service}.service 2>/dev/null || true")
        manage.put_text(self.guest, f"/etc/systemd/system/{service}.service", unit)
        self.root(f"systemctl daemon-reload && systemctl start {service}.service")
        try:
            self.wait_healthy()
            yield
        finally:
            self.remove_service(service)

    def remove_service(self, service: str) -> None:
        """A service gone from the guest: stopped, its unit and its store removed."""
        self.root(f"systemctl stop {service}.service 2>/dev/null; rm -f /etc/systemd/system/{service}.service; "
                  f"rm -rf /opt/sglang-deploy/{service}; systemctl daemon-reload")
