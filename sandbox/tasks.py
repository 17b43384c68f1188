"""`invoke sandbox.*`: the sandbox GPU VM (mounted in tasks.py with Collection.from_module). Thin: the work is
in sandbox/manage.py, imported by each task when it runs (so `invoke deploy` never loads the rig). Needs root
(netns, overlay mount, systemd-nspawn)."""

from __future__ import annotations

import os

from invoke import Context

from deploy_cli.options import task
from sandbox import names


@task(help={"name": f"guest name (default {names.DEFAULT_NAME}; thN gets 10.213.x.y/30 number N)",
            "venv": f"also build {names.GUEST_VENV} in the guest from the wheelhouse (real sglang + the sim)",
            "sglang": "sglang version for --venv", "flashinfer": "flashinfer-python version for --venv"})
def up(c: Context, name: str = names.DEFAULT_NAME, venv: bool = False, sglang: str = names.DEFAULT_SGLANG,
       flashinfer: str = names.DEFAULT_FLASHINFER) -> None:
    """Boot a sandbox guest (Debian 12, systemd, sshd; simulated GPUs) and write inventory/sandbox.yaml; with --venv
    build /opt/ml-env from the wheelhouse unless the running guest's venv was built from the same wheels."""
    from sandbox import manage, wheelhouse

    guest = manage.up(name)
    if venv:
        house = wheelhouse.prepare(sglang, flashinfer)
        if manage.guest_venv_is(guest, house):
            print(f"{guest.name}: {names.GUEST_VENV} is up to date")
        else:
            manage.build_guest_venv(guest, house)
    print(f"{guest.name} up: ssh {names.GUEST_USER}@{guest.guest_ip} (inventory: {manage.INVENTORY})")


@task(help={"name": f"guest name (default {names.DEFAULT_NAME})"})
def empty(c: Context, name: str = names.DEFAULT_NAME) -> None:
    """Remove every release from a sandbox guest (the unit, the release store, its venvs and caches); keep the venv."""
    from sandbox import manage

    manage.remove_releases(manage.guest(name))
    print(f"{name}: no releases")


@task(help={"name": f"guest name (default {names.DEFAULT_NAME})"})
def down(c: Context, name: str = names.DEFAULT_NAME) -> None:
    """Power a sandbox guest off; nothing of it stays behind (process, mount, netns, veth, cgroup)."""
    from sandbox import manage

    manage.down(name)
    print(f"{name} down")


@task(help={"name": f"guest name (default {names.DEFAULT_NAME})", "user": "login user (deploy or root)",
            "command": "run this instead of an interactive shell"})
def ssh(c: Context, name: str = names.DEFAULT_NAME, user: str = names.GUEST_USER, command: str = "") -> None:
    """SSH into a sandbox guest (host key checked against its known_hosts)."""
    from sandbox import manage

    argv = manage.guest(name).ssh_argv(user) + ([command] if command else [])
    os.execvp(argv[0], argv)


@task
def status(c: Context) -> None:
    """List sandbox guests: name, state, address."""
    from sandbox import manage

    for guest in manage.status():
        print(f"{guest.name:<12} {guest.state:<8} {guest.guest_ip}")
