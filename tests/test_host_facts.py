"""The facts' reads that would start a Python in the venv: run here for real (sh, coreutils, this interpreter) against
directories made in a temporary directory, to show when the shell answers alone and that its answer is the one the
Python script gives."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import http.server
import itertools
import json
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import pytest
from helpers.host_facts import bare_venv
from helpers.sglang_options import SYNTHETIC, write_tree

from deploy_lib.facts.cuda_toolkit import FACT_VERSION_JSON
from deploy_lib.facts.host import (
    FACT_DISK,
    FACT_GPUS,
    FACT_IMPORT,
    FACT_PORT,
    FACT_SGLANG,
    FactRequest,
    SGLangInstall,
    fact_batch,
    import_step,
    parse_host_facts,
    parse_import_shadow,
    parse_sglang_install,
    preflight_batch,
    sglang_step,
    with_preflight_facts,
)
from deploy_lib.host_scripts import model_stage
from deploy_lib.host_scripts.sglang_options import extract
from deploy_lib.models import HubModel, parse_model_result
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.batch import inline_stdin
from deploy_lib.remote.readings import Readings
from deploy_lib.store import FACT_LOCK, FACT_LOCK_OWNER, StoreLayout


def run_step(step: Step, env: dict[str, str] | None = None) -> StepResult:
    """The step's argv as the batch runs it (without sudo: these paths are ours)."""
    done = subprocess.run(step.argv, input=step.stdin, capture_output=True, env=env, check=False)
    return StepResult(step, done.returncode, done.stdout.decode(), done.stderr.decode(), 0.0)


def fake_venv(root: Path) -> Path:
    """A venv whose bin/python3 is this interpreter, with a regular `sglang` package on its PYTHONPATH."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python3").symlink_to(sys.executable)
    (root / "site" / "sglang").mkdir(parents=True)
    (root / "site" / "sglang" / "__init__.py").write_text("")
    return root


def test_a_working_directory_without_an_sglang_entry_is_answered_without_python(tmp_path: Path) -> None:
    """Input tried: /srv-like directory with unrelated files and a venv whose python does not exist: the step must
    exit 0 with no output (had it started that python, sh would exit 127)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "sglang-notes.txt").write_text("not importable as sglang")
    (work / "model").mkdir()
    result = run_step(import_step(str(tmp_path / "no-venv"), str(work)))
    assert (result.exit_code, result.stdout) == (0, "")
    assert parse_import_shadow(result) is None


@pytest.mark.parametrize("entry", ["sglang/__init__.py", "sglang.py"])
def test_a_working_directory_holding_sglang_asks_the_venvs_python(tmp_path: Path, entry: str) -> None:
    """Input tried: a working directory holding a package `sglang/` (or a module sglang.py) besides the venv's own
    sglang: the python runs and names the working directory's copy."""
    venv = fake_venv(tmp_path / "venv")
    work = tmp_path / "work"
    (work / entry).parent.mkdir(parents=True, exist_ok=True)
    (work / entry).write_text("")
    result = run_step(import_step(str(venv), str(work)), env={"PYTHONPATH": str(venv / "site")})
    assert result.exit_code == 0, result.stderr
    assert parse_import_shadow(result) == str(work / entry.split("/")[0] if "/" in entry else work / entry)


def test_a_missing_working_directory_is_no_shadow(tmp_path: Path) -> None:
    result = run_step(import_step(str(tmp_path / "no-venv"), str(tmp_path / "absent")))
    assert result.exit_code == 125
    assert parse_import_shadow(result) is None


# ---------------------------------------------------------------------------------------------------------------
# SGLang's options and versions: computed once by the venv's python, then read from the verified cache
# ---------------------------------------------------------------------------------------------------------------

LAYOUT = StoreLayout("sglang")


