"""Sandbox guests as data: start/stop through testhost.sh, their connection facts, the inventory, the venv.

Functions return values or raise deploy_lib errors; they never print (sandbox/tasks.py does).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from deploy_lib.errors import RemoteError
from sandbox import hub, wheelhouse
from sandbox.names import DEFAULT_NAME, GROUP, GUEST_USER, GUEST_VENV

SANDBOX_DIR = Path(__file__).resolve().parent
TESTHOST = SANDBOX_DIR / "testhost.sh"
INVENTORY = SANDBOX_DIR.parent / "inventory" / "sandbox.yaml"
GUEST_WHEELS = PurePosixPath("/var/cache/sglang-sim/wheels")
GUEST_TOKENIZER = PurePosixPath("/opt/sim-tokenizer")
GUEST_CHECKOUT = PurePosixPath("/root/sglang/python")  # where our users' SGLang source checkout is
GUEST_EDITABLE_VENV = PurePosixPath("/root/ml-env")
ROUTER_PORT = 30080


@dataclass(frozen=True)
class Guest:
    name: str
    state: str
    host_ip: str
    guest_ip: str
    key: Path
    known_hosts: Path
    netns: str
    veth: str

    @property
    def hub(self) -> hub.Hub:
        """The guest's Hugging Face hub (olah), on the host end of its veth."""
        return hub.Hub(self.name, self.host_ip)

    def ssh_argv(self, user: str = GUEST_USER) -> list[str]:
        """ssh command line for this guest, host-key checking on (strict, against its own known_hosts)."""
        return ["ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                f"{user}@{self.guest_ip}"]


def _testhost(command: str, name: str, timeout_s: float = 300, layers: tuple[Path, ...] = (),
              stop_timeout_s: int = 30, disk_mib: int = 0) -> str:
    env = {**os.environ, "TH_NAME": name, "TH_LAYERS": ":".join(map(str, layers)),
           "TH_STOP_TIMEOUT": str(stop_timeout_s), "TH_DISK": str(disk_mib or "")}
    result = subprocess.run(["bash", str(TESTHOST), command], env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    if result.returncode != 0:
        raise RemoteError(f"sandbox {command} {name} failed (exit {result.returncode})",
                          hint="\n".join(result.stderr.strip().splitlines()[-3:]) or None)
    return result.stdout


def guest(name: str = DEFAULT_NAME) -> Guest:
    facts = dict(line.split("=", 1) for line in _testhost("info", name).splitlines() if "=" in line)
    return Guest(name=facts["name"], state=facts["state"], host_ip=facts["host_ip"],
                 guest_ip=facts["guest_ip"], key=Path(facts["key"]), known_hosts=Path(facts["known_hosts"]),
                 netns=facts["netns"], veth=facts["veth"])


def _testhost_dir() -> Path:
    """testhost.sh's work directory (rootfs, run/, layers/), where its client key lives."""
    return guest().key.parent.parent


def _inventory_names_file() -> Path:
    """Guests brought up by `sandbox.up` (tests and scripts start others that stay out of the inventory)."""
    return _testhost_dir() / "inventory-names"


def inventory_names() -> list[str]:
    path = _inventory_names_file()
    names = set(path.read_text().split()) if path.exists() else set()
    return sorted(names | {DEFAULT_NAME}, key=_by_number)


def _by_number(name: str) -> tuple[str, int]:
    """th2 before th10."""
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem):] or 0)


def _record_inventory_name(name: str, present: bool) -> None:
    names = (set(inventory_names()) | {name}) if present else (set(inventory_names()) - {name})
    _inventory_names_file().write_text("".join(f"{n}\n" for n in sorted(names, key=_by_number)))


DISK_MIB = 8192  # a guest's own disk (sparse: it takes what the guest writes)


def up(name: str = DEFAULT_NAME, record: bool = True, layers: tuple[Path, ...] = (), disk: bool = False) -> Guest:
    """Build the rootfs if needed (cached tarball), boot the guest (over read-only `layers`, e.g. venv_layer's;
    with `disk`, its writable layer on an ext4 disk of its own, which `crash` needs), wait for ssh, start its hub;
    list it in the inventory."""
    _testhost("build", name)
    _testhost("start", name, timeout_s=120, layers=layers, disk_mib=DISK_MIB if disk else 0)
    started = guest(name)
    hub.start(name, started.host_ip)
    if record:
        _record_inventory_name(name, present=True)
        write_inventory()
    return guest(name)


