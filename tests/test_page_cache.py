"""The new release's weights and the page cache: the pure decision (fits, what to read), the host script on real
files of this machine (mincore, the read), and the deploy's wiring against a scripted host (no SSH)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.deploy_plan import PROJECT, target
from helpers.deploy_trips import serving_the_profile
from helpers.fake_remote import FakeRemote
from helpers.recording_progress import RecordingProgress
from helpers.rollback import LAYOUT, ScriptedHost, changed_profile
from helpers.tune_group import replica
from helpers.tune_loop import a_sweep_host, sglang_knowing_every_flag
from rich.console import Console

from deploy_cli import present, reports
from deploy_lib.commands.deploy import PRE_READ_OFF, Options, Outcome, deploy
from deploy_lib.commands.status import read_status
from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.facts.host import FACT_RELEASE_SUMS, FACT_UNIT
from deploy_lib.host.page_cache import warm_weights
from deploy_lib.models import HubModel, ModelFile
from deploy_lib.models.page_cache import (
    MARGIN_BYTES,
    MEASURE,
    READ,
    FileResidency,
    Residency,
    Warm,
    decide,
    measure_step,
    measure_weights_step,
    parse_read,
    parse_residency,
    plan_lines,
    read_step,
    weights_root,
)
from deploy_lib.ops.multinode import plan_nodes
from deploy_lib.ops.multinode_deploy import deploy_nodes
from deploy_lib.ops.scope import Scope
from deploy_lib.remote import Put, Step, StepResult
from deploy_lib.store import (
    FACT_CURRENT,
    FACT_LOCK,
    FACT_RELEASE_DIRS,
    FACT_RELEASE_FILES,
    RELEASE_FILE,
    StoreLayout,
    Tags,
)

REPO = Path(__file__).resolve().parent.parent
GB = 1000 ** 3
SNAPSHOT = "/root/.cache/huggingface/hub/models--lukealonso--GLM-5-NVFP4/snapshots/" + "c" * 40


def test_the_weights_root_is_the_snapshot_the_version_directory_or_the_host_path() -> None:
    hub = {"path": "org/name", "revision": "main", "commit": "a" * 40, "hf_home": "/srv/hf"}
    assert weights_root(hub) == "/srv/hf/hub/models--org--name/snapshots/" + "a" * 40
    assert weights_root({"path": "/srv/models/0123456789abcdef", "pushed_from": "/home/me/w"}) == \
        "/srv/models/0123456789abcdef"
    assert weights_root({"path": "/data/glm5"}) == "/data/glm5"
    assert weights_root({"path": "org/name", "revision": "main"}) is None, "a hub model recorded without its cache"


def _reading(*files: tuple[int, int | None], available: int | None = 200 * GB) -> Residency:
    return Residency(tuple(FileResidency(f"/w/{n}.safetensors", size, resident)
                           for n, (size, resident) in enumerate(files)), available)


def test_weights_that_fit_are_read_only_where_not_resident() -> None:
    decision = decide(_reading((10 * GB, 10 * GB), (10 * GB, 0), (10 * GB, 5 * GB)))
    assert decision.warm is Warm.read
    assert decision.files == ("/w/1.safetensors", "/w/2.safetensors"), "the resident file is not read again"
    assert (decision.to_read_bytes, decision.weights_bytes) == (15 * GB, 30 * GB)
    assert decision.line().startswith("page cache: 15.0 GB of the new weights (30.0 GB) to read in 2 files")


def test_resident_weights_read_nothing() -> None:
    decision = decide(_reading((10 * GB, 10 * GB), (10 * GB, int(9.95 * GB))))
    assert (decision.warm, decision.files, decision.to_read_bytes) == (Warm.resident, (), 0)
    assert decision.line() == "page cache: the new weights (20.0 GB) are resident already; nothing to read"


def test_weights_the_memory_cannot_hold_are_not_read_and_the_figures_are_said() -> None:
    weights = 100 * GB
    needed = weights + MARGIN_BYTES + weights // 10
    decision = decide(_reading((weights, 0), available=needed - 1))
    assert (decision.warm, decision.files) == (Warm.does_not_fit, ())
    assert decision.line() == (f"page cache: the new weights are not read in before the stop: 100.0 GB to read "
                               f"(100.0 GB in all) with a margin needs {needed / GB:.1f} GB, only "
                               f"{(needed - 1) / GB:.1f} GB memory is available; the server reads them from disk "
                               "while it starts")
    assert decide(_reading((weights, 0), available=needed)).warm is Warm.read, "exactly enough fits"


def test_residency_mincore_cannot_tell_is_read_whole_and_memory_unknown_reads_nothing() -> None:
    unknown = decide(_reading((10 * GB, None)))
    assert (unknown.warm, unknown.to_read_bytes) == (Warm.read, 10 * GB)
    assert _reading((10 * GB, None)).line("release r").endswith("in the page cache: unknown (mincore not available)")
    no_memory = decide(_reading((10 * GB, 0), available=None))
    assert no_memory.warm is Warm.unknown and "MemAvailable could not be read" in no_memory.line()
    assert decide("page_cache.py exited 1: boom").warm is Warm.unknown
    assert decide(_reading()).warm is Warm.unknown, "no weight files: nothing to decide"


def _result(step: Step, stdout: str, exit_code: int = 0, stderr: str = "") -> StepResult:
    return StepResult(step, exit_code, stdout, stderr, 0.0)


def test_the_script_results_are_parsed_and_a_failed_run_says_why() -> None:
    step = measure_step("/w")
    out = 'RESULT {"files": [{"path": "/b/x", "size": 8192, "resident": 4096}], "mem_available": 1000}\n'
    assert parse_residency(_result(step, out)) == Residency((FileResidency("/b/x", 8192, 4096),), 1000)
    assert parse_residency(_result(step, "", 1, "Traceback\nPermissionError: denied\n")) == \
        "page_cache.py exited 1: PermissionError: denied"
    assert parse_residency(_result(step, 'RESULT {"files": [{"path": "/b/x"}]}\n')).startswith("page_cache.py's "
                                                                                               "result is incomplete")
    assert parse_read(_result(read_step(["/b/x"]), 'PROGRESS 1 1 1 1\nRESULT {"read_bytes": 8192}\n')) == 8192


def test_a_plan_says_both_releases_residency_and_decides_unstaged_weights_from_their_listed_sizes() -> None:
    current = ("current release B", _reading((10 * GB, 10 * GB), available=15 * GB))
    listed = (ModelFile("config.json", 10, "b1"), ModelFile("model-1.safetensors", 20 * GB, "b2"))
    lines = plan_lines(current, None, staged=False, listed=listed)
    assert lines[0] == "weights of current release B: 10.0 GB in 1 file, 10.0 GB (100%) in the page cache"
    assert lines[1].startswith("page cache: the new weights are not read in before the stop: 20.0 GB to read"), \
        "the listed weight file (not config.json), against the memory the current reading saw"
    new = ("release N", _reading((10 * GB, 0)))
    assert plan_lines(current, new, staged=True, listed=())[1:] == (
        "weights of release N: 10.0 GB in 1 file, 0 B (0%) in the page cache",
        "page cache: 10.0 GB of the new weights (10.0 GB) to read in 1 file before the old server stops (200.0 GB "
        "memory available)")
    same = plan_lines(current, None, staged=True, listed=(), same_weights=True)
    assert same == ("weights of current release B, the new release's too: 10.0 GB in 1 file, 10.0 GB (100%) in "
                    "the page cache", "page cache: the new weights (10.0 GB) are resident already; nothing to read")


# The host script on this machine's own files (loopback: no sandbox, no SSH), sent as a host's python3 gets it.

def _run_script(step: Step) -> StepResult:
    done = subprocess.run([sys.executable, *step.argv[1:]], input=step.stdin, capture_output=True, check=False)
    return StepResult(step, done.returncode, done.stdout.decode(), done.stderr.decode(), 0.0)


def test_the_host_script_finds_each_weight_file_once_and_mincore_sees_the_read(tmp_path: Path) -> None:
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "c"
    blobs.mkdir()
    (snapshot / "sub").mkdir(parents=True)
    with open(blobs / "w1", "wb") as blob:  # written, flushed to disk and dropped from the page cache
        blob.write(bytes(range(256)) * (8 << 12))
        blob.flush()
        os.fsync(blob.fileno())
        os.posix_fadvise(blob.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    (snapshot / "model-1.safetensors").symlink_to(blobs / "w1")
    (snapshot / "sub" / "again.safetensors").symlink_to(blobs / "w1")
    (snapshot / "config.json").write_text("{}")
    (snapshot / "gone.safetensors").symlink_to(blobs / "missing")
    before = parse_residency(_run_script(measure_step(str(snapshot))))
    assert isinstance(before, Residency)
    assert [(f.path, f.size) for f in before.files] == [(str(blobs / "w1"), 8 << 20)], \
        "one file through two links; config.json and a dangling link are not weights"
    assert before.files[0].resident == 0 and before.mem_available and before.mem_available > 0
    decision = decide(before)
    assert decision.warm is Warm.read and decision.files == (str(blobs / "w1"),)
    result = _run_script(read_step(decision.files))
    assert parse_read(result) == 8 << 20
    assert result.stdout.splitlines()[-2] == f"PROGRESS {8 << 20} {8 << 20} 1 1"
    after = parse_residency(_run_script(measure_step(str(snapshot))))
    assert isinstance(after, Residency) and after.files[0].resident is not None
    assert after.files[0].resident >= 0.99 * (8 << 20), "all of it resident (a page reclaimed since may be missing)"
    assert decide(after).warm is Warm.resident, "read once, then nothing to read again"


def test_a_missing_root_has_no_weights_and_a_missing_file_fails_the_read_with_its_reason(tmp_path: Path) -> None:
    empty = parse_residency(_run_script(measure_step(str(tmp_path / "none"))))
    assert isinstance(empty, Residency) and empty.files == ()
    failed = parse_read(_run_script(read_step([str(tmp_path / "gone.safetensors")])))
    assert isinstance(failed, str) and failed.startswith("page_cache.py exited 1: FileNotFoundError")


def test_the_read_shows_bytes_rate_and_files_as_a_transfer() -> None:
    remote = FakeRemote().reply(READ, stdout="PROGRESS 0 20000000000 0 2\nPROGRESS 10000000000 20000000000 1 2\n"
                                             "PROGRESS 20000000000 20000000000 2 2\n"
                                             'RESULT {"read_bytes": 20000000000, "files": 2}\n')
    progress, ticks = RecordingProgress(), iter(range(0, 100, 10))
    decision = decide(_reading((10 * GB, 0), (10 * GB, 0)))
    assert warm_weights(remote, decision, progress, lambda: float(next(ticks))) == 20 * GB
    assert progress.of_kind("transfer")[:2] == ["page cache: 0 B / 20.0 GB (0%), 0 B/s, file 1 of 2",
                                                "page cache: 10.0 GB / 20.0 GB (50%), 500.0 MB/s, ETA 0:00:20, "
                                                "file 2 of 2"]
    assert progress.of_kind("note") == ["page cache: 20.0 GB of weights read in 2 files"]


# The deploy's wiring, against the scripted host of the deploy tests.

def _measured(files: list[tuple[int, int]], available: int) -> str:
    return "RESULT " + json.dumps({"root": SNAPSHOT, "files": [{"path": f"/b/{n}", "size": size, "resident": resident}
                                             for n, (size, resident) in enumerate(files)],
                                   "mem_available": available}) + "\n"


def _names(host: FakeRemote) -> list[str]:
    return host.ran_names()


def _measuring(step: Step | Put) -> bool:
    return step.name.startswith(MEASURE) if isinstance(step, Step) else False


WARM_CASES = pytest.mark.parametrize(("files", "available", "reads", "said"), [
    ([(10 * GB, 0), (10 * GB, 10 * GB)], 100 * GB, ["/b/0"], "page cache: 10.0 GB of the new weights (20.0 GB) to "
                                                              "read in 1 file before the old server stops"),
    ([(10 * GB, 10 * GB)], 100 * GB, None, "page cache: the new weights (10.0 GB) are resident already"),
    ([(100 * GB, 0)], 50 * GB, None, "page cache: the new weights are not read in before the stop: 100.0 GB to read"),
])


@WARM_CASES
def test_a_deploy_reads_the_weights_before_the_old_server_stops_only_when_they_fit_and_are_not_resident(
        files: list[tuple[int, int]], available: int, reads: list[str] | None, said: str) -> None:
    host, _ = serving_the_profile()
    host.reply(_measuring, stdout=_measured(files, available))
    host.reply(READ, stdout='RESULT {"read_bytes": 10000000000}\n')
    progress = RecordingProgress()
    assert deploy(changed_profile(), target(), host, progress, Options(grace_s=0)).action == "deployed"
    _read_before_the_stop_only_when_decided(host, progress, reads, said)


def _release_b_to_roll_back_to() -> ScriptedHost:
    """The profile's release current and serving, and release B (its copy, with the same weights) intact."""
    host, rid = serving_the_profile()
    metadata = json.loads(host.file_text(LAYOUT.staging(rid) / RELEASE_FILE))
    sums = "".join(f"{digest}  /x/{name}\n" for name, digest in metadata["files"].items())
    host.reply(FACT_RELEASE_SUMS, stdout=sums)
    return host