@dataclass
class Venv:
    """A real venv (`python -m venv`) holding the synthetic sglang tree; bin/python3 counts its starts."""

    path: Path
    site: Path
    starts: Path

    @property
    def python_starts(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0


@pytest.fixture
def venv(tmp_path: Path) -> Venv:
    path = tmp_path / "ml-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    [site] = path.glob("lib/python3*/site-packages")
    write_tree(site, {**SYNTHETIC, "sglang/__init__.py": ""})  # a regular package, as the wheels install it
    starts = tmp_path / "python-starts"
    python3 = path / "bin" / "python3"
    python3.unlink()
    python3.write_text(f'#!/bin/sh\necho started >> {starts}\nexec "$(dirname "$0")/python" "$@"\n')
    python3.chmod(0o755)
    return Venv(path, site, starts)


def read_sglang(venv: Venv, store: Path, write_cache: bool = True, store_exists: bool = True) -> SGLangInstall:
    layout = StoreLayout("sglang", root=PurePosixPath(store))
    if store_exists:
        Path(layout.releases).mkdir(parents=True, exist_ok=True)
    return parse_sglang_install(run_step(sglang_step(layout, str(venv.path), write_cache)))


def test_a_first_contact_writes_no_cache_where_no_store_exists_yet(venv: Venv, tmp_path: Path) -> None:
    """Input tried: a host without the service's store (a first deploy, which preflight may still refuse: a refused
    deploy leaves no file on the host). The venv's python answers each time and nothing is written."""
    first = read_sglang(venv, tmp_path / "store", store_exists=False)
    again = read_sglang(venv, tmp_path / "store", store_exists=False)
    assert first == again and first.sglang_version == "9.9.9.post1" and venv.python_starts == 2
    assert not (tmp_path / "store").exists()


def test_sglang_facts_are_computed_once_then_read_from_the_cache_without_python(venv: Venv, tmp_path: Path) -> None:
    first = read_sglang(venv, tmp_path / "store")
    assert (first.error, first.sglang_version, first.flashinfer_version) == (None, "9.9.9.post1", "0.7.2")
    assert first.options == json.loads(json.dumps(extract(venv.site)["options"]))
    assert venv.python_starts == 1
    (venv.site / "__pycache__").mkdir()  # the server's first start compiles top-level modules: no new package
    again = read_sglang(venv, tmp_path / "store")
    assert again == first and venv.python_starts == 1  # the shell answered from the cache


def facts_file_of(copy: Path, edited: Path | None) -> str:
    """SGLANG_FACTS_FILE as a copy of deploy_lib in `copy` computes it, with a comment line appended to `edited` (a
    path inside the package) first."""
    import deploy_lib
    shutil.copytree(Path(deploy_lib.__file__).parent, copy / "deploy_lib", ignore=shutil.ignore_patterns("__pycache__"))
    if edited is not None:
        with (copy / "deploy_lib" / edited).open("a") as source:
            source.write("# an edit\n")
    script = "import deploy_lib, deploy_lib.facts.host as f; print(deploy_lib.__file__); print(f.SGLANG_FACTS_FILE)"
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=copy, timeout=120,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)})
    assert shown.returncode == 0, shown.stderr
    imported_from, name = shown.stdout.split()
    assert Path(imported_from).is_relative_to(copy)
    return name


def test_only_an_edit_to_the_script_the_host_runs_renames_the_hosts_sglang_facts_cache(tmp_path: Path) -> None:
    """The cache beside each venv is named by the extractor's text: an edit to the local argv checker keeps every
    host's cache (failed before: checker and extractor were one file, sglang_options.py, hashed whole); an edit to
    the extractor renames it, so no host reads facts an older extractor computed."""
    import deploy_lib
    from deploy_lib.host_scripts import sglang_options
    from deploy_lib.release import argv_check
    package = Path(deploy_lib.__file__).parent
    as_is = facts_file_of(tmp_path / "as-is", None)
    assert facts_file_of(tmp_path / "checker", Path(argv_check.__file__).relative_to(package)) == as_is
    assert facts_file_of(tmp_path / "extractor", Path(sglang_options.__file__).relative_to(package)) != as_is


def test_the_step_fits_in_the_facts_round_trip() -> None:
    """The extractor travels inside the batch's script (a here-document), so the facts stay one round trip."""
    assert inline_stdin(sglang_step(LAYOUT, "/root/ml-env", True)) is not None