def down(name: str = DEFAULT_NAME, record: bool = True, poweroff_s: int = 30) -> Guest:
    """Stop its hub, power the guest off (killed after `poweroff_s`; 0 for a throw-away guest, whose clean shutdown
    only waits on its services) and remove its overlay, netns, veth and cgroups."""
    hub.stop(guest(name).hub)
    # unmounting the overlay and removing the netns wait on the kernel: over two minutes once seen at load 20
    _testhost("stop", name, timeout_s=poweroff_s + 300, stop_timeout_s=poweroff_s)
    if record and name != DEFAULT_NAME:
        _record_inventory_name(name, present=False)
        write_inventory()
    return guest(name)


def reboot(name: str = DEFAULT_NAME, poweroff_s: int = 30) -> Guest:
    """A clean reboot: the guest's systemd stops its services and reboots (killed after `poweroff_s`), and the guest
    boots again over the same writable layer, address and host key."""
    _testhost("reboot", name, timeout_s=poweroff_s + 300, stop_timeout_s=poweroff_s)
    return guest(name)


def crash(name: str = DEFAULT_NAME) -> Guest:
    """A power loss: the guest's disk stops taking writes at once (what was not synced or written back is lost),
    every process of it is killed, no shutdown runs; then it boots again over that disk. Needs `up(disk=True)`."""
    _testhost("crash", name, timeout_s=300)
    return guest(name)


def status() -> list[Guest]:
    """Every guest in the inventory plus any other running one (started by tests or testhost.sh)."""
    run_dir = _testhost_dir() / "run"
    running = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    return [guest(name) for name in sorted(running | set(inventory_names()))]


def _router_file() -> Path:
    """The guest `sandbox.up --router NAME` named to run the SGLang router in front of group sandbox."""
    return _testhost_dir() / "router-name"


def inventory_router() -> str | None:
    path = _router_file()
    return path.read_text().strip() or None if path.exists() else None


def record_router(name: str | None) -> None:
    _router_file().write_text(name or "")


def router_vars(router: str) -> dict:
    """Group vars naming the guest that runs the SGLang router in front of group sandbox; the router's venv is built
    from a wheelhouse of its lock (the guests have no internet)."""
    return {"router": router, "router_port": ROUTER_PORT, "router_policy": "round_robin",
            "router_wheelhouse": str(wheelhouse.router_wheelhouse())}


def inventory(guests: list[Guest], router: str | None = None) -> dict:
    """Ansible-style inventory of the guests: every guest in group `sandbox` (`--group sandbox`), with a router in
    front of them when `router` names one of them."""
    hosts = {
        g.name: {"ansible_host": g.guest_ip, "known_hosts_file": str(g.known_hosts), "hf_endpoint": g.hub.endpoint}
        for g in guests
    }
    group: dict = {"hosts": hosts, **({"vars": router_vars(router)} if router else {})}
    return {"all": {
        "children": {GROUP: group},
        "vars": {"ansible_user": GUEST_USER, "ansible_ssh_private_key_file": str(guests[0].key),
                 "venv": str(GUEST_VENV), "gpu_count": 8, "gpu_arch": "sm120"},
    }}


def inventory_text(guests: list[Guest], router: str | None = None) -> str:
    header = ("# Sandbox VM inventory, written by `invoke sandbox.up` (sandbox/manage.py). The guests are\n"
              "# systemd-nspawn machines on this host; only their GPUs and the model are simulated.\n")
    return header + yaml.safe_dump(inventory(guests, router), sort_keys=False)


def write_inventory(path: Path = INVENTORY) -> Path:
    """Inventory of the guests brought up by `sandbox.up` (and the router `--router` named, while it is one of
    several); for th1 alone it equals the committed file."""
    names = inventory_names()
    router = inventory_router()
    path.write_text(inventory_text([guest(name) for name in names],
                                   router if router in names and len(names) > 1 else None))
    return path