@WARM_CASES
def test_a_rollback_reads_its_releases_weights_before_the_old_server_stops_by_the_same_rules(
        files: list[tuple[int, int]], available: int, reads: list[str] | None, said: str) -> None:
    """A tuning sweep switches back through the same rollback (commands/tune_candidate.py)."""
    host = _release_b_to_roll_back_to()
    host.reply(_measuring, stdout=_measured(files, available))
    host.reply(READ, stdout='RESULT {"read_bytes": 10000000000}\n')
    assert host.rollback("B").action == "rolled back"  # type: ignore[attr-defined]
    [measured] = [step for step in host.ran if _measuring(step)]
    assert isinstance(measured, Step) and measured.name == f"{MEASURE}: {SNAPSHOT}", "release B's own weights"
    _read_before_the_stop_only_when_decided(host, host.progress, reads, said)


def test_a_rollback_whose_read_fails_goes_on_with_a_note() -> None:
    host = _release_b_to_roll_back_to()
    host.reply(_measuring, stdout=_measured([(10 * GB, 0)], 100 * GB))
    host.reply(READ, exit_code=1, stderr="Traceback\nOSError: [Errno 5] Input/output error\n")
    assert host.rollback("B").action == "rolled back"  # type: ignore[attr-defined]
    assert "page cache: the weights were not read in (page_cache.py exited 1: OSError: [Errno 5] Input/output " \
           "error); the server reads them from disk" in host.progress.of_kind("note")