def test_a_dry_run_reads_the_cache_but_never_writes_it(venv: Venv, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert read_sglang(venv, store, write_cache=False).sglang_version == "9.9.9.post1"
    assert not [path for path in store.rglob("*") if path.is_file()]
    read_sglang(venv, store)
    read_sglang(venv, store, write_cache=False)
    assert venv.python_starts == 2


def test_the_facts_batch_of_a_dry_run_asks_for_a_read_only_step() -> None:
    for write, mode in ((True, "write"), (False, "read")):
        [step] = [step for step in fact_batch(FactRequest(LAYOUT, "/root/ml-env", 8000, write_caches=write))
                  if isinstance(step, Step) and step.name == FACT_SGLANG]
        assert step.argv[-2] == mode


def test_the_decision_and_preflight_batches_read_what_the_whole_batch_reads() -> None:
    """A deploy decides from the batch without preflight's facts and reads those only for a change: together the two
    batches send the whole batch's steps once each, and parse to the HostFacts it gives. Inputs tried: 2 GPUs, a
    listener, 5 GB free, a CUDA toolkit, a working directory (the import check), a model step."""
    model = Step("model plan", ("true",))
    whole = FactRequest(LAYOUT, "/root/ml-env", 8000, "/usr/local/cuda", "/srv/work", (model,))
    decision = replace(whole, preflight=False)
    replies = {FACT_GPUS: "0, NVIDIA H200, GPU-0, 9.0, 143771, 0, 80, 700, 0, 580\n"
                          "1, NVIDIA H200, GPU-1, 9.0, 143771, 0, 80, 700, 0, 580\n",
               FACT_PORT: 'LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("python",pid=7,fd=3))\n',
               FACT_DISK: "Filesystem 1-blocks Used Available Capacity Mounted on\n/dev/sda 9 1 5000000000 1% /\n",
               FACT_VERSION_JSON: '{"cuda": {"version": "12.8.1"}}', FACT_SGLANG: '{"sglang_version": "0.5.23"}',
               FACT_IMPORT: json.dumps({"served": ["/srv/work/sglang"], "installed": ["/venv/sglang"]})}

    def answered(steps: list[Step]) -> Readings:
        absent = (FACT_LOCK, FACT_LOCK_OWNER)  # no lock held
        return Readings(StepResult(step, int(step.name in absent), replies.get(step.name, ""), "", 0.0)
                        for step in steps)

    decided, preflight = fact_batch(decision), preflight_batch(decision)
    assert sorted(step.name for step in (*decided, *preflight)) == sorted(step.name for step in fact_batch(whole))
    assert {step.argv[0] for step in preflight} >= {"nvidia-smi", "df", "ss"}
    assert not {step.argv[0] for step in decided} & {"nvidia-smi", "df", "ss"}
    split = with_preflight_facts(parse_host_facts(answered(decided), decision), answered(preflight), decision)
    assert split == parse_host_facts(answered(fact_batch(whole)), whole)
    assert len(split.gpus or ()) == 2 and split.free_bytes == 5_000_000_000
    assert split.import_shadow == "/srv/work/sglang" and split.port_listeners
    assert split.cuda_toolkit is not None and split.cuda_toolkit.version == "12.8"


@pytest.mark.parametrize(("venv", "port", "cuda_home", "working_directory", "write_caches"),
                         list(itertools.product([None, "/root/ml-env"], [None, 8000], [None, "/usr/local/cuda"],
                                                [None, "/srv/work"], [True, False])))
def test_whatever_a_deploy_gives_the_two_batches_send_each_step_of_the_whole_once(
        venv: str | None, port: int | None, cuda_home: str | None, working_directory: str | None,
        write_caches: bool) -> None:
    """Inputs tried: every combination of a venv (status has none), a port, a CUDA_HOME, a working directory and a
    dry run's cache setting: no read is sent twice, none is left out."""
    request = FactRequest(LAYOUT, venv, port, cuda_home, working_directory, write_caches=write_caches)
    whole = fact_batch(request)
    decision = replace(request, preflight=False)
    split = [*fact_batch(decision), *preflight_batch(decision)]
    assert Counter(split) == Counter(whole)  # the same steps, each once, argv and stdin alike


def edit_server_args(venv: Venv) -> None:
    server_args = venv.site / "sglang/srt/server_args.py"
    lines = server_args.read_text().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if "parser.add_argument(" in line)
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at, f'{indent}parser.add_argument("--hot-fix", type=int)\n')
    server_args.write_text("".join(lines))


