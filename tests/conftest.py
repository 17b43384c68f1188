"""Setup for every test process (and each pytest-xdist worker)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.remote_ssh import SSHD, SshServer, free_port, keygen

from deploy_cli import common
from deploy_lib.host_scripts.sglang_options import extract

INVENTORY = Path(__file__).resolve().parent.parent / "inventory"


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a shell (CI scripts, `make test &`) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: the Ctrl-C tests, and the children they start, need the default.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The checkout tracks no user's hosts (inventory/hosts.yaml is the user's own, as `sglang-deploy init` writes
    # it); the tests read the reference rig through the default inventory, as a user's project would hold it.
    if not (INVENTORY / "hosts.yaml").exists():  # copied whole, then renamed: a worker never reads half of it
        partial = INVENTORY / f".hosts.yaml.{os.getpid()}"
        shutil.copyfile(INVENTORY / "hosts.example.yaml", partial)
        os.replace(partial, INVENTORY / "hosts.yaml")


# Fixtures of several test modules


@pytest.fixture(autouse=True)
def project_found_per_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The command line finds its project once per process (deploy_cli.common.project), and `--project` and
    `--inventory` set SGLANG_DEPLOY_*: a test that ran one in a project of its own leaves neither to the next."""
    for name in ("SGLANG_DEPLOY_INVENTORY", "SGLANG_DEPLOY_PROJECT"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored (or removed again) when the test ends
        if not os.environ[name]:
            monkeypatch.delenv(name)
    common.project.cache_clear()
    yield
    common.project.cache_clear()

@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """OpenSSH's sshd on loopback for the module, with keys of its own."""
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("needs OpenSSH's sshd and ssh-keygen: apt-get install -y openssh-server")
    workdir = tmp_path_factory.mktemp("sshd")
    keygen(workdir / "host_ed25519")
    keygen(workdir / "client_ed25519")
    (workdir / "authorized_keys").write_text((workdir / "client_ed25519.pub").read_text())
    (workdir / "authorized_keys").chmod(0o600)
    sftp_server = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server")
                        if os.path.exists(p)), "internal-sftp")
    config = workdir / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", f"HostKey {workdir / 'host_ed25519'}",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}", "PidFile none", "UsePAM no", "StrictModes no",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        f"Subsystem sftp {sftp_server}", "LogLevel ERROR", ""]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    port = free_port()
    log = (workdir / "sshd.log").open("wb")
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config), "-p", str(port)], stdout=log, stderr=log)
    try:
        for _ in range(100):
            if server.poll() is not None:
                pytest.fail(f"sshd exited: {(workdir / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield SshServer(port, workdir / "host_ed25519.pub", workdir / "client_ed25519", workdir)
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def options(sglang_source: Callable[[str], Path]) -> Callable[[str], dict[str, Any]]:
    """SGLang's server options of a version, read from its wheel (the module registers helpers.wheelcache)."""
    cache: dict[str, dict[str, Any]] = {}

    def get(version: str) -> dict[str, Any]:
        cache.setdefault(version, extract(sglang_source(version))["options"])
        return cache[version]
    return get