def _read_before_the_stop_only_when_decided(host: FakeRemote, progress: RecordingProgress, reads: list[str] | None,
                                            said: str) -> None:
    names = _names(host)
    assert any(str(note).startswith(said) for note in progress.of_kind("note"))
    if reads is None:
        assert READ not in names
        return
    [step] = [step for step in host.ran if step.name == READ]
    assert isinstance(step, Step) and json.loads((step.stdin or b"").splitlines()[0]) == {"files": reads}
    stop = next(i for i, name in enumerate(names) if name.startswith("switch"))
    assert names.index(READ) < stop, "read while the old release still serves"
    assert ("phase", "page cache") in progress.events


def test_a_deploy_with_no_pre_read_reads_nothing_before_the_stop_and_says_so() -> None:
    host, _ = serving_the_profile()
    host.reply(_measuring, stdout=_measured([(10 * GB, 0)], 100 * GB))
    host.reply(READ, stdout='RESULT {"read_bytes": 10000000000}\n')
    progress = RecordingProgress()
    assert deploy(changed_profile(), target(), host, progress, Options(grace_s=0, pre_read=False)).action == "deployed"
    assert READ not in _names(host), "the weights would fit: only the switch keeps them unread"
    assert PRE_READ_OFF in progress.of_kind("note")


