"""Model weights as part of the release, without a host: the hub model a profile names, the staging step, the
host script's results, the disk and hub checks, progress lines, and what the plan does with a resolved commit."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import pytest
from helpers.deploy_plan import NOW, PROJECT, deployed, facts, target
from helpers.fake_remote import FakeRemote
from helpers.host_facts import bare_venv
from helpers.recording_progress import RecordingProgress

from deploy_lib.deploy.plan import plan_deploy
from deploy_lib.errors import ConfigError, PreflightError, RemoteError
from deploy_lib.host.models import (
    FACT_BASE,
    FACT_CACHE,
    listing_steps,
    model_locations,
    parse_stored,
    prune_models,
    push_model,
    stage_model,
)
from deploy_lib.inventory.model import HostVars
from deploy_lib.models import (
    BOOTSTRAP,
    MIN_FREE_AFTER_BYTES,
    STAGE_MODEL,
    HostPathModel,
    ModelFacts,
    ModelFile,
    PushedModel,
    TransferMeter,
    check_model,
    hub_model,
    parse_model_result,
    parse_versions,
    weights,
)
from deploy_lib.profile import ModelSource, Profile
from deploy_lib.release.server_args import sglang_args
from deploy_lib.remote import JumpHost, SSHTarget, Step, StepResult, rsync_argv
from deploy_lib.remote.ssh import CHANNEL_OPEN_S, KEEPALIVE_S

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
TOKEN = "hf_secret_token_value"
FILES = (ModelFile("config.json", 120, "c1"), ModelFile("model-00001-of-00002.safetensors", 4_000_000, "w1"),
         ModelFile("model-00002-of-00002.safetensors", 2_000_000, "w2"))


def reference() -> Profile:
    return PROJECT.profile("glm5-nvfp4").profile


def with_model(profile: Profile, **changes: object) -> Profile:
    return profile.model_copy(update={"model": profile.model.model_copy(update=changes)})


def model_facts(commit: str = COMMIT_A, missing: tuple[str, ...] = (), missing_bytes: int = 0,
                free: int = 10**12) -> ModelFacts:
    return ModelFacts(commit=commit, files=FILES, missing=missing, missing_bytes=missing_bytes, free_bytes=free,
                      hf_home="/root/.cache/huggingface", asked_hub=True)


def result(stdout: str, exit_code: int = 0, stderr: str = "") -> StepResult:
    return StepResult(Step("x", ("true",)), exit_code, stdout, stderr, 0.0)


def result_line(payload: dict[str, object]) -> str:
    return f"RESULT {json.dumps(payload)}\n"


# --- which model, and how the host is asked -----------------------------------------------------------------

def test_a_repo_id_is_a_hub_model_at_main_unless_a_revision_is_pinned() -> None:
    model = hub_model(reference(), HostVars(), {})
    assert model is not None and (model.repo, model.revision) == ("lukealonso/GLM-5-NVFP4", "main")
    pinned = hub_model(with_model(reference(), revision="v1.0"), HostVars(), {})
    assert pinned is not None and pinned.revision == "v1.0"


def test_an_absolute_model_path_has_nothing_to_stage_and_no_revision() -> None:
    assert hub_model(with_model(reference(), path="/srv/models/glm5"), HostVars(), {}) is None
    with pytest.raises(ValueError, match=r"absolute model\.path .* has no revision"):
        Profile.model_validate({**reference().model_dump(mode="json"),
                                "model": {"path": "/srv/models/glm5", "revision": "main"}})


def test_a_model_path_that_is_neither_a_repo_id_nor_absolute_is_refused_before_ssh() -> None:
    with pytest.raises(ConfigError, match="neither an absolute path nor a hub repo id"):
        hub_model(with_model(reference(), path="org/name/extra"), HostVars(), {})


def test_the_host_vars_choose_the_cache_and_the_hub_over_the_profile_env() -> None:
    profile = reference().model_copy(update={"env": {"HF_HOME": "/data/hf", "HF_ENDPOINT": "http://mirror:1"}})
    from_profile = hub_model(profile, HostVars(), {})
    assert from_profile is not None and (from_profile.hf_home, from_profile.endpoint) == ("/data/hf", "http://mirror:1")
    from_host = hub_model(profile, HostVars(hf_home="/big/hf", hf_endpoint="http://10.0.0.1:8090"), {})
    assert from_host is not None and (from_host.hf_home, from_host.endpoint) == ("/big/hf", "http://10.0.0.1:8090")


def test_the_token_reaches_the_host_on_stdin_only_and_marks_the_step_secret() -> None:
    model = hub_model(reference(), HostVars(), {"HF_TOKEN": TOKEN})
    assert model is not None and TOKEN not in repr(model)
    step = model.step("/opt/ml-env", "plan")
    assert not any(TOKEN in arg for arg in step.argv) and step.secret
    assert step.stdin is not None and json.loads(step.stdin.split(b"\n", 1)[0])["token"] == TOKEN
    assert TOKEN not in repr(step)
    without = hub_model(reference(), HostVars(), {})
    assert without is not None and not without.step("/opt/ml-env", "plan").secret


def test_the_step_runs_the_venv_python_as_the_service_user() -> None:
    profile = reference().model_copy(update={"service": reference().service.model_copy(update={"user": "sglang"})})
    model = hub_model(profile, HostVars(), {})
    assert model is not None
    step = model.step("/opt/ml-env", "stage", COMMIT_A)
    assert step.argv[:5] == ("runuser", "-u", "sglang", "--", "/opt/ml-env/bin/python3") and step.sudo
    assert step.name == STAGE_MODEL
    assert json.loads(step.stdin.split(b"\n", 1)[0])["revision"] == COMMIT_A  # type: ignore[union-attr]


def test_the_bootstrap_runs_the_script_that_follows_the_request_on_stdin(tmp_path: Path) -> None:
    """The real bootstrap and script, here in a venv without huggingface_hub (made here with nothing installed, so
    it cannot be importable whatever this machine has): the script itself reports that as data. It used to skip
    when huggingface_hub happened to be importable, checking nothing."""
    bare_venv(tmp_path / "venv")
    model = hub_model(reference(), HostVars(), {})
    assert model is not None
    step = model.step(str(tmp_path / "venv"), "plan")
    done = subprocess.run([str(tmp_path / "venv" / "bin" / "python3"), "-I", "-S", "-c", BOOTSTRAP],
                          input=step.stdin, capture_output=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    parsed = parse_model_result(result(done.stdout.decode(), done.returncode, done.stderr.decode()))
    assert parsed.error == "no_library" and "huggingface_hub" in parsed.message


# --- what the host reported ---------------------------------------------------------------------------------

def test_a_plan_result_is_parsed_into_commit_files_and_missing_bytes() -> None:
    parsed = parse_model_result(result("PROGRESS 1 2\n" + result_line({
        "commit": COMMIT_A, "files": [{"path": "config.json", "size": 12, "blob": "c1"}], "missing": ["config.json"],
        "missing_bytes": 12, "free_bytes": 99, "hf_home": "/h", "asked_hub": True})))
    assert parsed.commit == COMMIT_A and parsed.missing == ("config.json",) and parsed.missing_bytes == 12
    assert parsed.total_bytes == 12 and not parsed.complete


def test_a_script_that_died_or_a_missing_python_is_an_error_with_its_output() -> None:
    assert parse_model_result(result("", 127)).error == "no_library"
    died = parse_model_result(result("", 1, "Traceback ...\nMemoryError"))
    assert died.error == "script" and "MemoryError" in died.message


def test_an_unreachable_hub_is_refused_at_preflight_naming_the_hub() -> None:
    model = hub_model(reference(), HostVars(hf_endpoint="http://10.9.9.9:8090"), {})
    assert model is not None
    down = parse_model_result(result(result_line({"error": "unreachable", "message": "ConnectError: refused"})))
    with pytest.raises(PreflightError, match=r"http://10\.9\.9\.9:8090: ConnectError: refused") as raised:
        check_model(model, down, "th1")
    assert "current release keeps serving" in (raised.value.hint or "")


def test_a_disk_too_small_is_refused_with_both_numbers() -> None:
    model = hub_model(reference(), HostVars(), {})
    assert model is not None
    tight = model_facts(missing=("model-00001-of-00002.safetensors",), missing_bytes=400 * 10**9, free=300 * 10**9)
    with pytest.raises(PreflightError, match=r"400\.0 GB still to download .* only 300\.0 GB is free"):
        check_model(model, tight, "th1")
    check_model(model, replace(tight, free_bytes=400 * 10**9 + MIN_FREE_AFTER_BYTES), "th1")


# --- progress -----------------------------------------------------------------------------------------------

def test_progress_lines_show_bytes_rate_and_eta_every_few_seconds() -> None:
    meter = TransferMeter(started_at=100.0, every_s=5.0)
    assert meter.sample(0, 10**9, 100.5) == "0 B / 1.0 GB (0%), 0 B/s"
    assert meter.sample(10**8, 10**9, 102.0) is None  # too soon after the last line
    assert meter.sample(5 * 10**8, 10**9, 110.0) == "500.0 MB / 1.0 GB (50%), 50.0 MB/s, ETA 0:00:10"
    assert meter.sample(10**9, 10**9, 111.0, final=True) == "1.0 GB / 1.0 GB (100%), 90.9 MB/s"


def test_a_resumed_transfer_does_not_count_the_bytes_it_already_had() -> None:
    meter = TransferMeter(started_at=0.0)
    meter.sample(6 * 10**8, 10**9, 0.0)
    assert meter.sample(8 * 10**8, 10**9, 10.0) == "800.0 MB / 1.0 GB (80%), 20.0 MB/s, ETA 0:00:10"


def test_staging_streams_progress_and_a_failure_says_the_old_release_serves() -> None:
    model = hub_model(reference(), HostVars(), {})
    assert model is not None
    remote = FakeRemote().reply(STAGE_MODEL, stdout="PROGRESS 0 100\nPROGRESS 100 100\n" + result_line({
        "commit": COMMIT_A, "files": [{"path": "config.json", "size": 100, "blob": "c1"}], "missing": ["config.json"],
        "missing_bytes": 100, "free_bytes": 10**9, "hf_home": "/h", "downloaded_bytes": 100}))
    progress = RecordingProgress()
    ticks = iter(range(0, 1000, 10))
    staged = stage_model(remote, model, "/opt/ml-env", COMMIT_A, progress, lambda: float(next(ticks)))
    assert staged.commit == COMMIT_A
    assert progress.of_kind("transfer") == ["model lukealonso/GLM-5-NVFP4: 0 B / 100 B (0%), 0 B/s",
                                            "model lukealonso/GLM-5-NVFP4: 100 B / 100 B (100%), 5 B/s"]
    failing = FakeRemote().reply(STAGE_MODEL, exit_code=1, stdout=result_line(
        {"error": "unreachable", "message": "ConnectError: hub went away"}))
    with pytest.raises(RemoteError, match="hub went away; nothing was switched, the current release keeps serving"):
        stage_model(failing, model, "/opt/ml-env", COMMIT_A, progress, lambda: 0.0)


# --- the release and the plan -------------------------------------------------------------------------------

def plan_with(model: ModelFacts, **facts_args: object):
    loaded = PROJECT.profile("glm5-nvfp4")
    hub = hub_model(loaded.profile, HostVars(), {})
    return plan_deploy(loaded, target(), facts(**facts_args), {}, False, NOW, model=hub, model_facts=model)


def test_the_release_runs_the_resolved_commit_offline_from_the_host_cache() -> None:
    plan = plan_with(model_facts())
    args = list(plan.release.args)
    assert args[args.index("--revision") + 1] == COMMIT_A
    assert plan.release.environment["HF_HUB_OFFLINE"] == "1"
    assert plan.release.environment["HF_HOME"] == "/root/.cache/huggingface"
    assert plan.release.model == {"path": "lukealonso/GLM-5-NVFP4", "revision": "main", "commit": COMMIT_A,
                                  "hf_home": "/root/.cache/huggingface"}


def test_a_new_upstream_commit_is_a_new_release_and_a_visible_change() -> None:
    first = plan_with(model_facts(COMMIT_A))
    newer = plan_with(model_facts(COMMIT_B), current=deployed(first), active="active")
    assert newer.release.id != first.release.id and not newer.unchanged
    assert f"~ model commit: {COMMIT_A} -> {COMMIT_B}" in [str(change) for change in newer.changes]


def test_missing_weights_are_staged_before_the_release_files() -> None:
    plan = plan_with(model_facts(missing=("config.json",), missing_bytes=120))
    assert [batch.kind for batch in plan.batches.in_order()] == [
        "model", "stage", "switch and restart", "once verified"]
    assert plan.batches.model[0].name == STAGE_MODEL
    assert any("1 of 3 files to stage, 120 B to download" in note for note in plan.notes)


def test_complete_weights_of_the_running_release_are_a_no_op_but_lost_files_are_restaged() -> None:
    first = plan_with(model_facts())
    assert plan_with(model_facts(), current=deployed(first), active="active").unchanged
    lost = plan_with(model_facts(missing=("config.json",), missing_bytes=120), current=deployed(first),
                     active="active")
    assert not lost.unchanged and lost.batches.in_order()[0].kind == "model"


def test_revision_is_passed_on_every_sglang_version_we_render_for() -> None:
    profile = with_model(reference(), revision="v2")
    for version in ("0.5.9", "0.5.15.post1", "0.5.23"):
        args = sglang_args(profile, version, COMMIT_A)
        assert args[2:4] == ("--revision", COMMIT_A)
    assert "--revision" in sglang_args(profile, "0.5.23") and "--revision" not in sglang_args(reference(), "0.5.23")


def test_the_sim_refuses_to_start_offline_without_the_snapshot(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sandbox" / "sim"))
    from sglang_sim.weights import missing_weights, snapshot_dir

    environ = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    assert missing_weights("org/model", COMMIT_A, environ)
    assert not missing_weights("org/model", COMMIT_A, {"HF_HOME": str(tmp_path)})  # online: it would download
    snapshot = snapshot_dir("org/model", COMMIT_A, environ)
    assert snapshot == tmp_path / "hub" / "models--org--model" / "snapshots" / COMMIT_A
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert not missing_weights("org/model", COMMIT_A, environ)
    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir()
    (refs / "main").write_text(COMMIT_A)
    assert not missing_weights("org/model", None, environ) and missing_weights("org/other", None, environ)
    assert missing_weights("/srv/missing-model", None, environ)
    assert not missing_weights("/srv/missing-model", None, {})



# --- other sources: a directory on the host, or pushed from this machine ---------------------------------------

def test_an_absolute_path_is_only_checked_for_its_config_on_the_host() -> None:
    model = weights(with_model(reference(), path="/srv/models/glm5"), HostVars(), {})
    assert isinstance(model, HostPathModel)
    assert model.fact_steps("/opt/ml-env")[0].argv == ("test", "-f", "/srv/models/glm5/config.json")
    with pytest.raises(PreflightError, match=r"/srv/models/glm5/config\.json does not exist on the host"):
        check_model(model, model.parse([result("", 1)]), "th1")
    assert model.release_model(model.parse([result("")])).path == "/srv/models/glm5"


def local_model(tmp_path: Path, **files: bytes) -> Path:
    directory = tmp_path / "weights"
    directory.mkdir(exist_ok=True)
    for name, data in {"config.json": b"{}", **files}.items():
        (directory / name).write_bytes(data)
        os.utime(directory / name, (1_700_000_000, 1_700_000_000))
    return directory


def rsync_profile(directory: Path) -> Profile:
    return with_model(reference(), path="/srv/models/glm5", source=ModelSource(rsync=str(directory)))


def test_an_rsync_source_is_a_version_directory_named_by_its_content(tmp_path: Path) -> None:
    directory = local_model(tmp_path, **{"a.safetensors": b"x" * 100})
    model = weights(rsync_profile(directory), HostVars(), {})
    assert isinstance(model, PushedModel) and model.version_dir == PurePosixPath(f"/srv/models/glm5/{model.digest}")
    (directory / "a.safetensors").write_bytes(b"y" * 101)
    changed = weights(rsync_profile(directory), HostVars(), {})
    assert isinstance(changed, PushedModel) and changed.digest != model.digest
    release = changed.release_model(ModelFacts())
    assert release.path == str(changed.version_dir) and release.pushed_from == str(directory)


def test_a_local_directory_without_config_is_refused_before_ssh(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not a directory on this machine"):
        weights(rsync_profile(tmp_path / "absent"), HostVars(), {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        weights(rsync_profile(tmp_path / "empty"), HostVars(), {})
    with pytest.raises(ValueError, match=r"source: rsync needs model\.path to be the absolute directory"):
        Profile.model_validate({**reference().model_dump(mode="json"),
                                "model": {"path": "org/name", "source": {"rsync": "/x"}}})


def listing(*lines: tuple[str, str, int, float]) -> str:
    return "".join(f"{path}\t{kind}\t{size}\t{mtime}\n" for path, kind, size, mtime in lines)


def test_only_files_that_differ_from_the_newest_version_on_the_host_are_pushed(tmp_path: Path) -> None:
    directory = local_model(tmp_path, **{"a.safetensors": b"x" * 100, "b.safetensors": b"z" * 50})
    model = weights(rsync_profile(directory), HostVars(), {})
    assert isinstance(model, PushedModel)
    host = listing(("old1", "d", 4096, 1.0), ("old1/config.json", "f", 2, 1_700_000_000.5),
                   ("old1/a.safetensors", "f", 100, 1_700_000_000.0), ("old1/b.safetensors", "f", 49, 1_700_000_000),
                   ("old2", "d", 4096, 0.5), ("half.tmp", "d", 4096, 9.0), ("half.tmp/a.safetensors", "f", 1, 9.0))
    df = "Filesystem 1B-blocks Used Available Capacity Mounted\n/dev/x 100 10 5000000000 1% /\n"
    facts = model.parse([result(host), result(df)])
    assert parse_versions(host).keys() == {"old1", "old2"} and model.link_dest(host) == PurePosixPath(
        "/srv/models/glm5/old1")
    assert facts.missing == ("b.safetensors",) and facts.missing_bytes == 50 and facts.free_bytes == 5_000_000_000
    published = host + listing((model.digest, "d", 4096, 10.0))
    assert model.parse([result(published), result(df)]).complete


def test_the_rsync_command_checks_the_host_key_and_links_unchanged_files(tmp_path: Path) -> None:
    ssh = SSHTarget(host="192.0.2.10", port=2222, user="deploy", key_files=(Path("/k/id"),),
                    known_hosts_file=Path("/k/known_hosts"))
    argv = rsync_argv(ssh, tmp_path, PurePosixPath("/srv/m/abc.tmp"), PurePosixPath("/srv/m/old"))
    shell = argv[argv.index("-e") + 1]
    assert "StrictHostKeyChecking=yes" in shell and "UserKnownHostsFile=/k/known_hosts" in shell
    assert "-p 2222" in shell and "-i /k/id" in shell
    # the ssh config was resolved into the target: rsync's ssh reads none, and offers the agent with the key file
    assert shell.startswith("ssh -p 2222 -F /dev/null ") and "IdentitiesOnly" not in shell
    assert "-o IdentitiesOnly=yes" in rsync_argv(replace(ssh, identities_only=True), tmp_path,
                                                 PurePosixPath("/d"), None)[argv.index("-e") + 1]
    assert argv[argv.index("--rsync-path") + 1] == "sudo -n rsync" and "--link-dest=/srv/m/old" in argv
    assert argv[-2:] == [f"{tmp_path}/", "deploy@192.0.2.10:/srv/m/abc.tmp/"]
    jumped = rsync_argv(replace(ssh, jump=JumpHost("192.0.2.1", 22, "root")), tmp_path, PurePosixPath("/d"), None)
    proxy = jumped[jumped.index("-e") + 1]
    assert "ProxyCommand=ssh -p 22 -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes" in proxy
    assert "-W %h:%p root@192.0.2.1" in proxy


def test_the_rsync_push_gives_up_on_a_dead_link_within_the_bound_of_a_round_trips_channel(tmp_path: Path) -> None:
    """A link that dies during a push (or between its ssh's handshake and rsync's start) ends it within
    CHANNEL_OPEN_S, as an SFTP upload's channel does, on both hops: its ssh sends a keepalive every KEEPALIVE_S of
    silence and gives up at the check after ServerAliveCountMax unanswered ones (OpenSSH's server_alive_check)."""
    ssh = SSHTarget(host="192.0.2.10", port=2222, user="deploy", known_hosts_file=Path("/k/known_hosts"),
                    jump=JumpHost("192.0.2.1", 22, "root"))
    argv = rsync_argv(ssh, tmp_path, PurePosixPath("/d"), None)
    outer = shlex.split(argv[argv.index("-e") + 1])
    hop = shlex.split(next(option for option in outer if option.startswith("ProxyCommand=")).split("=", 1)[1])
    for command in (outer, hop):
        options = dict(option.split("=", 1) for option in command if "=" in option and "%" not in option)
        assert int(options["ServerAliveInterval"]) == KEEPALIVE_S
        assert int(options["ServerAliveInterval"]) * (int(options["ServerAliveCountMax"]) + 1) == CHANNEL_OPEN_S


def test_a_push_goes_to_a_staging_directory_renamed_when_complete(tmp_path: Path) -> None:
    directory = local_model(tmp_path, **{"a.safetensors": b"x" * 100})
    model = weights(rsync_profile(directory), HostVars(), {})
    assert isinstance(model, PushedModel)
    remote = FakeRemote()
    remote.push_stdout = "            0   0%    0.00kB/s    0:00:00\n          102 100%   99.00kB/s    0:00:00\n"
    progress = RecordingProgress()
    push_model(remote, model, "", progress, iter(range(100)).__next__)
    staging = PurePosixPath(f"/srv/models/glm5/{model.digest}.tmp")
    assert remote.pushes == [(directory, staging, None)]
    assert remote.ran_names() == ["model: version directory", "push", "model: publish version"]
    assert progress.of_kind("transfer")[-1].startswith(f"push {directory}: 102 B / 102 B (100%)")


# --- model.list and pruning -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    id: str
    metadata: dict[str, object]


def hub_release(release_id: str, commit: str, hf_home: str = "/root/.cache/huggingface") -> Record:
    return Record(release_id, {"venv": "/opt/ml-env", "profile": {"service": {"user": "root"}},
                               "model": {"path": "org/m", "revision": "main", "commit": commit, "hf_home": hf_home}})


def cache_result(hf_home: str, revisions: list[dict[str, object]]) -> StepResult:
    step = Step(FACT_CACHE + hf_home, ("true",))
    return StepResult(step, 0, result_line({"hf_home": hf_home, "revisions": revisions}), "", 0.0)


def test_model_list_names_each_revision_with_the_releases_that_run_it() -> None:
    releases = [hub_release("r1", COMMIT_A), hub_release("r2", COMMIT_B)]
    steps = listing_steps(model_locations(releases))
    assert [step.name for step in steps] == [FACT_CACHE + "/root/.cache/huggingface"]
    stored = parse_stored([cache_result("/root/.cache/huggingface", [
        {"repo": "org/m", "commit": COMMIT_A, "bytes": 10, "files": 2, "refs": [], "staged": True},
        {"repo": "org/m", "commit": COMMIT_B, "bytes": 20, "files": 2, "refs": ["main"], "staged": True},
        {"repo": "other/hand-made", "commit": "c" * 40, "bytes": 5, "files": 1, "refs": [], "staged": False}])],
        releases)
    assert [(item.version, item.releases) for item in stored] == [(COMMIT_A, ("r1",)), (COMMIT_B, ("r2",)),
                                                                  ("c" * 40, ())]


def test_pruning_deletes_only_what_deploy_staged_and_no_kept_release_runs() -> None:
    releases = [hub_release("r1", COMMIT_A), hub_release("r2", COMMIT_B)]
    stored = parse_stored([cache_result("/root/.cache/huggingface", [
        {"repo": "org/m", "commit": COMMIT_A, "bytes": 10, "files": 2, "refs": [], "staged": True},
        {"repo": "org/m", "commit": COMMIT_B, "bytes": 20, "files": 2, "refs": [], "staged": True},
        {"repo": "other/hand-made", "commit": "c" * 40, "bytes": 5, "files": 1, "refs": [], "staged": False}])],
        releases)
    steps = prune_models(stored, {"r2"}, model_locations(releases))
    assert len(steps) == 1
    request = json.loads(steps[0].stdin.split(b"\n", 1)[0])  # type: ignore[union-attr]
    assert request["action"] == "prune" and request["commits"] == [COMMIT_A]
    assert prune_models(stored, {"r1", "r2"}, model_locations(releases)) == []


def test_pushed_versions_no_kept_release_runs_are_removed() -> None:
    releases = [Record("r1", {"model": {"path": "/srv/m/" + "1" * 16, "pushed_from": "/local"}}),
                Record("r2", {"model": {"path": "/srv/m/" + "2" * 16, "pushed_from": "/local"}})]
    assert listing_steps(model_locations(releases))[0].argv[:2] == ("find", "/srv/m")
    found = StepResult(Step(FACT_BASE + "/srv/m", ("true",)), 0,
                       f"{'1' * 16}/config.json\t2\n{'2' * 16}/config.json\t2\n{'2' * 16}.tmp/x\t1\nnotes/x\t1\n",
                       "", 0.0)
    stored = parse_stored([found], releases)
    assert sorted(item.version for item in stored) == ["1" * 16, "2" * 16]
    steps = prune_models(stored, {"r2"}, model_locations(releases))
    assert [step.argv for step in steps] == [("rm", "-rf", "--", "/srv/m/" + "1" * 16)]


def test_a_pushed_release_loads_its_version_directory(tmp_path: Path) -> None:
    """Reproduces the sandbox failure: the release passed the versions' base as --model-path."""
    directory = local_model(tmp_path, **{"a.safetensors": b"x" * 10})
    loaded = PROJECT.profile("glm5-nvfp4")
    loaded = loaded.model_copy(update={"profile": rsync_profile(directory)})
    model = weights(loaded.profile, HostVars(), {})
    assert isinstance(model, PushedModel)
    plan = plan_deploy(loaded, target(), facts(), {}, False, NOW, model=model, model_facts=ModelFacts(commit="x"))
    args = list(plan.release.args)
    assert args[args.index("--model-path") + 1] == str(model.version_dir)
    assert "--revision" not in args and plan.release.environment["HF_HUB_OFFLINE"] == "1"