def add_distribution(venv: Venv) -> None:
    (venv.site / "torch-2.11.0.dist-info").mkdir()
    (venv.site / "torch-2.11.0.dist-info/METADATA").write_text("Name: torch\nVersion: 2.11.0\n")


def damage_cache(venv: Venv) -> None:
    [cache] = (venv.path.parent / "store").rglob("*.facts")
    cache.write_text(cache.read_text().replace('"9.9.9.post1"', '"9.9.8"'))


@pytest.mark.parametrize(("change", "seen"), [
    (edit_server_args, lambda facts: "--hot-fix" in facts.options),
    (add_distribution, lambda facts: facts.torch_version == "2.11.0"),
    (damage_cache, lambda facts: facts.sglang_version == "9.9.9.post1"),
])
def test_a_changed_venv_or_a_damaged_cache_is_read_again_by_python(
        venv: Venv, tmp_path: Path, change: Callable[[Venv], None], seen: Callable[[SGLangInstall], bool]) -> None:
    """Inputs tried: server_args.py edited in place (a hot fix in the venv), a distribution installed beside sglang,
    the cache's payload altered: each time the venv's python runs again and its answer is the one shown."""
    store = tmp_path / "store"
    read_sglang(venv, store)
    change(venv)
    changed = read_sglang(venv, store)
    assert seen(changed) and venv.python_starts == 2
    assert read_sglang(venv, store) == changed and venv.python_starts == 2  # cached again


def test_a_venv_without_sglang_or_python_is_reported_and_nothing_is_cached(venv: Venv, tmp_path: Path) -> None:
    shutil.rmtree(venv.site / "sglang")
    store = tmp_path / "store"
    missing = read_sglang(venv, store)
    assert missing.python_found and missing.error and "sglang is not installed" in missing.error
    assert not list(store.rglob("*.facts"))
    (venv.site / "sglang").mkdir()
    (venv.path / "bin/python3").unlink()
    assert read_sglang(venv, store) == SGLangInstall(False, None, None, {}, "the venv's python3 was not found")


# ---------------------------------------------------------------------------------------------------------------
# The model plan of a pinned commit a stage completed: answered by the shell while the kept plan verifies
# ---------------------------------------------------------------------------------------------------------------

COMMIT = "c" * 40
FILES = {"config.json": b"{}", "model-00001-of-00001.safetensors": b"weights" * 100}


def staged_cache(hf_home: Path) -> dict[str, object]:
    """An HF cache holding COMMIT of org/tiny as huggingface_hub lays it out, and the kept plan a stage leaves."""
    repo = hf_home / "hub" / "models--org--tiny"
    files = []
    for name, data in FILES.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / blob).write_bytes(data)
        (repo / "snapshots" / COMMIT).mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / COMMIT / name).symlink_to(f"../../blobs/{blob}")
        files.append({"path": name, "size": len(data), "blob": blob})
    request = {"repo": "org/tiny", "revision": COMMIT, "allow": [], "ignore": [], "hf_home": str(hf_home)}
    result = {"commit": COMMIT, "files": files, "missing": [], "missing_bytes": 0, "free_bytes": 1,
              "hf_home": str(hf_home), "asked_hub": True}
    model_stage.keep_plan(request, result)
    return result


