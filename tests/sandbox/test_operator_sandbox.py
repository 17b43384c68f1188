"""What an operator meets on a real host, on the sandbox VM: no passwordless sudo, a server started by hand and
adopted as release 0, a hand-written unit, and the stop/start/restart/uninstall verbs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from projects import project_for_guest
from test_deploy_sandbox import Rig

from deploy_lib.errors import SudoPasswordRequired
from sandbox import manage

pytestmark = pytest.mark.sandbox
SUDOERS = "/etc/sudoers.d/deploy"


@pytest.fixture(scope="module")
def rig(sandbox_venv: manage.Guest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    project, inventory = project_for_guest(tmp_path_factory.mktemp("project"), sandbox_venv, {})
    yield Rig(sandbox_venv, project, inventory)


def test_without_passwordless_sudo_deploy_exits_5_naming_the_sudoers_line(rig: Rig) -> None:
    releases_before = rig.release_dirs()
    rig.root(f"echo 'deploy ALL=(ALL) ALL' > {SUDOERS}")
    try:
        with pytest.raises(SudoPasswordRequired) as raised:
            rig.deploy("glm5-nvfp4")
    finally:
        rig.root(f"echo 'deploy ALL=(ALL) NOPASSWD:ALL' > {SUDOERS}")
    assert raised.value.exit_code == 5
    assert "asks deploy for a password" in raised.value.message
    assert "deploy ALL=(ALL) NOPASSWD: ALL" in str(raised.value.hint)
    assert "edited on the host" not in str(raised.value)
    assert rig.release_dirs() == releases_before
