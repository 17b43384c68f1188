"""gpu-check's peer-to-peer readings over real SSH: the sandbox guest is the inventory host (the VM side: the
simulated nvidia-smi's P2P `NS`) and also stands in for its Proxmox node, with `qm` and `lspci` replaced by scripts
that print the composed node outputs of tests/data/p2p/composed-node (its README says where they come from); the
node's /proc/cmdline and IOMMU groups are the guest's own. A node that cannot be reached leaves the VM side
reported. Last, `invoke gpu-check` itself, as a user types it in a checkout: the section it prints."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.json_doc import envelope, result

from deploy_lib.deploy.project import resolve_target
from deploy_lib.gpu_check.p2p.verdict import Cause
from deploy_lib.gpu_check.topology import parse_topology_results, topology_steps
from deploy_lib.host.p2p_reading import proxmox_node, read_node, read_peer_to_peer
from deploy_lib.inventory.model import load_inventory
from deploy_lib.remote import FabricRemote
from sandbox import manage

pytestmark = [pytest.mark.sandbox]
REPO = Path(__file__).resolve().parents[2]
COMPOSED = REPO / "tests/data/p2p/composed-node"
RECORDED = "/srv/pve-recorded"
# /usr/local/bin comes before /usr/bin in the login PATH and in sudo's secure_path
FAKE_QM = f"""#!/bin/sh
[ "$1 $2" = "config 105" ] || {{ echo "Configuration file 'qemu-server/$2.conf' does not exist" >&2; exit 2; }}
exec cat {RECORDED}/qm-config-no-clique.conf
"""
FAKE_LSPCI = f"""#!/bin/sh
case "$1" in -t) exec cat {RECORDED}/lspci-t.txt ;; -vvv) exec cat {RECORDED}/lspci-vvv.txt ;; esac
exit 1
"""


@pytest.fixture(scope="module")
def node_stand_in(sandbox_guest: manage.Guest) -> Iterator[manage.Guest]:
    for name in ("qm-config-no-clique.conf", "lspci-t.txt", "lspci-vvv.txt"):
        manage.put_text(sandbox_guest, f"{RECORDED}/{name}", (COMPOSED / name).read_text())
    for tool, script in (("qm", FAKE_QM), ("lspci", FAKE_LSPCI)):
        manage.put_text(sandbox_guest, f"/usr/local/bin/{tool}", script)
        manage.run_on(sandbox_guest, f"chmod 755 /usr/local/bin/{tool}")
    yield sandbox_guest
    manage.run_on(sandbox_guest, f"rm -rf /usr/local/bin/qm /usr/local/bin/lspci {RECORDED}")


def inventory_with_node(guest: manage.Guest, tmp_path: Path, node_port: int = 22):
    """The guest as the VM (proxmox_node: pve1, proxmox_vmid: 105) and as pve1 at `node_port`."""
    data = manage.inventory([guest])
    hosts = data["all"]["children"][manage.GROUP]["hosts"]
    node = copy.deepcopy(hosts[guest.name])
    hosts[guest.name].update(proxmox_node="pve1", proxmox_vmid=105)
    hosts["pve1"] = {**node, "ansible_port": node_port, "connect_timeout_s": 5}
    (path := tmp_path / "hosts.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    inventory = load_inventory(path)
    return inventory, resolve_target(inventory, guest.name)


def check(guest: manage.Guest, tmp_path: Path, node_port: int = 22):
    inventory, target = inventory_with_node(guest, tmp_path, node_port)
    node = read_node(proxmox_node(inventory, target), lambda t: FabricRemote(t.ssh))
    with FabricRemote(target.ssh) as remote:
        topology, _ = parse_topology_results(remote.run(topology_steps()))
        return read_peer_to_peer(remote, topology, (), {}, {}, node)


def test_the_node_stand_in_is_read_and_each_pair_gets_its_causes(node_stand_in: manage.Guest, tmp_path: Path):
    verdict, _ = check(node_stand_in, tmp_path)
    assert "Proxmox node pve1, VM 105: read (GPU i of the VM taken to be its i-th hostpci entry)" in verdict.notes
    assert len(verdict.pairs) == 28 and not any(pair.p2p for pair in verdict.pairs)  # the simulated rig: P2P NS
    first = verdict.pairs[0]
    causes = [finding.cause for finding in first.findings]
    assert Cause.ACS_REDIRECT in causes and Cause.ROOT_COMPLEXES in causes
    in_vm = verdict.notes[0].startswith("a VM")
    assert (Cause.VM_NO_CLIQUE in causes) == in_vm
    acs = next(f for f in first.findings if f.cause is Cause.ACS_REDIRECT)
    assert acs.fixes[0] == "on pve1, until reboot: setpci -s 0000:40:01.1 ECAP_ACS+6.w=0000"
    # the node is left as it was: the stand-in's recorded outputs are still what it prints
    assert manage.run_on(node_stand_in, "qm config 105") == (COMPOSED / "qm-config-no-clique.conf").read_text()


def test_an_unreachable_node_still_reports_the_vm_side(node_stand_in: manage.Guest, tmp_path: Path):
    verdict, _ = check(node_stand_in, tmp_path, node_port=1)  # nothing listens on port 1: refused at once
    note = next(note for note in verdict.notes if note.startswith("Proxmox node pve1, VM 105: not read (unreachable:"))
    assert note and len(verdict.pairs) == 28
    assert all(f.cause is not Cause.ACS_REDIRECT for pair in verdict.pairs for f in pair.findings)


def invoke_in_checkout(checkout: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`invoke ARGV` in a checkout of the project, with the installed venv's invoke on PATH."""
    environ = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEPLOY_INVENTORY", "HF_TOKEN")}
    environ["PATH"] = f"{Path(sys.executable).parent}:{environ['PATH']}"
    return subprocess.run(["invoke", *argv], cwd=checkout, capture_output=True, text=True, env=environ, timeout=600)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "tasks.py", root / "tasks.py")
    (root / "sandbox").symlink_to(REPO / "sandbox")  # tasks.py mounts the sandbox tasks
    shutil.copytree(REPO / "inventory" / "profiles", root / "inventory" / "profiles")
    # the reference profile with the guest's venv (its /opt/ml-env: no torch with CUDA there)
    (root / "inventory" / "profiles" / "p2p-ref.yaml").write_text(
        f"extends: glm5-nvfp4\nservice:\n  venv: {manage.GUEST_VENV}\n")
    return root


