"""The weights phase of a release with new weights, with the page cache of its shards dropped and after the deploy's
pre-read, side by side in one run (`bench/run.py --only page-cache`; issue 41).

Each pair starts from a release with other weights serving and the new shards staged but out of the page cache
(dropped file by file with `dd iflag=nocache count=0`, posix_fadvise DONTNEED: the rest of the machine's cache
stays). Then one deploy with `--no-pre-read`, whose server reads the shards from disk, and one without it, whose
pre-read reads them before the old server stops. The figures are each start's `weights` phase (the server's own
"Load weight begin/end" lines) and the pre-read's time, spent while the old release still served.
"""

from __future__ import annotations

import shlex
import statistics

from bench.figures import Figure
from bench.measure import PROFILE, Rig
from bench.timeline import say
from deploy_lib.commands.deploy import Options
from deploy_lib.health.startup import TIMING_PREFIX
from sandbox import hub

REPO = "bench/preread"
SHARD_VALUES = (50_000_000, 50_000_000)  # two float32 shards of 200 MB each
QUICK_SHARD_VALUES = (250_000,)  # `--quick`: one shard of 1 MB, to check that it runs
CACHE_DIRS = ("/root/.cache/huggingface/hub/models--bench--preread",
              "/root/.cache/huggingface/sglang-deploy/models--bench--preread")
WEIGHTS = TIMING_PREFIX + "weights"


def drop_command() -> str:
    """The new shards' pages out of the guest's page cache, file by file (not the machine-wide drop_caches); a
    snapshot's shards are links to its blobs, which dd follows."""
    dirs = " ".join(shlex.quote(directory) for directory in CACHE_DIRS)
    return f"find {dirs} -name '*.safetensors' -exec dd if={{}} iflag=nocache count=0 status=none ';' " \
           "2>/dev/null || true"


def measure_pre_read(rig: Rig, runs: int, shard_values: tuple[int, ...] = SHARD_VALUES) -> list[Figure]:
    files = hub.stand_in_files(REPO, shard_values=shard_values, seed=41)
    hub.commit(rig.guest.hub, REPO, files, "bench pre-read weights")
    total = sum(len(data) for name, data in files.items() if name.endswith(".safetensors"))
    profiles = rig.project.root / "inventory" / "profiles"

    def profile(name: str, new_weights: bool) -> str:
        """A release of its own (its env differs), on the new weights or on the base profile's."""
        model = f"model:\n  path: {REPO}\n" if new_weights else ""
        (profiles / f"{name}.yaml").write_text(f"extends: {PROFILE}\n{model}env:\n  BENCH_PRE_READ: '{name}'\n")
        return name

    def deploy(name: str, pre_read: bool = True) -> dict[str, float]:
        with rig.command(name, Options(pre_read=pre_read)) as (_remote, _progress, run):
            outcome = run()
        assert outcome.action == "deployed", outcome.action
        return dict(outcome.timings)

    deploy(profile("bench-pre-read-stage", True))  # stages the new weights once; this start is not measured
    dropped: list[float] = []
    warmed: list[float] = []
    reads: list[float] = []
    for run in range(runs):
        for pre_read in (False, True):
            deploy(profile(f"bench-pre-read-other-{run}-{pre_read:d}", False))
            rig.root(drop_command())
            timings = deploy(profile(f"bench-pre-read-{run}-{pre_read:d}", True), pre_read)
            (warmed if pre_read else dropped).append(timings[WEIGHTS])
            if pre_read:
                reads.append(timings.get("page cache", 0.0))
        say(f"weights phase, {total / 1e6:.0f} MB of new weights: page cache dropped {dropped[-1]:.2f} s, "
            f"after the pre-read {warmed[-1]:.2f} s (the pre-read itself {reads[-1]:.2f} s, before the stop)")
    cold, warm = statistics.median(dropped), statistics.median(warmed)
    return [Figure(f"weights phase, {total / 1e6:.0f} MB of new weights: page cache dropped | after the pre-read",
                   f"{cold:.2f} s | {warm:.2f} s", runs, "pre-read < dropped", warm < cold),
            Figure("  the pre-read, while the old release still serves", f"{statistics.median(reads):.2f} s", runs,
                   "", None)]
