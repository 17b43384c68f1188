"""A real Hugging Face hub for each sandbox guest: olah serving local git repositories as hub repos.

olah (PyPI, pinned below) is a maintained implementation of the hub's HTTP API. With `mirrors-path` it serves the
git repositories under <mirrors>/models/ORG/NAME as the model repos ORG/NAME (olah 0.5.4: olah/mirror/repos.py,
olah/server_mirror.py), and with `offline = true` it never contacts huggingface.co. It listens on the host end of
the guest's veth (the guest's only route off its namespace), so `HF_ENDPOINT=http://<host_ip>:8090` in the guest
reaches it and nothing else; the inventory carries that as the host var `hf_endpoint`.

olah's mirror mode streams a file whole (a Range request gets the full body); huggingface_hub 1.x restarts an
unfinished file anyway, and finished files are never fetched again.

The stand-in repos hold what SGLang reads (config, tokenizer files, two small safetensors files); the sim only
checks that the snapshot is where SGLang would look.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from deploy_lib.errors import RemoteError
from sandbox import wheelhouse

OLAH_VERSION = "0.5.4"
HUB_PORT = 8090
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
# The reference profiles' models: a sandbox deploy of them stages these stand-ins.
STAND_IN_REPOS = ("lukealonso/GLM-5-NVFP4",)


def venv() -> Path:
    """olah in its own venv in the shared cache (its web stack stays out of the project's); built once."""
    path = wheelhouse.cache_root() / f"hub-venv-olah-{OLAH_VERSION}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "bin" / "olah-cli").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
            subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", f"olah=={OLAH_VERSION}"], check=True)
    return path


@dataclass(frozen=True)
class Hub:
    """One guest's hub: where it listens and where its repositories, cache and log live on this machine."""

    name: str
    host_ip: str
    port: int = HUB_PORT

    @property
    def endpoint(self) -> str:
        return f"http://{self.host_ip}:{self.port}"

    @property
    def directory(self) -> Path:
        return wheelhouse.cache_root() / "testhost" / "hub" / self.name

    @property
    def mirrors(self) -> Path:
        return self.directory / "mirrors"

    @property
    def pid_file(self) -> Path:
        return self.directory / "olah.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "olah.log"

    def repo_dir(self, repo_id: str) -> Path:
        org, name = repo_id.split("/", 1)
        return self.mirrors / "models" / org / name

    def config_text(self) -> str:
        return "\n".join([
            "[basic]", f'host = "{self.host_ip}"', f"port = {self.port}",
            f'repos-path = "{self.directory / "cache"}"', f'mirrors-path = ["{self.mirrors}"]',
            "metadata-cache-ttl = 0", "[accessibility]", "offline = true", ""])

    def running_pid(self) -> int | None:
        """The PID of this hub's olah, if it still runs (checked against its command line, not just the number)."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"olah-cli" in cmdline and str(self.directory).encode() in cmdline else None

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.endpoint}/api/whoami-v2", timeout=2)
        except urllib.error.HTTPError:
            return True  # any HTTP answer: the server is up
        except OSError:
            return False
        return True


def start(name: str, host_ip: str) -> Hub:
    """Start (or keep) the guest's hub with the stand-in repos; wait until it answers."""
    hub = Hub(name, host_ip)
    if hub.running_pid() is not None and hub.answers():
        return hub
    hub.directory.mkdir(parents=True, exist_ok=True)
    for repo_id in STAND_IN_REPOS:
        if not (hub.repo_dir(repo_id) / ".git").exists():
            commit(hub, repo_id, stand_in_files(repo_id), "stand-in weights")
    config = hub.directory / "olah.toml"
    config.write_text(hub.config_text())
    cli = venv() / "bin" / "olah-cli"
    with hub.log_file.open("ab") as log:
        process = subprocess.Popen([str(cli), "-c", str(config)], cwd=hub.directory, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    hub.pid_file.write_text(str(process.pid))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not hub.answers():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(hub)
            tail = hub.log_file.read_text(errors="replace")[-1500:]
            raise RemoteError(f"the sandbox hub (olah) for {name} did not come up on {hub.endpoint}", hint=tail)
        time.sleep(0.2)
    return hub


def stop(hub: Hub) -> None:
    """End this hub's olah by its PID (TERM, then KILL)."""
    pid = hub.running_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while hub.running_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if hub.running_pid() is not None:
            os.kill(pid, signal.SIGKILL)
    hub.pid_file.unlink(missing_ok=True)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=sandbox", "-c", "user.email=sandbox@localhost",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def commit(hub: Hub, repo_id: str, files: dict[str, bytes], message: str, tag: str | None = None,
           remove: tuple[str, ...] = ()) -> str:
    """Write files into the repo (creating it), commit, optionally tag; the new commit's hash."""
    repo = hub.repo_dir(repo_id)
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    for relpath, data in files.items():
        (repo / relpath).parent.mkdir(parents=True, exist_ok=True)
        (repo / relpath).write_bytes(data)
    for relpath in remove:
        (repo / relpath).unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    if tag is not None:
        _git(repo, "tag", "-f", tag)
    return _git(repo, "rev-parse", "HEAD")


def safetensors(name: str, values: int, seed: int = 0) -> bytes:
    """A valid safetensors file with one float32 tensor of `values` elements (deterministic bytes)."""
    header = json.dumps({name: {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}).encode()
    header += b" " * (-len(header) % 8)
    body = bytes((seed + i * 31) % 251 for i in range(min(values * 4, 4096))) * (values * 4 // 4096 + 1)
    return struct.pack("<Q", len(header)) + header + body[:values * 4]


def stand_in_files(repo_id: str, shard_values: tuple[int, ...] = (2048, 1024), seed: int = 0) -> dict[str, bytes]:
    """What SGLang reads from a checkpoint, small: config, tokenizer config, an index and one weight shard per
    value (two by default), named as transformers names shards: model-00001-of-00002.safetensors."""
    count = len(shard_values)
    shards = {f"model-{i + 1:05d}-of-{count:05d}.safetensors": safetensors(f"layer{i}.weight", values, seed + i)
              for i, values in enumerate(shard_values)}
    index = {"metadata": {"total_size": sum(len(data) for data in shards.values())},
             "weight_map": {f"layer{i}.weight": shard for i, shard in enumerate(shards)}}
    config = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "_name_or_path": repo_id}
    return {"config.json": json.dumps(config, indent=1).encode(),
            "tokenizer_config.json": json.dumps({"model_max_length": 4096}).encode(),
            "model.safetensors.index.json": json.dumps(index, indent=1).encode(), **shards,
            "README.md": b"Stand-in weights for the sandbox; not a model.\n"}
