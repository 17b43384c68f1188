"""The command line against a sandbox guest, as a user types it: the checkout's quick start (docs/getting-started.md,
"From a checkout of the tool") followed line by line,
then --json, -v, defaults taken from the host's current release, and a plan without secret values."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers.json_doc import envelope, result
from helpers.waits import STATE_WAIT_S

from sandbox import manage

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
GETTING_STARTED = (REPO / "docs" / "getting-started.md").read_text()
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def quick_start_lines() -> list[str]:
    """The checkout's quick start, its shell block, one command per line (a heredoc kept whole)."""
    section = GETTING_STARTED.split("## From a checkout of the tool", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands, heredoc = [], None
    for line in block.splitlines():
        if heredoc is not None:
            heredoc.append(line)
            if line == heredoc[0].rsplit("<<'", 1)[1].rstrip("'"):
                commands.append("\n".join(heredoc))
                heredoc = None
        elif "<<'" in line:
            heredoc = [line]
        elif line.strip():
            commands.append(line)
    return commands


@dataclass
class User:
    """A checkout of the project (its own inventory/ and profiles), the guest, and a shell in the checkout."""

    checkout: Path
    guest: manage.Guest

    def sh(self, command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")}
        environ["PATH"] = f"{Path(sys.executable).parent}:{environ['PATH']}"  # the activated venv of `make install`
        return subprocess.run(["bash", "-c", command], cwd=self.checkout, capture_output=True, text=True,
                              env=environ | (env or {}), timeout=600)

    def typed(self, command: str) -> subprocess.CompletedProcess[str]:
        """At a terminal, as a user types it, answering `y` when asked (`script` gives the command a pty); the
        terminal's colours are taken out of what it printed."""
        done = self.sh(f"echo y | script -qec {shlex.quote(command)} /dev/null")
        return subprocess.CompletedProcess(done.args, done.returncode, ANSI.sub("", done.stdout), done.stderr)

    def invoke(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.sh(shlex.join(["invoke", *argv]), env)

    def beside_gpu1(self, name: str, text: str) -> None:
        """A profile file outside inventory/profiles/ that extends a copy of gpu1 beside it (given by path)."""
        shutil.copy(self.checkout / "inventory" / "profiles" / "gpu1.yaml", self.checkout / "gpu1.yaml")
        (self.checkout / f"{name}.yaml").write_text("extends: gpu1\n" + text)

    def root(self, command: str) -> str:
        return manage.run_on(self.guest, command, user="root")

    def start_by_hand(self) -> int:
        """The reference user's server: from /root, venv on PATH, nohup, in the background; its PID once healthy."""
        pid = int(self.root(f"cd /root; env -i {HAND_ENV} nohup python -m sglang.launch_server {HAND_ARGS} "
                            "</dev/null >/root/sglang-hand.log 2>&1 & echo $!").strip())
        self.root(f"timeout {STATE_WAIT_S} sh -c "
                  "'until curl -sf -o /dev/null http://127.0.0.1:8000/health; do sleep 0.5; done'")
        return pid


# Other test modules share the guest: the quick start begins on a host without the tool's service.
FRESH_HOST = ("systemctl stop sglang.service 2>/dev/null; rm -f /etc/systemd/system/sglang.service; "
              "systemctl daemon-reload; rm -rf /opt/sglang-deploy/sglang")
HAND_ARGS = ("--model-path lukealonso/GLM-5-NVFP4 --served-model-name glm-5 --trust-remote-code --tp-size 8 "
             "--quantization modelopt_fp4 --host 0.0.0.0 --port 8000")
HAND_ENV = "HOME=/root PATH=/opt/ml-env/bin:/usr/local/bin:/usr/bin:/bin VIRTUAL_ENV=/opt/ml-env PYTHONUNBUFFERED=1"


@pytest.fixture(scope="module")
def user(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    checkout = tmp_path_factory.mktemp("checkout")
    shutil.copy(REPO / "tasks.py", checkout / "tasks.py")
    (checkout / "sandbox").symlink_to(REPO / "sandbox")  # tasks.py mounts the sandbox tasks
    shutil.copytree(REPO / "inventory", checkout / "inventory")
    yield User(checkout, sandbox_venv)


def test_the_quick_start_as_written_deploys_to_a_fresh_host(user: User) -> None:
    """Every line of the checkout's quick start, in order. What a real host has and the guest has not is stated
    here: the guest's address, key and known_hosts replace the example's, its venv is /opt/ml-env, and it reaches
    no hub but the sandbox's own (hf_endpoint)."""
    guest = user.guest
    user.root(FRESH_HOST)
    ran = []
    for command in quick_start_lines():
        if command.startswith("make install"):
            continue  # this test runs inside the installed venv
        if command.startswith("invoke adopt"):
            if "adopt" in user.invoke("--list").stdout.split():
                command = command.replace("--pid 4242", f"--pid {user.start_by_hand()}")
            else:  # before `adopt` exists: the page's alternative, then its edit (the guest's venv)
                user.sh("cp inventory/profiles/glm5-nvfp4.yaml inventory/profiles/gpu1.yaml")
                profile = user.checkout / "inventory" / "profiles" / "gpu1.yaml"
                profile.write_text(profile.read_text().replace("venv: /root/ml-env", "venv: /opt/ml-env"))
                continue
        if command.startswith("cat > inventory/hosts.yaml"):
            command = command.replace("ansible_host: 192.0.2.10", f"ansible_host: {guest.guest_ip}").replace(
                "gpu_count: 8}", f"gpu_count: 8, ansible_ssh_private_key_file: {guest.key}, "
                                 f"known_hosts_file: {guest.known_hosts}, hf_endpoint: {guest.hub.endpoint}}}")
        command = command.split("  #", 1)[0].rstrip()
        if command.startswith("invoke plan") and "--accept-new-host-key" not in command:
            command += " --accept-new-host-key"  # the page: the first command that connects takes it
        result = user.typed(command)
        ran.append(command)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        if command.startswith("invoke render"):
            assert "--tp-size 8" in result.stdout
        if command.startswith("invoke plan") and "invoke adopt" not in " ".join(ran):
            assert "+ flag --tp-size = 8" in result.stdout  # a first deploy; after adopt, release 0 has it too
        if command.startswith("invoke deploy"):
            assert re.search(r"deployed: release \w{12} is serving", result.stdout)
        if command == "invoke status":
            assert "unit active/running" in result.stdout and "(gpu1)" in result.stdout
            # read by the venv's python: /opt/ml-env is the adopted hand-made venv, with no marker of the tool's
            assert "installed: sglang 0.5.23, flashinfer-python 0.7.2\n" in result.stdout
    assert ran[-3:] == ["invoke plan --profile gpu1 --accept-new-host-key", "invoke deploy --profile gpu1",
                        "invoke status"]
    assert yaml.safe_load((user.checkout / "inventory" / "hosts.yaml").read_text())["all"]["hosts"]["gpu1"]


def test_status_releases_and_venv_list_as_json(user: User) -> None:
    status = user.invoke("status", "--json")
    report = result(envelope(status.stdout, status.returncode))  # one host's result in the one document's shape
    assert status.returncode == 0 and report["unit_state"] == "active/running"
    assert report["current"] == report["metadata"]["id"] and len(report["gpus"]) == 8
    rows = result(envelope(user.invoke("releases", "--json").stdout))
    assert [row["id"] for row in rows if row["is_current"]] == [report["current"]]
    venvs = user.invoke("venv.list", "--json")
    assert venvs.returncode == 0 and isinstance(result(envelope(venvs.stdout)), list)


def test_verbose_shows_the_remote_steps_on_stderr(user: User) -> None:
    shown = user.invoke("status", "-v")
    assert shown.returncode == 0
    assert re.search(r"^  \$ .*systemctl show .*\(exit 0, [\d.]+ s\)$", shown.stderr, re.MULTILINE)
    assert "ActiveState=active" in shown.stderr


def test_patch_tasks_default_to_the_profile_of_the_hosts_current_release(user: User) -> None:
    """Input tried: `patches.check fusion-sm120` with no --profile (it used glm5-nvfp4 whatever ran)."""
    checked = user.invoke("patches.check", "--name", "fusion-sm120")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("fusion-sm120: ") and "0.5.23" in checked.stdout.splitlines()[0]


def test_a_plan_needs_no_secret_value(user: User) -> None:
    """Input tried: a profile with secrets.HF_TOKEN, planned with HF_TOKEN unset (plan exited 2)."""
    user.beside_gpu1("gpu1-token", "secrets: {HF_TOKEN: {env: HF_TOKEN}}\n")
    planned = user.invoke("plan", "--profile", "gpu1-token.yaml")
    assert planned.returncode == 0, planned.stderr
    assert ("  secret HF_TOKEN: not available here (environment variable HF_TOKEN is not set on this machine); "
            "its value is not compared") in planned.stdout.splitlines()
    assert "(set)" not in planned.stdout


def test_a_failed_deploy_as_json_names_release_previous_cause_and_exit_code(user: User) -> None:
    user.beside_gpu1("gpu1-fusion", "features: {allreduce_fusion: true}\n")
    before = result(envelope(user.invoke("status", "--json").stdout))["current"]
    failed = user.invoke("deploy", "--profile", "gpu1-fusion.yaml", "--yes", "--json")
    document = envelope(failed.stdout, failed.returncode)
    outcome = result(document)  # the failed deploy's own keys, as before the envelope
    assert (document["outcome"], document["exit_code"], document["error"]["exit_code"]) == ("failed", 6, 6)
    assert failed.returncode == outcome["exit_code"] == 6
    assert outcome["outcome"] == "failed" and outcome["previous"] == before and outcome["release"] != before
    assert "[fusion_gate]" in outcome["cause"] and "--profile gpu1-fusion" in outcome["hint"]
    assert "rolling back" in failed.stderr  # progress on stderr, stdout is the JSON alone
    assert result(envelope(user.invoke("status", "--json").stdout))["current"] == before


README = (REPO / "README.md").read_text()


def readme_quick_start_lines() -> list[str]:
    """The README's quick start for any model, its shell block, one command per line, comments taken off."""
    section = README.split("## Quick start, for any model", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].rstrip() for line in block.splitlines() if line.strip()]


def test_the_readmes_quick_start_with_the_installed_command_deploys_from_an_empty_directory(
        user: User, tmp_path: Path) -> None:
    """Issue 39: the README's lines in order, typed at a terminal in an empty directory, with the `sglang-deploy`
    that `pip install` puts on PATH (its entry point, not the checkout's invoke). What the guest has and a real host
    has not is stated here: its hub holds one stand-in repo (GLM-5-NVFP4 over 8 simulated GPUs, under the README's
    profile name), its venv is /opt/ml-env, and its address, key, known_hosts and hub replace the example's."""
    guest = user.guest
    user.root(FRESH_HOST)
    empty = tmp_path / "empty"
    empty.mkdir()
    lines = readme_quick_start_lines()
    assert lines[:2] == ["mkdir my-gpus && cd my-gpus",
                         "sglang-deploy init --model Qwen/Qwen3-8B --gpus 1 --host 192.0.2.10"], lines
    project = empty / "my-gpus"
    ran = []
    for command in lines:
        if command.startswith("sglang-deploy init"):
            command = command.replace("--model Qwen/Qwen3-8B --gpus 1", "--model lukealonso/GLM-5-NVFP4 --gpus 8 "
                                      "--name qwen3-8b --venv /opt/ml-env").replace("192.0.2.10", guest.guest_ip)
        assert command.startswith(("mkdir", "sglang-deploy ")), command
        where = empty if command.startswith("mkdir") else project
        done = user.sh(f"cd {shlex.quote(str(where))} && echo y | script -qec {shlex.quote(command)} /dev/null")
        shown = ANSI.sub("", done.stdout)
        ran.append(command)
        assert done.returncode == 0, f"{command}\n{shown}\n{done.stderr}"
        assert "invoke " not in shown + done.stderr, shown + done.stderr  # the installed command names itself
        if command.startswith("sglang-deploy init"):
            hosts = project / "inventory" / "hosts.yaml"
            written = yaml.safe_load(hosts.read_text())
            (entry,) = written["all"]["hosts"].values()
            entry.update({"ansible_ssh_private_key_file": str(guest.key), "known_hosts_file": str(guest.known_hosts),
                          "hf_endpoint": guest.hub.endpoint})
            hosts.write_text(yaml.safe_dump(written))
        if command.startswith("sglang-deploy render"):
            assert "--tp-size 8" in shown and "--enable-metrics" in shown
        if command.startswith("sglang-deploy deploy"):
            assert re.search(r"deployed: release \w{12} is serving", shown), shown
        if command == "sglang-deploy status":
            assert "unit active/running" in shown, shown
    assert len(ran) == len(lines)
