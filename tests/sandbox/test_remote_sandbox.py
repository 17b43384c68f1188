"""deploy_lib.remote and .store on the sandbox guest as the non-root user `deploy`: the sudo paths (consecutive root
steps behind one `sudo -n`, Puts through a private temp dir + install; without passwordless sudo, and with sudo for
named commands only), and a unit linked from the store that systemd loads."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import pytest
from helpers.sudo_above import sudo_above

from deploy_lib.errors import StepFailed, SudoPasswordRequired
from deploy_lib.host.store import read_store_facts
from deploy_lib.remote import FabricRemote, Put, Step
from deploy_lib.store import StoreLayout, Tags, release_json, stage_release, switch_current

if TYPE_CHECKING:
    from helpers.guest_shell import GuestShell

pytestmark = pytest.mark.sandbox
SUDOERS = "/etc/sudoers.d/deploy"
PASSWORDLESS = "deploy ALL=(ALL) NOPASSWD:ALL\n"

UNIT = """[Unit]
Description=store link test ({release})

[Service]
Type=oneshot
EnvironmentFile={env_file}
ExecStart=/bin/sh -c 'test "$MARK" = {release}'
"""


def test_sudo_put_lands_owned_by_root_with_its_mode_before_the_rename(sandbox_ssh: FabricRemote,
                                                                        guest_shell: GuestShell) -> None:
    dest = "/etc/sglang-deploy-test/secret.env"
    sandbox_ssh.run([Step("make dir", ("mkdir", "-p", "/etc/sglang-deploy-test"), sudo=True),
                     Put(PurePosixPath(dest), b"TOKEN=hunter2\n", 0o600, sudo=True, secret=True)])
    assert guest_shell.sudo(f"stat -c '%U:%G %a' {dest}").strip() == "root:root 600"
    assert guest_shell.sudo(f"cat {dest}") == "TOKEN=hunter2\n"
    assert guest_shell.sudo("ls -A /etc/sglang-deploy-test").split() == ["secret.env"]
    assert guest_shell.run("ls -d /tmp/sglang-deploy-* 2>/dev/null")[1] == ""  # private upload dir removed


def test_sudo_put_into_a_missing_directory_fails_cleanly(sandbox_ssh: FabricRemote) -> None:
    with pytest.raises(StepFailed, match="put /nonexistent-dir/x"):
        sandbox_ssh.run([Put(PurePosixPath("/nonexistent-dir/x"), b"x", 0o644, sudo=True)])


def test_a_linked_unit_from_the_store_follows_current(sandbox_ssh: FabricRemote, guest_shell: GuestShell) -> None:
    layout = StoreLayout("storetest", root=PurePosixPath("/opt/sglang-deploy-storetest"))
    for release in ("r1", "r2"):
        tags = Tags("ops@ci", "sandbox", release, "p", "h")
        sandbox_ssh.run(stage_release(layout, release, UNIT.format(release=release, env_file=layout.env_file(release)),
                                      f"MARK={release}\n", release_json({"id": release}, tags, datetime.now(UTC))))
        sandbox_ssh.run([*switch_current(layout, release),
                         Step("reload", ("systemctl", "daemon-reload"), sudo=True),
                         Step("start", ("systemctl", "start", layout.unit_name), sudo=True)])
        assert release in guest_shell.sudo(f"systemctl show -p Description --value {layout.unit_name}")
    facts = read_store_facts(sandbox_ssh, layout)
    assert facts.current == "r2" and [r.id for r in facts.releases] == ["r1", "r2"]
    assert guest_shell.sudo(f"stat -c %a {layout.env_file('r2')}").strip() == "600"


def test_consecutive_root_steps_share_one_sudo_and_a_secret_put_keeps_its_own(sandbox_ssh: FabricRemote,
                                                                             guest_shell: GuestShell) -> None:
    """Over SSH as `deploy`: a Put of text joins the root run around it; a secret Put's write reads the channel, so it
    has a sudo of its own and its rename starts the next run; a step as `deploy` ends a run."""
    plain, secret = "/etc/sglang-deploy-test/one-sudo.conf", "/etc/sglang-deploy-test/one-sudo.env"
    results = sandbox_ssh.run([
        sudo_above("a"), Step("make dir", ("mkdir", "-p", "/etc/sglang-deploy-test"), sudo=True),
        Put(PurePosixPath(plain), b"it's text\n", 0o644, sudo=True), sudo_above("b"),
        Put(PurePosixPath(secret), b"TOKEN=hunter2\n", 0o600, sudo=True, secret=True), sudo_above("c"),
        Step("as deploy", ("id", "-un")), sudo_above("d"), sudo_above("e")])
    above = {result.step.name: result.stdout.strip() for result in results if len(result.step.name) == 1}
    assert "none" not in above.values()
    assert above["a"] == above["b"] != above["c"] != above["d"] == above["e"]
    assert results[6].stdout == "deploy\n"
    assert guest_shell.sudo(f"stat -c '%U:%G %a' {plain} {secret}").split() == ["root:root", "644", "root:root",
                                                                                 "600"]
    assert guest_shell.sudo(f"cat {plain} {secret}") == "it's text\nTOKEN=hunter2\n"


def test_without_passwordless_sudo_the_first_root_step_reports_the_prompt(sandbox_ssh: FabricRemote,
                                                                          guest_shell: GuestShell) -> None:
    guest_shell.write(SUDOERS, "deploy ALL=(ALL) ALL\n")
    try:
        with pytest.raises(SudoPasswordRequired) as raised:
            sandbox_ssh.run([Step("user", ("true",)), Step("root a", ("true",), sudo=True),
                             Step("root b", ("touch", "/etc/sglang-deploy-never"), sudo=True)])
    finally:
        guest_shell.write(SUDOERS, PASSWORDLESS)
    assert "asks deploy for a password (step 'root a')" in raised.value.message
    assert guest_shell.run("test -e /etc/sglang-deploy-never")[0] == 1


def test_sudo_for_named_commands_only_still_runs_each_allowed_step(sandbox_ssh: FabricRemote,
                                                                   guest_shell: GuestShell) -> None:
    """A sudoers rule for some commands asks a password for the root run's bash: its steps then run with a sudo
    each, as they did before root runs shared one, and a command outside the rule meets the prompt as that step."""
    guest_shell.write(SUDOERS, "deploy ALL=(root) NOPASSWD: /usr/bin/id, /usr/bin/cat /etc/hostname\n")
    try:
        allowed = sandbox_ssh.run([Step("who", ("id", "-un"), sudo=True), Step("name", ("cat", "/etc/hostname"),
                                                                            sudo=True)])
        with pytest.raises(SudoPasswordRequired) as refused:
            sandbox_ssh.run([Step("who", ("id", "-un"), sudo=True), Step("shadow", ("cat", "/etc/shadow"), sudo=True)])
    finally:
        guest_shell.write(SUDOERS, PASSWORDLESS)
    assert allowed[0].stdout == "root\n" and allowed[1].stdout.strip() != ""
    assert "asks deploy for a password (step 'shadow')" in refused.value.message
