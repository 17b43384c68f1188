"""deploy_lib.remote and .store on the sandbox guest as the non-root user `deploy`: the sudo paths (steps behind
`sudo -n`, Puts through a private temp dir + install), and a unit linked from the store that systemd loads."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import pytest

from deploy_lib.errors import StepFailed
from deploy_lib.remote import FabricRemote, Put, Step
from deploy_lib.store import (
    StoreLayout,
    Tags,
    read_store_facts,
    release_json,
    stage_release,
    switch_current,
)

if TYPE_CHECKING:
    from guest_shell import GuestShell

pytestmark = pytest.mark.sandbox

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