def plan_step(hf_home: Path, revision: str = COMMIT) -> Step:
    """The facts' plan step as this user runs it: runuser's prefix dropped, the venv's python absent (had the
    shell not answered, sh would exit 127)."""
    model = HubModel("org/tiny", revision, (), (), str(hf_home), None, getpass.getuser())
    step = model.fact_steps("/nonexistent-venv")[0]
    assert step.argv[:4] == ("runuser", "-u", getpass.getuser(), "--")
    return replace(step, argv=step.argv[4:])


def test_a_pinned_commit_a_stage_completed_is_planned_by_the_shell(tmp_path: Path) -> None:
    staged = staged_cache(tmp_path / "hf")
    result = run_step(plan_step(tmp_path / "hf"))
    assert result.exit_code == 0, result.stderr
    planned = parse_model_result(result)
    assert planned.complete and planned.commit == COMMIT and not planned.asked_hub
    assert [(f.path, f.size) for f in planned.files] == [(f["path"], f["size"]) for f in staged["files"]]
    assert planned.free_bytes is not None and planned.free_bytes > 0  # df's, now: not the stage's


@pytest.mark.parametrize("damage", ["blob gone", "blob truncated", "link gone", "plan altered", "other patterns"])
def test_a_kept_plan_that_no_longer_verifies_is_left_to_the_venvs_python(tmp_path: Path, damage: str) -> None:
    """Inputs tried: a blob deleted or cut short, a snapshot link removed, the plan's payload edited, and a profile
    whose allow patterns differ from the stage's: each time the python runs (here: absent, so exit 127)."""
    staged_cache(tmp_path / "hf")
    repo = tmp_path / "hf" / "hub" / "models--org--tiny"
    [shard] = [blob for blob in (repo / "blobs").iterdir() if blob.stat().st_size > 100]
    step = plan_step(tmp_path / "hf")
    if damage == "blob gone":
        shard.unlink()
    elif damage == "blob truncated":
        shard.write_bytes(b"weights")
    elif damage == "link gone":
        (repo / "snapshots" / COMMIT / "config.json").unlink()
    elif damage == "plan altered":
        [kept] = (tmp_path / "hf" / "sglang-deploy").rglob("*.plan")
        kept.write_text(kept.read_text().replace('"missing_bytes": 0', '"missing_bytes": 1'))
    else:
        model = HubModel("org/tiny", COMMIT, ("*.json",), (), str(tmp_path / "hf"), None, getpass.getuser())
        step = replace(step, argv=model.fact_steps("/nonexistent-venv")[0].argv[4:])
    assert run_step(step).exit_code == 127


def test_a_branch_or_tag_is_always_resolved_by_the_hub(tmp_path: Path) -> None:
    staged_cache(tmp_path / "hf")
    model = HubModel("org/tiny", "main", (), (), str(tmp_path / "hf"), None, "sglang")
    assert model.fact_steps("/opt/ml-env")[0].argv[4:6] == ("/opt/ml-env/bin/python3", "-I")


class NoLibrary:
    """An HfApi stand-in that fails the test if the plan touches it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"huggingface_hub's {name} was used")


def record_stage(hf_home: Path) -> None:
    """The cache of staged_cache with the record a stage of COMMIT writes before its first byte."""
    staged = staged_cache(hf_home)
    record = Path(model_stage.record_path({"hf_home": str(hf_home), "repo": "org/tiny"}, COMMIT))
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"repo": "org/tiny", "commit": COMMIT, "allow": [], "ignore": [],
                                  "files": staged["files"]}))


@contextlib.contextmanager
def loopback_hub(asked: list[str]) -> Iterator[str]:
    """A hub API on loopback answering every GET with COMMIT as the revision's sha; each request's path (the
    absolute URL when it came through it as a proxy) noted in `asked`; yields its URL."""

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = json.dumps({"sha": COMMIT}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


# huggingface_hub as a package that fails the plan when imported: found, but only to be looked at
UNIMPORTABLE_HUB = "raise ImportError('huggingface_hub was imported')\n"


def test_a_branch_at_a_commit_a_stage_completed_is_planned_without_huggingface_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The branch is resolved by one request to the hub API (here a loopback server), and the commit's record
    answers the rest: huggingface_hub is never imported (it costs the python most of its time)."""
    record_stage(tmp_path / "hf")
    asked: list[str] = []
    (tmp_path / "lib" / "huggingface_hub").mkdir(parents=True)
    (tmp_path / "lib" / "huggingface_hub" / "__init__.py").write_text(UNIMPORTABLE_HUB)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    with loopback_hub(asked) as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        planned = model_stage.plan({"repo": "org/tiny", "revision": "main", "allow": [], "ignore": [],
                                    "hf_home": str(tmp_path / "hf"), "token": None}, NoLibrary())
    assert asked == ["/api/models/org/tiny/revision/main"]
    assert (planned["commit"], planned["missing"], planned["asked_hub"]) == (COMMIT, [], True)