def test_invoke_gpu_check_prints_the_section_with_a_cause_and_fix_for_each_pair(node_stand_in: manage.Guest,
                                                                                checkout: Path):
    """The guest's /opt/ml-env has no torch with CUDA, so the all-reduce is not verified (exit 3); the section is
    printed all the same, from what was read in the VM and on the node."""
    inventory_with_node(node_stand_in, checkout / "inventory")
    done = invoke_in_checkout(checkout, "gpu-check", "--profile", "p2p-ref", "--host", node_stand_in.name,
                              "--inventory", "inventory/hosts.yaml")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    section = lines[lines.index("peer-to-peer:"):]
    assert "  Proxmox node pve1, VM 105: read (GPU i of the VM taken to be its i-th hostpci entry)" in section
    pairs = [i for i, line in enumerate(section) if line.startswith("  GPU")]
    assert len(pairs) == 28 and all(": no P2P (read NS: not supported" in section[i] for i in pairs)
    for start, end in zip(pairs, [*pairs[1:], section.index("  until then:")], strict=True):
        told = section[start + 1:end]
        assert any(line.startswith("    cause: ") for line in told), section[start]
        assert any(line.startswith("      fix: ") for line in told), section[start]
    assert "      fix: on pve1, until reboot: setpci -s 0000:40:01.1 ECAP_ACS+6.w=0000" in section
    assert "    SGLang: --disable-custom-all-reduce (its custom all-reduce needs peer access between the GPUs)" in \
        section
    # the per-pair copies ran on the guest (sudo timeout 240 PYTHON -) and said why they could not measure
    assert any(line.startswith("  P2P measurement not run: needs torch with CUDA") for line in section), section
    as_json = invoke_in_checkout(checkout, "gpu-check", "--profile", "p2p-ref", "--host", node_stand_in.name,
                                 "--inventory", "inventory/hosts.yaml", "--json")
    pairs_json = result(envelope(as_json.stdout))["peer_to_peer"]["pairs"]
    assert len(pairs_json) == 28 and "acs_redirect" in [f["kind"] for f in pairs_json[0]["findings"]]
    status = invoke_in_checkout(checkout, "status", "--host", node_stand_in.name, "--inventory",
                                "inventory/hosts.yaml")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "peer-to-peer on 0 of 28 GPU pairs; causes: ACS redirect on, GPUs under different root complexes" in \
        status.stdout
    assert manage.run_on(node_stand_in, "qm config 105") == (COMPOSED / "qm-config-no-clique.conf").read_text()


def test_invoke_gpu_check_with_the_node_unreachable_prints_the_vm_side_and_why(node_stand_in: manage.Guest,
                                                                              checkout: Path):
    inventory_with_node(node_stand_in, checkout / "inventory", node_port=1)  # refused at once
    done = invoke_in_checkout(checkout, "gpu-check", "--profile", "p2p-ref", "--host", node_stand_in.name,
                              "--inventory", "inventory/hosts.yaml")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    section = lines[lines.index("peer-to-peer:"):]
    assert any(line.startswith("  Proxmox node pve1, VM 105: not read (unreachable: ") for line in section), section
    assert len([line for line in section if line.startswith("  GPU")]) == 28
    assert not any("setpci" in line for line in section)
