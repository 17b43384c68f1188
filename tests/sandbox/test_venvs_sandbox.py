"""deploy_lib/venvs on the sandbox guest, as the non-root user `deploy`: the real pinned uv, real wheels (sglang,
flashinfer-python, msgspec, the sim), a lock generated from the sandbox wheelhouse with sha256 hashes.

The tests of this module build on each other in file order (one store): build -> reuse -> lock change ->
damaged wheel -> uv failure -> interrupted build -> adopt -> derive -> caches -> list and prune.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import pytest

from deploy_lib import venvs
from deploy_lib.errors import ConfigError, StepFailed, StepTimedOut
from deploy_lib.host import venv_adopt, venv_build, venv_derive, venv_lifecycle, venv_publish, venv_store
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import FabricRemote, OutputLine, Put, Step, StepResult
from deploy_lib.store import StoreLayout
from sandbox import wheelhouse

if TYPE_CHECKING:
    from helpers.guest_shell import GuestShell

pytestmark = [pytest.mark.sandbox, pytest.mark.wheels]

LAYOUT = StoreLayout("venvtest", root=PurePosixPath("/opt/sglang-deploy-venvtest"))
SITE = "lib/python3.11/site-packages"


@dataclass
class CountingRemote:
    """Runs through the sandbox connection and keeps every Put that was sent (bytes on the wire), but the host
    lock's owner file, which every host change writes."""

    inner: FabricRemote
    sent: list[Put]

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        results = self.inner.run(batch, on_output)
        self.sent += [step for step in batch if isinstance(step, Put) and step.dest.parent.name != "lock"]
        return results

    def close(self) -> None:
        pass

    def wheel_bytes(self) -> int:
        return sum(len(put.data) for put in self.sent if "/wheels/" in str(put.dest))


def counting(remote: FabricRemote) -> CountingRemote:
    return CountingRemote(remote, [])