def _three_nodes(options: Options) -> tuple[dict[str, FakeRemote], dict[str, RecordingProgress], list[Outcome]]:
    """glm5-nvfp4-3nodes deployed with `options` over three scripted hosts whose weights (10 GB) fit in memory and
    are not resident: each host, its progress, and the outcomes."""
    hosts = {name: a_sweep_host("memory.max_running_requests=256") for name in ("n1", "n2", "n3")}
    nodes = plan_nodes(PROJECT.profile("glm5-nvfp4-3nodes"),
                       Scope(PROJECT.inventory(None), tuple(replica(name) for name in hosts), group="pair").targets,
                       "pair")
    for host in hosts.values():
        sglang_knowing_every_flag(host, *(node.loaded for node in nodes))
        host.reply(_measuring, stdout=_measured([(10 * GB, 0)], 100 * GB))
        host.reply(READ, stdout='RESULT {"read_bytes": 10000000000}\n')
    progress = {name: RecordingProgress() for name in hosts}
    return dict(hosts), progress, deploy_nodes(nodes, dict(hosts), progress.__getitem__, options)


@pytest.mark.parametrize("pre_read", [True, False])
def test_a_multi_node_deploy_reads_each_nodes_weights_before_the_stop_unless_no_pre_read(pre_read: bool) -> None:
    hosts, progress, outcomes = _three_nodes(Options(grace_s=0, pre_read=pre_read))
    assert [outcome.action for outcome in outcomes] == ["deployed"] * 3
    for name, host in hosts.items():
        if pre_read:
            _read_before_the_stop_only_when_decided(host, progress[name], ["/b/0"], "page cache: 10.0 GB of the new "
                                                    "weights (10.0 GB) to read in 1 file before the old server stops")
        else:
            assert READ not in _names(host), f"{name}: the weights would fit: only --no-pre-read keeps them unread"
            assert PRE_READ_OFF in progress[name].of_kind("note")


