"""Runs ON THE HOST, by the release's venv python (sent on stdin): plan or stage a model snapshot in the HF cache.

Standard library plus the venv's own huggingface_hub (a dependency of SGLang's stack: the library SGLang itself
downloads with). `deploy_lib.models` runs it as `python -I -S -c BOOTSTRAP` with stdin = one JSON line (the request)
followed by this source: {"action": "plan"|"stage"|"list"|"prune", "repo", "revision", "allow",
"ignore", "hf_home", "endpoint", "token", "user", "commits"}. The token only enters this process's
environment; it is never printed. `list` and `prune` read and delete cache revisions with the library's own
scan_cache_dir, and prune only what a stage of ours recorded. Started without site (-S): a plan answered from our
records and one request to the hub's API needs the standard library only; site-packages (their .pth files included)
are added at the first need of huggingface_hub (with_site_packages).

Output: `PROGRESS <done bytes> <total bytes>` lines while staging (about once a second), then one line
`RESULT <json>`: the resolved commit, the files the server loads with size and blob name, which of them are
missing from the cache and the bytes still to download, the free bytes of the cache's filesystem; or
{"error": kind, "message"}.
"""

import fnmatch
import hashlib
import importlib.util
import json
import os
import pwd
import sys
import threading
import urllib.parse

RECORD_DIR = "sglang-deploy"  # <HF_HOME>/sglang-deploy/<repo folder>/<commit>.json: what a stage of ours started
PLAN_HEADER = "sglang-deploy model plan 1"
FULL_COMMIT_LEN = 40
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")  # urllib.request's (getproxies_environment), any case
SITE = {"added": False}


def emit(kind, payload):
    try:
        sys.stdout.write(f"{kind} {payload}\n")
        sys.stdout.flush()
    except OSError:  # the tool is gone (Ctrl-C, a lost connection): stop; the next run resumes the partial files
        os._exit(130)


def repo_folder(repo):
    return "models--" + repo.replace("/", "--")


