"""The venv and model figures of bench/run.py (`--only venvs`, `--only models`)."""

from __future__ import annotations

import shlex
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from bench.figures import LARGE_WHEEL, Figure, VenvRuns, venv_figures
from bench.measure import PROFILE, VENV_LAYOUT, Rig, VenvRun, ensure_venv_timed
from bench.timeline import say
from deploy_lib import venvs
from deploy_lib.deploy.project import load_for_host
from deploy_lib.host import venv_build, venv_store
from deploy_lib.remote import FabricRemote
from sandbox import hub, wheelhouse

# flashinfer-python versions other than the wheelhouse's, one per "one changed package" run
OTHER_FLASHINFER = ("0.6.12", "0.6.16.post4", "0.6.17")


MODEL_REPO = "bench/weights"
MODEL_PROFILE = "bench-model"
MODEL_SHARD_VALUES = (25_000_000, 25_000_000)  # two float32 shards of 100 MB each
QUICK_SHARD_VALUES = (250_000,)  # `--quick`: one shard of 1 MB
MODEL_CACHE = "/root/.cache/huggingface"


def measure_models(rig: Rig, runs: int, shard_values: tuple[int, ...] = MODEL_SHARD_VALUES) -> list[Figure]:
    """Staging a model (200 MB; 1 MB in `--quick`) from the guest's hub into its HF cache (the model phase of a
    deploy), against rsync of the same files over SSH on the same veth; then an unchanged model: the no-op
    redeploy's round trips."""
    files = hub.stand_in_files(MODEL_REPO, shard_values=shard_values)
    hub.commit(rig.guest.hub, MODEL_REPO, files, "bench weights")
    total = sum(len(data) for name, data in files.items() if not name.endswith(".md"))
    (rig.project.root / "inventory" / "profiles" / f"{MODEL_PROFILE}.yaml").write_text(
        f"extends: {PROFILE}\nmodel:\n  path: {MODEL_REPO}\n")
    model_dirs = f"{MODEL_CACHE}/hub/models--bench--weights {MODEL_CACHE}/sglang-deploy/models--bench--weights"
    forget = f"rm -rf {model_dirs} /tmp/bench-raw"
    source = rig.guest.hub.repo_dir(MODEL_REPO)
    ssh = shlex.join(rig.guest.ssh_argv("root")[:-1])
    staged, copied, round_trips, rewritten = [], [], [], []
    for _ in range(runs):
        rig.root(forget)
        with rig.command(MODEL_PROFILE) as (remote, _progress, deploy):
            outcome = deploy()
        staged.append(total / outcome.timings["model"] / 1e6)
        started = time.time()
        subprocess.run(["rsync", "-a", "-e", ssh, *[str(source / name) for name in files if not name.endswith(".md")],
                        f"root@{rig.guest.guest_ip}:/tmp/bench-raw/"], check=True, capture_output=True)
        copied.append(total / (time.time() - started) / 1e6)
        rig.root("touch /tmp/bench-before-no-op")
        with rig.command(MODEL_PROFILE) as (remote, _progress, deploy):
            again = deploy()
        assert again.action == "unchanged", again.action
        round_trips.append(remote.inner.round_trips)
        rewritten.append(sum(int(size) for size in rig.root(
            f"find {model_dirs} -type f -newer /tmp/bench-before-no-op -printf '%s\\n' 2>/dev/null || true").split()))
        say(f"model: staged {staged[-1]:.0f} MB/s, rsync {copied[-1]:.0f} MB/s, no-op {round_trips[-1]} round trips, "
            f"{rewritten[-1]} B written into the cache")
    ratio = statistics.median(staged) / statistics.median(copied)
    return [
        model_no_op_figure(round_trips, rewritten),
        Figure(f"model staging, {total / 1e6:.0f} MB hub -> HF cache (snapshot_download)",
               f"{statistics.median(staged):.0f} MB/s ({min(staged):.0f}-{max(staged):.0f})", runs, "", None),
        Figure("  raw copy of the same files (rsync over ssh, same veth)",
               f"{statistics.median(copied):.0f} MB/s ({min(copied):.0f}-{max(copied):.0f})", runs, "", None),
        Figure("  staging / raw copy", f"{ratio:.2f}x", runs, "", None),
    ]


def model_no_op_figure(round_trips: Sequence[int], rewritten: Sequence[int]) -> Figure:
    """An unchanged model's redeploy: its round trips, and the bytes it wrote into the model cache (each run's files
    newer than the instant before it), judged: none in any run."""
    # the model's plan rides in the facts' round trip (tests/sandbox/test_models_sandbox.py asserts it)
    return Figure("model unchanged: no-op redeploy round trips (lock, facts + model plan, unlock) / bytes staged",
                  f"{statistics.median(round_trips):g} / {max(rewritten)} B", len(rewritten), "0 B",
                  max(rewritten) == 0)


def measure_venvs(rig: Rig, house: wheelhouse.Wheelhouse, runs: int, changed_runs: int, work: Path) -> list[Figure]:
    others = [wheelhouse.download("flashinfer-python", version) for version in OTHER_FLASHINFER[:changed_runs]]
    large = wheelhouse.download(*LARGE_WHEEL)
    directory = house.link_into(work / "wheelhouse", *others, large)
    _, target = load_for_host(rig.project, PROFILE, rig.inventory, None)
    rig.root(f"rm -rf {shlex.quote(str(VENV_LAYOUT.base))}")  # a host that has never seen these wheels

    def spec(name: str, wheels: Sequence[Path]) -> venvs.VenvSpec:
        return venvs.VenvSpec(lock=wheelhouse.write_lock(work / name, wheels), wheelhouse=directory)

    def rebuilt(built: venvs.VenvSpec) -> VenvRun:
        """The published venv of `built` removed (its wheels and uv's cache stay), then built again."""
        venv = venvs.venv_path(VENV_LAYOUT, venv_build.venv_hash(venvs.load_lock(built.lock), facts.python))
        rig.root(f"rm -rf {shlex.quote(str(venv))}")
        return ensure_venv_timed(target.ssh, built)

    base = spec("base.lock", house.wheels)
    first = ensure_venv_timed(target.ssh, base)
    say(f"venv built: {len(first.wheels_sent)} wheels, {first.bytes_sent / 1e6:.1f} MB in {first.seconds:.1f} s")
    with FabricRemote(target.ssh) as remote:
        facts = venv_store.read_facts(remote, VENV_LAYOUT, base.python)
    unchanged = [ensure_venv_timed(target.ssh, base) for _ in range(runs)]
    changed = []
    for number, other in enumerate(others):
        wheels = [other if wheel == house.flashinfer else wheel for wheel in house.wheels]
        changed.append(ensure_venv_timed(target.ssh, spec(f"changed-{number}.lock", wheels)))
        say(f"venv, {other.name}: {changed[-1].wheels_sent}, {changed[-1].seconds:.1f} s")
    fresh = [rebuilt(base) for _ in range(runs)]
    say(f"venv, fresh from a warm cache: {', '.join(f'{run.seconds:.2f} s' for run in fresh)}")
    with_large = spec("large.lock", [*house.wheels, large])
    large_first = ensure_venv_timed(target.ssh, with_large)
    large_fresh = [rebuilt(with_large) for _ in range(runs)]
    say(f"venv with {large.name}: first {large_first.seconds:.1f} s, then "
        f"{', '.join(f'{run.seconds:.2f} s' for run in large_fresh)}")
    return venv_figures(VenvRuns(unchanged, changed, [directory / other.name for other in others], fresh,
                                 large_first, large_fresh, large.stat().st_size))