def test_a_dry_run_shows_how_much_of_the_weights_is_resident_and_what_the_deploy_would_read() -> None:
    host, _ = serving_the_profile()
    host.reply(_measuring, stdout=_measured([(10 * GB, 4 * GB)], 100 * GB))
    planned = deploy(changed_profile(), target(), host, RecordingProgress(), Options(dry_run=True))
    assert planned.plan is not None
    notes = [line for line in planned.plan.dry_run_lines() if "page cache" in line]
    assert notes[0].startswith("  note: weights of current release ") and \
        notes[0].endswith(", the new release's too: 10.0 GB in 1 file, 4.0 GB (40%) in the page cache")
    assert notes[1] == ("  note: page cache: 6.0 GB of the new weights (10.0 GB) to read in 1 file before the old "
                        "server stops (100.0 GB memory available)")
    assert READ not in _names(host), "a plan reads nothing in"
    assert sum(name.startswith(MEASURE) for name in _names(host)) == 1, \
        "the weights are the current release's: measured once, in the decision's read"


def test_a_multi_node_dry_run_shows_each_nodes_weights_resident_and_what_its_deploy_would_read() -> None:
    hosts, _, outcomes = _three_nodes(Options(dry_run=True))
    for host, outcome in zip(hosts.values(), outcomes, strict=True):
        assert outcome.plan is not None
        notes = [line for line in outcome.plan.dry_run_lines() if "page cache" in line]
        assert notes[0] == f"  note: weights of release {outcome.release_id}: 10.0 GB in 1 file, 0 B (0%) in the " \
                           "page cache", notes
        assert notes[1] == ("  note: page cache: 10.0 GB of the new weights (10.0 GB) to read in 1 file before the "
                            "old server stops (100.0 GB memory available)")
        assert READ not in _names(host), "a plan reads nothing in"


def test_a_hub_revision_is_found_by_the_host_through_its_cache_refs_before_any_plan(tmp_path: Path) -> None:
    commit = "d" * 40
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "model.safetensors").write_bytes(b"x" * 4096)
    model = HubModel("org/name", "main", (), (), str(tmp_path), None, "nobody")
    reading = parse_residency(_run_script(measure_weights_step(model)))
    assert isinstance(reading, Residency) and reading.root == str(repo / "snapshots" / commit)
    assert reading.root == weights_root({"path": "org/name", "commit": commit, "hf_home": str(tmp_path)}), \
        "the root the plan's release will name"
    assert reading.total_bytes == 4096
    unknown = replace(model, revision="v2")
    later = parse_residency(_run_script(measure_weights_step(unknown)))
    assert isinstance(later, Residency) and (later.root, later.files) == (None, ()), "a tag the cache does not hold"


def test_status_shows_how_much_of_the_current_releases_weights_is_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    tags = Tags("ops@laptop", "gpu1", "r1", "glm5-nvfp4", "ph", {"sglang": "0.5.23"})
    metadata = {"id": "r1", "staged_at": "2026-11-30T10:00:00+00:00", "tags": tags.as_dict(),
                "sglang_version": "0.5.23", "model": {"path": "/data/glm5"},
                "profile": {"server": {"host": "0.0.0.0", "port": 8000}, "features": {"metrics": False}}}
    layout = StoreLayout("sglang")
    remote = (FakeRemote()
              .reply(FACT_LOCK, exit_code=1)
              .reply(FACT_CURRENT, stdout="releases/r1\n")
              .reply(FACT_RELEASE_DIRS, stdout="r1\0r1/release.json\0r1/sglang.service\0r1/sglang.env\0")
              .reply(FACT_RELEASE_FILES, stdout=f"{layout.releases}/r1/release.json\0{json.dumps(metadata)}\n")
              .reply(FACT_UNIT, stdout="ActiveState=active\nSubState=running\nLoadState=loaded\n")
              .reply(lambda step: step.name.startswith("readiness probe"),
                     stdout='{"port_open": true, "health_status": 200}\n')
              .reply(measure_step("/data/glm5").name, stdout=_measured([(8 * GB, 2 * GB)], 100 * GB)))
    report = read_status(resolve_target(Project(REPO).inventory(None), None), "sglang", remote)
    assert report.weights_cache == "weights of release r1: 8.0 GB in 1 file, 2.0 GB (25%) in the page cache"
    out = io.StringIO()
    monkeypatch.setattr(present, "console", Console(file=out, width=200))
    reports.print_status(report)
    assert report.weights_cache in out.getvalue()