def cpu_s(g: Guest) -> float:
    """The CPU every process of the guest has used so far (its cgroup, as testhost.sh's `cgroup_v2` names it)."""
    hybrid = Path("/sys/fs/cgroup/unified")
    stat = (hybrid if hybrid.is_dir() else Path("/sys/fs/cgroup")) / f"testhost.{g.name}" / "cpu.stat"
    usage = dict(line.split() for line in stat.read_text().splitlines())
    return int(usage["usage_usec"]) / 1e6


def run_on(g: Guest, command: str, timeout_s: float = 600, user: str = "root", stdin: str = "") -> str:
    """`command` (a shell command line) on the guest as `user`, `stdin` on its standard input (empty by default, so
    the command never reads this process's own); its stdout, or RemoteError on a non-zero exit."""
    result = subprocess.run([*g.ssh_argv(user), command], input=stdin, capture_output=True, encoding="utf-8",
                            timeout=timeout_s)
    if result.returncode != 0:
        raise RemoteError(f"{g.name}: `{command}` exited {result.returncode}", hint=result.stderr.strip()[-500:])
    return result.stdout


def put_text_command(path: str | PurePosixPath, text: str | None) -> str:
    """The shell command of `put_text`: `path` quoted for the shell, the text read from stdin (never parsed)."""
    quoted = shlex.quote(str(path))
    if text is None:
        return f"rm -f -- {quoted}"
    return f"mkdir -p -- \"$(dirname -- {quoted})\" && cat > {quoted}"


def put_text(g: Guest, path: str | PurePosixPath, text: str | None) -> None:
    """`text` into `path` on the guest as root, its directory made if missing; None removes the file. The one way
    tests write a file on a guest (a sim fault, a lock owner, a unit): whatever the path and text hold, the guest
    gets exactly them."""
    run_on(g, put_text_command(path, text), stdin=text or "")


def push_wheels(g: Guest, wheels: tuple[Path, ...]) -> list[PurePosixPath]:
    """rsync wheels to the guest (it has no network); returns the paths there."""
    run_on(g, f"mkdir -p {shlex.quote(str(GUEST_WHEELS))}")
    ssh = shlex.join(g.ssh_argv("root")[:-1])
    subprocess.run(["rsync", "-a", "-e", ssh, *map(str, wheels), f"root@{g.guest_ip}:{GUEST_WHEELS}/"],
                   check=True, capture_output=True, timeout=600)
    return [GUEST_WHEELS / wheel.name for wheel in wheels]


def build_guest_venv(g: Guest, house: wheelhouse.Wheelhouse, venv: PurePosixPath = GUEST_VENV) -> PurePosixPath:
    """Until the deploy engine builds venvs: real sglang + flashinfer (--no-deps) + msgspec + the sim."""
    _venv_with(g, venv, push_wheels(g, house.wheels))
    put_text(g, venv / VENV_MARKER, _venv_marker(house))
    return venv


VENV_MARKER = ".sandbox-wheelhouse"  # in a venv build_guest_venv made: what it was built from


def _venv_marker(house: wheelhouse.Wheelhouse) -> str:
    """The wheels by name, the sim (rebuilt on every prepare) by content."""
    return "\n".join([*(w.name for w in house.wheels[:-1]), hashlib.sha256(house.sim.read_bytes()).hexdigest()])


def guest_venv_is(g: Guest, house: wheelhouse.Wheelhouse, venv: PurePosixPath = GUEST_VENV) -> bool:
    """The guest's venv was built by build_guest_venv from exactly this wheelhouse."""
    marker = shlex.quote(str(venv / VENV_MARKER))
    return run_on(g, f"cat {marker} 2>/dev/null || true") == _venv_marker(house)


VENV_LAYER_PATHS = ("opt/ml-env", "var/cache/sglang-sim", "opt/sim-tokenizer")  # what build_guest_venv writes
LAYER_UNUSED_S = 2 * 86400  # a venv layer no run has used for this long (an older wheelhouse or sim) is removed