def free_bytes(path):
    """Available bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def wanted(path, allow, ignore):
    return (not allow or any(fnmatch.fnmatch(path, p) for p in allow)) and \
        not any(fnmatch.fnmatch(path, p) for p in ignore)


def record_path(request, commit):
    return os.path.join(request["hf_home"], RECORD_DIR, repo_folder(request["repo"]), commit + ".json")


def plan_name(repo, commit, allow, ignore):
    """<repo folder>/<commit>-<patterns' digest>.plan under RECORD_DIR: a completed stage's plan, which the tool's
    shell check (deploy_lib.models.script.PLAN_CHECK) verifies and prints without starting python."""
    patterns = hashlib.sha256(json.dumps([list(allow), list(ignore)]).encode()).hexdigest()[:16]
    return os.path.join(repo_folder(repo), f"{commit}-{patterns}.plan")


def keep_plan(request, result):
    """The complete plan of this commit and these patterns, with what verifies it: the size each file's snapshot
    path resolves to (`stat -L` from <HF_HOME>/hub) and the payload's sha256; written whole by a rename."""
    snapshot = os.path.join(repo_folder(request["repo"]), "snapshots", result["commit"])
    paths = [os.path.join(snapshot, item["path"]) for item in result["files"]]
    if any("\n" in path for path in paths):
        return
    payload = json.dumps({**result, "missing": [], "missing_bytes": 0, "asked_hub": False, "free_bytes": None},
                         sort_keys=True)
    lines = [PLAN_HEADER, "P " + hashlib.sha256((payload + "\n").encode()).hexdigest(),
             *("F " + path for path in paths),
             *(f"E {item['size']} {os.path.join(snapshot, item['path'])}" for item in result["files"]),
             "J " + payload]
    path = os.path.join(request["hf_home"], RECORD_DIR, plan_name(request["repo"], result["commit"],
                                                                  request["allow"], request["ignore"]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        handle.write("".join(line + "\n" for line in lines))
    os.replace(path + ".tmp", path)


def in_cache(request, commit, files):
    """(paths whose snapshot link and complete blob are both there, blob names complete in the cache)."""
    repo_dir = os.path.join(request["hf_home"], "hub", repo_folder(request["repo"]))
    linked, blobs = [], set()
    for item in files:
        blob = os.path.join(repo_dir, "blobs", item["blob"])
        if os.path.isfile(blob) and os.path.getsize(blob) == item["size"]:
            blobs.add(item["blob"])
            if os.path.exists(os.path.join(repo_dir, "snapshots", commit, item["path"])):
                linked.append(item["path"])
    return linked, blobs


def recorded(request):
    """The file list a stage of this exact commit and patterns recorded, when the cache holds it all (the stage
    finished, or was stopped only after its last file)."""
    revision = request["revision"]
    if len(revision) != FULL_COMMIT_LEN or not all(c in "0123456789abcdef" for c in revision):
        return None
    try:
        with open(record_path(request, revision)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if record.get("allow") != request["allow"] or record.get("ignore") != request["ignore"]:
        return None
    files = record.get("files", [])
    return files if len(in_cache(request, revision, files)[0]) == len(files) else None


def with_site_packages():
    """The venv's site-packages on sys.path, with their .pth files, as a python started without -S has them."""
    if sys.flags.no_site and not SITE["added"]:
        import site

        site.main()
        SITE["added"] = True


def hub_library_found():
    """Whether huggingface_hub is importable: installed as a package directory in the venv's site-packages (looked
    at without site), else wherever site's processing puts it (an editable install's .pth, system site-packages)."""
    lib = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "lib",
                       f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    if os.path.isfile(os.path.join(lib, "huggingface_hub", "__init__.py")):
        return True
    with_site_packages()
    return importlib.util.find_spec("huggingface_hub") is not None


def get_json(url, headers):
    """The JSON body of GET `url`: with http.client (half urllib.request's imports), or with urllib.request when the
    environment names a proxy, which only urllib honours. Anything but 200 raises."""
    parts = urllib.parse.urlsplit(url)
    if any(name.lower() in PROXY_VARIABLES for name in os.environ) or parts.scheme not in ("http", "https"):
        from urllib.request import Request, urlopen

        with urlopen(Request(url, headers=headers), timeout=10) as response:
            return json.load(response)
    import http.client

    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.netloc, timeout=10)
    try:
        connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""), headers=headers)
        response = connection.getresponse()
        if response.status != 200:  # a redirect too: huggingface_hub follows it
            raise LookupError(f"{url}: HTTP {response.status}")
        return json.load(response)
    finally:
        connection.close()


def resolved(request):
    """The commit `revision` names on the hub now, from one standard-library request to the endpoint huggingface_hub's
    model_info asks (GET <endpoint>/api/models/<repo>/revision/<revision>); None on any failure, which the library
    then meets and reports as it always did (a venv without the library is reported so, without asking the hub)."""
    if not hub_library_found():
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/models/{request['repo']}/revision/{urllib.parse.quote(request['revision'], safe='')}"
    headers = {"Authorization": f"Bearer {request['token']}"} if request.get("token") else {}
    try:
        sha = get_json(url, headers).get("sha")
    except Exception:  # unreachable, gated, not found, not JSON: huggingface_hub says which
        return None
    full = isinstance(sha, str) and len(sha) == FULL_COMMIT_LEN and all(c in "0123456789abcdef" for c in sha)
    return sha if full else None


def hub_files(api, request, commit):
    files = []
    for entry in api.list_repo_tree(request["repo"], revision=commit, recursive=True):
        size = getattr(entry, "size", None)
        if size is None or not wanted(entry.path, request["allow"], request["ignore"]):
            continue  # folders, and files the server does not load
        lfs = getattr(entry, "lfs", None)
        blob = (lfs.sha256 if not isinstance(lfs, dict) else lfs["sha256"]) if lfs else entry.blob_id
        files.append({"path": entry.path, "size": size, "blob": blob})
    return sorted(files, key=lambda item: item["path"])