def venv_plan(tmp_path: Path, endpoint: str, env: dict[str, str] | None = None) -> StepResult:
    """The facts' plan step of org/tiny at `main` run for real by the venv at tmp_path/venv (runuser's prefix
    dropped), against the cache record_stage leaves."""
    record_stage(tmp_path / "hf")
    model = HubModel("org/tiny", "main", (), (), str(tmp_path / "hf"), endpoint, getpass.getuser())
    step = model.fact_steps(str(tmp_path / "venv"))[0]
    return run_step(replace(step, argv=step.argv[4:]), env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_the_venvs_python_plans_a_branch_without_processing_its_site_packages(tmp_path: Path) -> None:
    """Input tried: a venv holding huggingface_hub (unimportable) and a .pth file that would leave a mark at any
    start with site: the plan is answered, the hub asked once, huggingface_hub found but not imported, no mark."""
    site = bare_venv(tmp_path / "venv")
    (site / "huggingface_hub").mkdir()
    (site / "huggingface_hub" / "__init__.py").write_text(UNIMPORTABLE_HUB)
    mark = tmp_path / "site-was-processed"
    (site / "mark.pth").write_text(f"import pathlib; pathlib.Path({str(mark)!r}).touch()\n")
    asked: list[str] = []
    with loopback_hub(asked) as endpoint:
        result = venv_plan(tmp_path, endpoint)
    planned = parse_model_result(result)
    assert (planned.error, planned.commit, planned.complete, planned.asked_hub) == (None, COMMIT, True, True), \
        result.stderr
    assert asked == ["/api/models/org/tiny/revision/main"] and not mark.exists()


def test_huggingface_hub_reachable_only_through_a_pth_file_is_still_found(tmp_path: Path) -> None:
    """Input tried: huggingface_hub outside site-packages, on sys.path only through a .pth file (as an editable
    install puts it): site is processed, the library found, and the branch resolved by the hub."""
    site = bare_venv(tmp_path / "venv")
    (tmp_path / "src" / "huggingface_hub").mkdir(parents=True)
    (tmp_path / "src" / "huggingface_hub" / "__init__.py").write_text(UNIMPORTABLE_HUB)
    (site / "editable.pth").write_text(f"{tmp_path / 'src'}\n")
    asked: list[str] = []
    with loopback_hub(asked) as endpoint:
        planned = parse_model_result(venv_plan(tmp_path, endpoint))
    assert (planned.commit, planned.complete) == (COMMIT, True) and len(asked) == 1


def test_a_proxy_in_the_environment_carries_the_hub_request(tmp_path: Path) -> None:
    """Input tried: http_proxy naming a loopback server and a hub endpoint that does not resolve: the request goes
    to the proxy, for the endpoint's URL."""
    site = bare_venv(tmp_path / "venv")
    (site / "huggingface_hub").mkdir()
    (site / "huggingface_hub" / "__init__.py").write_text(UNIMPORTABLE_HUB)
    asked: list[str] = []
    with loopback_hub(asked) as proxy:
        planned = parse_model_result(venv_plan(tmp_path, "http://hub.invalid:1", {"http_proxy": proxy}))
    assert asked == ["http://hub.invalid:1/api/models/org/tiny/revision/main"]
    assert (planned.commit, planned.complete) == (COMMIT, True)