def venv_layer(house: wheelhouse.Wheelhouse) -> Path:
    """A read-only overlay layer holding what build_guest_venv makes (the venv, the pushed wheels, the sim's
    tokenizer), built once per wheelhouse and rootfs on a guest of its own and kept in the cache: a guest started
    over it (`up(name, layers=(layer,))`) has /opt/ml-env at once, in its own fresh writable layer."""
    _testhost("build", DEFAULT_NAME)
    th_dir = _testhost_dir()
    rootfs = (th_dir / "rootfs.key").read_text()
    key = hashlib.sha256(f"{_venv_marker(house)}\n{rootfs}".encode()).hexdigest()[:16]
    layers = th_dir / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    layer = layers / f"venv-{key}"
    used = layers / f"{layer.name}.lock"
    used.touch()  # its mtime: when a run last used the layer
    with used.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not layer.is_dir():
            _build_venv_layer(layer, house, th_dir)
            _remove_unused_layers(layers)
    return layer


def _build_venv_layer(layer: Path, house: wheelhouse.Wheelhouse, th_dir: Path) -> None:
    name = f"lyr{layer.name[-8:]}"
    staging = layer.with_name(f"{layer.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    builder = up(name, record=False)
    try:
        build_guest_venv(builder, house)
        # the guest's writable layer holds exactly what it wrote; --parents keeps /opt's and /var's attributes
        subprocess.run(["cp", "-a", "--parents", *VENV_LAYER_PATHS, str(staging)], cwd=th_dir / "run" / name / "upper",
                       check=True)
    finally:
        down(name, record=False)
    staging.rename(layer)


def _remove_unused_layers(layers: Path) -> None:
    for lock in layers.glob("venv-*.lock"):
        if time.time() - lock.stat().st_mtime > LAYER_UNUSED_S:
            shutil.rmtree(layers / lock.name.removesuffix(".lock"), ignore_errors=True)
            lock.unlink(missing_ok=True)


def remove_releases(g: Guest, service: str = "sglang") -> None:
    """An empty host again: the service stopped and its unit, release store, venvs and caches gone (the venv the
    guest was built with stays)."""
    unit = shlex.quote(f"{service}.service")
    run_on(g, f"systemctl stop {unit} 2>/dev/null; rm -f /etc/systemd/system/{unit}; "
              f"rm -rf /opt/sglang-deploy; systemctl daemon-reload; systemctl reset-failed {unit} 2>/dev/null; true")


def _venv_with(g: Guest, venv: PurePosixPath, wheels: list[PurePosixPath]) -> None:
    """A fresh venv holding these wheels, and the simulator's tokenizer (the sandbox has no GLM-5 tokenizer; SGLang's
    serving benchmark loads this one offline, bench.tokenizer)."""
    install = shlex.join(wheelhouse.install_argv(str(venv / "bin/python"), tuple(map(str, wheels))))
    run_on(g, f"rm -rf {shlex.quote(str(venv))} && /usr/bin/python3 -m venv {shlex.quote(str(venv))} && {install}")
    run_on(g, f"{shlex.quote(str(venv / 'bin/python'))} -m sglang_sim.tokenizer {shlex.quote(str(GUEST_TOKENIZER))}")


def build_editable_venv(g: Guest, house: wheelhouse.Wheelhouse, checkout: PurePosixPath = GUEST_CHECKOUT,
                        venv: PurePosixPath = GUEST_EDITABLE_VENV) -> PurePosixPath:
    """Our users' layout: SGLang run from a source checkout (`pip install -e`), everything else from wheels.

    The checkout is the real SGLang wheel laid out as the repository's python/ directory (sandbox/source_tree.py,
    run on the guest); setuptools >= 70.1 builds the editable wheel offline (older ones need `wheel`)."""
    sglang, *others = push_wheels(g, (house.sglang, wheelhouse.download("setuptools"),
                                      *(w for w in house.wheels if w != house.sglang)))
    script = (SANDBOX_DIR / "source_tree.py").read_text()
    run_on(g, f"rm -rf {shlex.quote(str(checkout))} && python3 -c {shlex.quote(script)} "
              f"{shlex.quote(str(sglang))} {shlex.quote(str(checkout))}")
    _venv_with(g, venv, others)
    editable = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                "--no-build-isolation", "--disable-pip-version-check", "-e", str(checkout)]
    run_on(g, shlex.join(editable))
    return venv