def plan(request, api):
    files = recorded(request)
    if files is not None:
        commit, asked_hub = request["revision"], False
    else:  # a branch or tag resolved to a commit a stage completed needs no huggingface_hub either
        commit = resolved(request) or api.model_info(request["repo"], revision=request["revision"]).sha
        files = recorded({**request, "revision": commit})
        if files is None:
            files = hub_files(api, request, commit)
        asked_hub = True
    linked, blobs = in_cache(request, commit, files)
    missing = [item for item in files if item["path"] not in set(linked)]
    if not any(item["path"] == "config.json" for item in files):
        raise LookupError(f"{request['repo']} at {commit} has no config.json among the files to stage")
    to_download = sum(item["size"] for item in missing if item["blob"] not in blobs)
    return {"commit": commit, "files": files, "missing": [item["path"] for item in missing],
            "missing_bytes": to_download, "free_bytes": free_bytes(request["hf_home"]),
            "hf_home": request["hf_home"], "asked_hub": asked_hub}


def staged_bytes(blobs_dir, files):
    """Bytes of the planned files on disk: complete blobs plus the library's `.incomplete` partial files."""
    done = 0
    names = {item["blob"]: item["size"] for item in files}
    try:
        entries = os.listdir(blobs_dir)
    except OSError:
        return 0
    for name in entries:
        blob = name.split(".")[0]
        if blob in names:
            try:
                done += min(os.path.getsize(os.path.join(blobs_dir, name)), names[blob])
            except OSError:
                pass  # renamed from .incomplete to its final name while we looked
    return done


def remove_partials(blobs_dir):
    """Partial files an interrupted stage left (the deploy lock keeps stages of one service apart).

    huggingface_hub 1.x downloads each file to a process-unique `<blob>.<id>.incomplete` and never reuses one
    (file_download.py `_download_to_tmp_and_move`), so after an interruption finished files are kept and an
    unfinished one is fetched again; this removes what the stopped process could not clean up."""
    try:
        names = os.listdir(blobs_dir)
    except OSError:
        return
    for name in names:
        if name.endswith(".incomplete"):
            try:
                os.remove(os.path.join(blobs_dir, name))
            except OSError:
                pass  # gone already


def stage(request, api):
    with_site_packages()
    from huggingface_hub import snapshot_download

    result = plan(request, api)
    if not result["missing"]:
        keep_plan(request, result)
        return result
    files, commit = result["files"], result["commit"]
    total = sum(item["size"] for item in files)
    blobs_dir = os.path.join(request["hf_home"], "hub", repo_folder(request["repo"]), "blobs")
    remove_partials(blobs_dir)
    # recorded before the first byte: a stage stopped part way (Ctrl-C, a lost connection, even just after its last
    # file) leaves a revision of ours, which a prune may remove; `recorded` trusts the list only once all is there
    path = record_path(request, commit)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump({"repo": request["repo"], "commit": commit, "allow": request["allow"],
                   "ignore": request["ignore"], "files": files}, handle)
    os.replace(path + ".tmp", path)
    finished = threading.Event()

    def report():
        while not finished.wait(1.0):
            emit("PROGRESS", f"{staged_bytes(blobs_dir, files)} {total}")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        snapshot_download(request["repo"], revision=commit, allow_patterns=request["allow"] or None,
                          ignore_patterns=request["ignore"] or None, max_workers=4)
    finally:
        finished.set()
        reporter.join()
    emit("PROGRESS", f"{staged_bytes(blobs_dir, files)} {total}")
    left = sorted(set(item["path"] for item in files) - set(in_cache(request, commit, files)[0]))
    if left:
        raise LookupError(f"after the download {len(left)} files are still missing: {', '.join(left[:5])}")
    keep_plan(request, {**result, "missing": []})
    return {**result, "downloaded_bytes": result["missing_bytes"]}