@pytest.fixture(scope="module")
def house(wheelhouse_default: wheelhouse.Wheelhouse, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheelhouse directory with the sandbox wheels plus another flashinfer-python and sglang for new locks."""
    others = (wheelhouse.download("flashinfer-python", "0.6.12"), wheelhouse.download("sglang", "0.5.20"))
    return wheelhouse_default.link_into(tmp_path_factory.mktemp("wheelhouse"), *others)


def spec(tmp_path: Path, house: Path, wheels: Sequence[Path], name: str = "requirements.lock") -> venvs.VenvSpec:
    return venvs.VenvSpec(lock=wheelhouse.write_lock(tmp_path / name, wheels), wheelhouse=house)


@pytest.fixture(scope="module")
def store(sandbox_ssh: FabricRemote) -> None:
    sandbox_ssh.run([Step("fresh store", ("rm", "-rf", "--", str(LAYOUT.base)), sudo=True)])


@pytest.fixture(scope="module")
def built(store: None, sandbox_ssh: FabricRemote, wheelhouse_default: wheelhouse.Wheelhouse, house: Path,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote]:
    remote = counting(sandbox_ssh)
    built_spec = spec(tmp_path_factory.mktemp("lock"), house, wheelhouse_default.wheels)
    return built_spec, venv_build.ensure_venv(remote, LAYOUT, built_spec), remote


def sh(*words: object) -> str:
    """One shell command from its words, each quoted (GuestShell runs a shell command line)."""
    return shlex.join(str(word) for word in words)


def python_says(shell: GuestShell, venv: PurePosixPath, code: str) -> str:
    return shell.sudo(sh(venv_python(venv), "-c", code)).strip()


def sums(shell: GuestShell, directory: PurePosixPath) -> str:
    return shell.sudo(f"cd {shlex.quote(str(directory))} && find . -type f -print0 | sort -z | xargs -0 sha256sum",
                      timeout_s=300)


def test_a_build_sends_every_wheel_once_and_publishes_a_working_venv(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote],
        wheelhouse_default: wheelhouse.Wheelhouse, guest_shell: GuestShell) -> None:
    _, result, remote = built
    assert not result.reused
    assert remote.wheel_bytes() == sum(w.stat().st_size for w in (*wheelhouse_default.wheels, wheelhouse_default.uv))
    assert remote.wheel_bytes() == result.bytes_sent
    where = python_says(guest_shell, result.path, "import sglang.version as v; print(v.__file__, v.__version__)")
    assert where == f"{result.path}/{SITE}/sglang/version.py 0.5.23"
    marker = json.loads(guest_shell.sudo(sh("cat", result.path / "venv.json")))
    assert marker["hash"] == result.hash and marker["distributions"]["flashinfer-python"] == "0.7.2"
    assert marker["python"]["version"].startswith("3.11.")
    # console scripts were relocated from the .tmp build directory: tqdm's runs from the published venv
    shebang = guest_shell.sudo(sh("head", "-1", result.path / "bin" / "tqdm")).strip()
    assert shebang in (f"#!{result.path}/bin/python", f"#!{result.path}/bin/python3")
    assert guest_shell.sudo(sh(result.path / "bin" / "tqdm", "--version")).strip() == "4.70.1"
    assert guest_shell.sudo(sh("ls", "-A", LAYOUT.venvs)).split() == [result.hash]
    # installed by hard links from uv's cache in the store (same filesystem), not copied
    links = guest_shell.sudo(sh("stat", "-c", "%h", result.path / SITE / "sglang" / "version.py")).strip()
    assert int(links) >= 2


def test_a_second_run_reuses_the_venv_without_sending_anything(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote) -> None:
    built_spec, first, _ = built
    remote = counting(sandbox_ssh)
    again = venv_build.ensure_venv(remote, LAYOUT, built_spec)
    assert (again.hash, again.reused, again.bytes_sent) == (first.hash, True, 0)
    assert remote.sent == []


def test_a_lock_change_builds_a_new_venv_sending_only_the_changed_wheel(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        wheelhouse_default: wheelhouse.Wheelhouse, house: Path, tmp_path: Path, guest_shell: GuestShell) -> None:
    _, old, _ = built
    other_flashinfer = house / wheelhouse.download("flashinfer-python", "0.6.12").name
    wheels = [other_flashinfer if w == wheelhouse_default.flashinfer else w for w in wheelhouse_default.wheels]
    remote = counting(sandbox_ssh)
    new = venv_build.ensure_venv(remote, LAYOUT, spec(tmp_path, house, wheels))
    assert new.hash != old.hash and not new.reused
    assert [Path(str(p.dest)).name for p in remote.sent if "/wheels/" in str(p.dest)] == [other_flashinfer.name]
    assert remote.wheel_bytes() == other_flashinfer.stat().st_size
    version = "from importlib.metadata import version; print(version('flashinfer-python'))"
    assert python_says(guest_shell, old.path, version) == "0.7.2"
    assert python_says(guest_shell, new.path, version) == "0.6.12"


def test_a_damaged_wheel_on_the_host_fails_before_pip_and_is_sent_again_next_time(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        wheelhouse_default: wheelhouse.Wheelhouse, house: Path, tmp_path: Path, guest_shell: GuestShell) -> None:
    msgspec = wheelhouse_default.dependencies[0]
    digest = hashlib.sha256(msgspec.read_bytes()).hexdigest()
    on_host = venvs.wheel_dir(LAYOUT, digest) / msgspec.name
    guest_shell.sudo("printf garbage | " + sh("dd", f"of={on_host}", "bs=1", "seek=1000", "conv=notrunc",
                                              "status=none"))
    small = spec(tmp_path, house, [msgspec, wheelhouse_default.sim])
    remote = counting(sandbox_ssh)
    with pytest.raises(StepFailed, match=rf"{re.escape(str(on_host))}: sha256 [0-9a-f]+, expected {digest}; removed"):
        venv_build.ensure_venv(remote, LAYOUT, small)
    python = venv_store.read_facts(sandbox_ssh, LAYOUT, "python3").python
    target = venv_build.venv_hash(venvs.load_lock(small.lock), python)
    assert guest_shell.run(sh("test", "-e", venvs.venv_path(LAYOUT, target)))[0] == 1
    assert remote.sent == []
    rebuilt = venv_build.ensure_venv(remote, LAYOUT, small)
    assert rebuilt.hash == target and rebuilt.wheels_sent == (msgspec.name,)
    assert python_says(guest_shell, rebuilt.path, "import msgspec; print(msgspec.__file__)").startswith(
        str(rebuilt.path))


def test_a_corrupted_wheel_in_the_wheelhouse_fails_before_anything_travels(
        store: None, sandbox_ssh: FabricRemote, wheelhouse_default: wheelhouse.Wheelhouse, tmp_path: Path) -> None:
    # a wheel the host lacks (a local wheel is read only when it would travel: the host's copy is verified there)
    other_sglang = wheelhouse.download("sglang", "0.5.20")
    lock = wheelhouse.write_lock(tmp_path / "requirements.lock", [other_sglang])
    damaged = wheelhouse_default.link_into(tmp_path / "house")
    data = bytearray(other_sglang.read_bytes())
    data[1000] ^= 0xFF
    (damaged / other_sglang.name).write_bytes(bytes(data))
    remote = counting(sandbox_ssh)
    with pytest.raises(ConfigError, match=r"hash mismatch for sglang==0\.5\.20"):
        venv_build.ensure_venv(remote, LAYOUT, venvs.VenvSpec(lock=lock, wheelhouse=damaged))
    assert remote.sent == []


def test_a_uv_failure_shows_uvs_own_error_lines_and_publishes_nothing(
        store: None, sandbox_ssh: FabricRemote, wheelhouse_default: wheelhouse.Wheelhouse, house: Path,
        tmp_path: Path) -> None:
    lock = wheelhouse.write_lock(tmp_path / "requirements.lock", [wheelhouse_default.dependencies[0]])
    # a requirement with a marker may lack a local wheel (uv decides on the host): this one is true there
    lock.write_text(lock.read_text() + f'nosuch==1.0 ; python_version >= "3" --hash=sha256:{"0" * 64}\n')
    with pytest.raises(StepFailed) as raised:
        venv_build.ensure_venv(sandbox_ssh, LAYOUT, venvs.VenvSpec(lock=lock, wheelhouse=house))
    message = str(raised.value)
    assert "uv said:" in message and "nothing was published" in message
    assert "error: No solution found" in message and "there is no version of nosuch==1.0" in message
    facts = venv_store.read_facts(sandbox_ssh, LAYOUT, "python3")
    target = venv_build.venv_hash(venvs.load_lock(lock), facts.python)
    assert f"{target}.tmp" in facts.store.entries and target not in facts.store.entries


@dataclass
class KilledInstall:
    """The sandbox connection, with the install step one that never ends, cut off by the host's `timeout` (uv
    itself may finish within any limit: what matters is a build stopped there)."""

    inner: FabricRemote

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        return self.inner.run([replace(s, argv=("sleep", "600"), timeout_s=1) if s.name == venv_build.INSTALL_STEP
                               else s for s in batch], on_output)

    def close(self) -> None:
        pass


def test_an_interrupted_build_leaves_nothing_usable_and_the_next_run_clears_it(
        store: None, sandbox_ssh: FabricRemote, wheelhouse_default: wheelhouse.Wheelhouse, house: Path,
        tmp_path: Path, guest_shell: GuestShell) -> None:
    other_sglang = house / wheelhouse.download("sglang", "0.5.20").name
    interrupted = spec(tmp_path, house, [other_sglang, *wheelhouse_default.dependencies])
    with pytest.raises(StepTimedOut):
        venv_build.ensure_venv(KilledInstall(sandbox_ssh), LAYOUT, interrupted)
    facts = venv_store.read_facts(sandbox_ssh, LAYOUT, "python3")
    target = venv_build.venv_hash(venvs.load_lock(interrupted.lock), facts.python)
    assert f"{target}.tmp" in facts.store.entries and not facts.store.published(target)
    assert target not in facts.store.entries
    staged_marker = venvs.staging_path(LAYOUT, target) / venvs.MARKER_FILE
    assert guest_shell.run(sh("sudo", "-n", "test", "-e", staged_marker))[0] == 1
    result = venv_build.ensure_venv(sandbox_ssh, LAYOUT, interrupted)
    assert result.hash == target and not result.reused
    entries = guest_shell.sudo(sh("ls", "-A", LAYOUT.venvs)).split()
    assert target in entries and f"{target}.tmp" not in entries


def test_adopt_a_hand_made_venv_reports_drift_and_runs_from_its_new_place(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        wheelhouse_default: wheelhouse.Wheelhouse, guest_shell: GuestShell) -> None:
    msgspec = wheelhouse_default.dependencies[0]
    on_host = venvs.wheel_dir(LAYOUT, hashlib.sha256(msgspec.read_bytes()).hexdigest()) / msgspec.name
    source = PurePosixPath("/root/hand-env")
    edited = source / SITE / "msgspec" / "__init__.py"
    guest_shell.sudo(" && ".join([sh("rm", "-rf", source), sh("python3", "-m", "venv", source),
                                  sh(source / "bin" / "pip", "install", "-q", "--no-index", "--no-deps", on_host),
                                  f"{sh('echo', '# edited by hand')} >> {sh(edited)}"]), timeout_s=300)
    source_pip = guest_shell.sudo(sh("head", "-1", source / "bin" / "pip"))
    result = venv_adopt.adopt(sandbox_ssh, LAYOUT, source)
    assert not result.reused and set(result.drift) == {"msgspec"}
    assert [path for path, _ in result.drift["msgspec"]] == ["msgspec/__init__.py"]
    assert python_says(guest_shell, result.path, "import msgspec; print(msgspec.__file__)") == (
        f"{result.path}/{SITE}/msgspec/__init__.py")
    assert f"{result.path}/{SITE}/pip" in guest_shell.sudo(sh(result.path / "bin" / "pip", "--version"))
    # the source's scripts were not touched
    assert guest_shell.sudo(sh("head", "-1", source / "bin" / "pip")) == source_pip
    marker = json.loads(guest_shell.sudo(sh("cat", result.path / "venv.json")))
    assert marker["kind"] == "adopted" and marker["source"] == str(source) and "msgspec" in marker["drift"]
    assert venv_adopt.adopt(sandbox_ssh, LAYOUT, source).reused


def test_a_derived_venv_leaves_its_base_byte_identical_and_both_run(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        guest_shell: GuestShell) -> None:
    _, base, _ = built
    version_py = f"{SITE}/sglang/version.py"
    before = sums(guest_shell, base.path)
    derived = venv_derive.derive(sandbox_ssh, LAYOUT, base.hash, {version_py: b'__version__ = "0.5.23+patched"\n'})
    assert sums(guest_shell, base.path) == before
    ask = "import sglang.version as v; print(v.__file__, v.__version__)"
    assert python_says(guest_shell, base.path, ask) == f"{base.path}/{version_py} 0.5.23"
    assert python_says(guest_shell, derived.path, ask) == f"{derived.path}/{version_py} 0.5.23+patched"
    def inode(venv: PurePosixPath) -> str:
        return guest_shell.sudo(sh("stat", "-c", "%i", venv / SITE / "sglang" / "__init__.py"))
    assert inode(base.path) == inode(derived.path)  # linked
    marker = json.loads(guest_shell.sudo(sh("cat", derived.path / "venv.json")))
    assert marker["base"] == base.hash and list(marker["replaced"]) == [version_py]
    assert venv_derive.derive(sandbox_ssh, LAYOUT, base.hash, {version_py: b'__version__ = "0.5.23+patched"\n'}).reused


def test_cache_directories_belong_to_the_service_user(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        guest_shell: GuestShell) -> None:
    _, base, _ = built
    sandbox_ssh.run(venvs.cache_dir_steps(LAYOUT, base.hash, "deploy"))
    for directory in venvs.cache_environment(LAYOUT, base.hash).values():
        assert guest_shell.sudo(sh("stat", "-c", "%U", directory)).strip() == "deploy"


def test_list_and_prune_keep_what_kept_releases_use_and_their_bases(
        built: tuple[venvs.VenvSpec, venv_publish.VenvResult, CountingRemote], sandbox_ssh: FabricRemote,
        guest_shell: GuestShell) -> None:
    _, base, _ = built
    facts = venv_store.read_facts(sandbox_ssh, LAYOUT, "python3").store
    derived = next(h for h, m in facts.markers.items() if m.get("base") == base.hash)
    records = {r.hash: r for r in venv_lifecycle.list_venvs(sandbox_ssh, LAYOUT, {"r1": base.hash, "r2": derived})}
    assert records[base.hash].derived == (derived,) and records[derived].releases == ("r2",)
    assert 0 < records[derived].size_bytes < records[base.hash].size_bytes  # hard links count once
    plan = venv_lifecycle.plan_prune(facts, [derived])
    adopted = [h for h, m in facts.markers.items() if m.get("kind") == "adopted"]  # stay until venv.remove
    assert base.hash not in plan.venvs and derived not in plan.venvs and not set(adopted) & set(plan.venvs)
    assert len(plan.venvs) == len(facts.markers) - 2 - len(adopted)
    sandbox_ssh.run(venv_lifecycle.prune_steps(LAYOUT, plan))
    assert sorted(guest_shell.sudo(sh("ls", "-A", LAYOUT.venvs)).split()) == sorted([base.hash, derived, *adopted])
    wheels_left = venv_store.read_facts(sandbox_ssh, LAYOUT, "python3").store.wheels
    assert wheels_left == set(facts.markers[base.hash]["wheels"])
    ask = "import sglang.version as v; print(v.__version__)"
    assert python_says(guest_shell, venvs.venv_path(LAYOUT, derived), ask) == "0.5.23+patched"
