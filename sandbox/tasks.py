"""`invoke sandbox.*`: the sandbox GPU VM (mounted in tasks.py with Collection.from_module). Thin: the work is
in sandbox/manage.py, imported by each task when it runs (so `invoke deploy` never loads the rig). Needs root
(netns, overlay mount, systemd-nspawn)."""

from __future__ import annotations

import os

from invoke import Context, Exit

from deploy_cli.options import task
from deploy_lib.errors import ConfigError, RemoteError
from sandbox import names


@task(iterable=["name"], help={
    "name": f"guest name, repeat for several (default {names.DEFAULT_NAME}; thN gets 10.213.x.y/30 number N)",
    "count": f"bring up guests th1..thN (all in group `{names.GROUP}` of the inventory)",
    "venv": f"also give each guest {names.GUEST_VENV} from the wheelhouse (real sglang + the sim)",
    "sglang": f"sglang version for --venv (the simulator starts on the default, {names.DEFAULT_SGLANG}; not on "
              "0.5.9: docs/sandbox.md)", "flashinfer": "flashinfer-python version for --venv",
    "router": f"the guest that runs the SGLang router in front of group `{names.GROUP}` (written into its vars; "
              "`invoke router.deploy --group sandbox` deploys it)",
    "disk": "give a new guest's writable layer an ext4 disk of its own, so that `sandbox.crash` loses what was not "
            "synced"})
def up(c: Context, name: list[str] | None = None, count: int = 0, venv: bool = False,
       sglang: str = names.DEFAULT_SGLANG, flashinfer: str = names.DEFAULT_FLASHINFER,
       router: str | None = None, disk: bool = False) -> None:
    """Boot sandbox guests (Debian 12, systemd, sshd; simulated GPUs) and write inventory/sandbox.yaml (group
    `sandbox`); with --venv a new guest boots over the wheelhouse's venv layer, and a running one gets /opt/ml-env built
    unless it was built from the same wheels."""
    try:
        guests = names.guest_names(name or [], count)
    except ConfigError as error:
        raise Exit(f"error: {error}", code=error.exit_code) from None
    from sandbox import manage, wheelhouse

    house = wheelhouse.prepare(sglang, flashinfer) if venv else None
    layers = (manage.venv_layer(house),) if house is not None else ()
    for each in guests:
        guest = manage.up(each, layers=layers, disk=disk)
        if house is not None:
            if manage.guest_venv_is(guest, house):
                print(f"{guest.name}: {names.GUEST_VENV} is up to date")
            else:
                manage.build_guest_venv(guest, house)
        print(f"{guest.name} up: ssh {names.GUEST_USER}@{guest.guest_ip} (inventory: {manage.INVENTORY}, group "
              f"{names.GROUP})")
    manage.record_router(router)  # each sandbox.up says whether a router stands in front of the group
    manage.write_inventory()
    if router is not None:
        print(f"{router} runs the SGLang router of group {names.GROUP} (port {manage.ROUTER_PORT}): "
              f"`invoke router.deploy --group {names.GROUP}`")


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


@task(help={"name": f"guest name (default {names.DEFAULT_NAME})"})
def reboot(c: Context, name: str = names.DEFAULT_NAME) -> None:
    """Reboot a sandbox guest cleanly (its systemd stops the services); it comes back over the same writable layer."""
    from sandbox import manage

    try:
        manage.reboot(name)
    except RemoteError as error:
        raise Exit(f"error: {error}", code=error.exit_code) from None
    print(f"{name} rebooted")


@task(help={"name": f"guest name (default {names.DEFAULT_NAME}; started with `sandbox.up --disk`)"})
def crash(c: Context, name: str = names.DEFAULT_NAME) -> None:
    """Cut a sandbox guest's power: its disk keeps only what was synced or written back, every process dies at once,
    no shutdown; then it boots again over that disk."""
    from sandbox import manage

    try:
        manage.crash(name)
    except RemoteError as error:
        raise Exit(f"error: {error}", code=error.exit_code) from None
    print(f"{name} lost power and booted again")


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