def cache_revisions(request, api):
    """Every model revision in the cache, with its size and whether a stage of ours recorded it (started it: a
    stopped stage's part of a revision is ours too)."""
    with_site_packages()
    from huggingface_hub import scan_cache_dir

    hub_dir = os.path.join(request["hf_home"], "hub")
    if not os.path.isdir(hub_dir):
        return {"hf_home": request["hf_home"], "revisions": []}
    revisions = []
    for repo in scan_cache_dir(hub_dir).repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            staged = os.path.exists(record_path({**request, "repo": repo.repo_id}, revision.commit_hash))
            revisions.append({"repo": repo.repo_id, "commit": revision.commit_hash, "bytes": revision.size_on_disk,
                              "files": revision.nb_files, "refs": sorted(revision.refs), "staged": staged})
    return {"hf_home": request["hf_home"], "revisions": revisions}


def prune_revisions(request, api):
    """Delete revisions a stage of ours recorded (never others) with huggingface_hub's own deletion, which keeps
    every blob another revision still links."""
    with_site_packages()
    from huggingface_hub import scan_cache_dir

    listed = cache_revisions(request, api)["revisions"]
    doomed = [r for r in listed if r["staged"] and r["commit"] in set(request["commits"])]
    freed = 0
    if doomed:
        strategy = scan_cache_dir(os.path.join(request["hf_home"], "hub")).delete_revisions(
            *[r["commit"] for r in doomed])
        freed = strategy.expected_freed_size
        strategy.execute()
    for revision in doomed:
        record = record_path({**request, "repo": revision["repo"]}, revision["commit"])
        os.remove(record)
        for name in os.listdir(os.path.dirname(record)):  # the plans its stages kept
            if name.startswith(revision["commit"] + "-") and name.endswith(".plan"):
                os.remove(os.path.join(os.path.dirname(record), name))
    return {"deleted": [r["commit"] for r in doomed], "freed_bytes": freed}


class Hub:
    """huggingface_hub's HfApi, imported at its first use: a plan answered from our records needs none."""

    def __init__(self):
        self.api = None

    def __getattr__(self, name):
        if self.api is None:
            with_site_packages()
            from huggingface_hub import HfApi

            self.api = HfApi()
        return getattr(self.api, name)


ACTIONS = {"plan": plan, "stage": stage, "list": cache_revisions, "prune": prune_revisions}


def error_kind(error):
    name = type(error).__name__
    if name in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "LookupError"):
        return "not_found"
    if name == "GatedRepoError":
        return "gated"
    if name in ("ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "ConnectionError",
                "OfflineModeIsEnabled", "RemoteProtocolError", "ReadError"):
        return "unreachable"
    if isinstance(error, OSError) and getattr(error, "errno", None) == 28:
        return "disk_full"
    return "hub_error"


def main(request):
    if not request.get("hf_home"):  # the service user's default cache, where SGLang looked before
        request["hf_home"] = os.path.join(pwd.getpwnam(request["user"]).pw_dir, ".cache", "huggingface")
    os.environ["HF_HOME"] = request["hf_home"]
    os.environ.pop("HF_HUB_CACHE", None)
    os.environ["HF_HUB_OFFLINE"] = "0"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if request.get("endpoint"):
        os.environ["HF_ENDPOINT"] = request["endpoint"]
    if request.get("token"):
        os.environ["HF_TOKEN"] = request["token"]
    try:
        result = ACTIONS[request["action"]](request, Hub())
    except ImportError as error:
        result = {"error": "no_library", "message": f"huggingface_hub is not importable in this venv: {error}"}
    except Exception as error:  # every failure is reported as data; the tool decides what it means
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        result = {"error": error_kind(error), "message": f"{type(error).__name__}: {first}"[:500]}
    emit("RESULT", json.dumps(result, sort_keys=True))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.stdin.readline())))
