"""Content-addressed virtual environments on the host: built from a lock + wheelhouse, adopted, or derived.

Layout, under the store's <root>/<service>/ (store.py):

    venvs/<hash>/         immutable once published: venv.json (the marker) says it is complete
    venvs/<hash>.tmp/     a build in progress or an interrupted one: never used, cleared before a rebuild
    wheels/<sha256>/<wheel file>   wheels pushed from a local wheelhouse; a wheel travels once per host
    tools/<sha256>/uv     the uv binary, taken from the pinned uv wheel wheels/<sha256>/ (UV_WHEELS)
    uv-cache/             uv's cache: each wheel unpacked once, then hard-linked into every venv that installs it
    cache/<hash>/         JIT and compile caches of the processes that run from venvs/<hash>
    facts/<path hash>/    what a venv (by its path) holds of SGLang, cached by the facts and verified on each read
                          (StoreLayout.sglang_facts_dir: the facts need it without this package)

A venv is created by `uv venv` in venvs/<hash>.tmp, filled by `uv pip install --no-deps --require-hashes` from the
host's wheels (hard links from uv's cache, on the same filesystem as the venvs), and renamed to venvs/<hash> only
once that succeeded and the marker is written, so a half-built venv never becomes usable. A derived venv (a
patched one) is a hard-linked copy of its base whose changed files are written as new files and renamed over the
links: the base never changes. Paths baked into a venv (console-script shebangs, activate scripts, pyvenv.cfg) are
rewritten for the new location, again as new files; the server itself runs as `<venv>/bin/python3 -m
sglang.launch_server`, which needs none.

Everything here builds Step/Put batches and parses what they read. What acts on the host is in deploy_lib/host/:
venv_store (what the store holds, read in one batch), venv_publish, venv_build, venv_adopt, venv_derive and
venv_lifecycle (list and prune).

    paths        names in the store (venvs/<hash>, wheels/<sha256>, tools/, uv-cache/, cache/<hash>) and the
                 hashes
    lock         the requirements lock: every line pinned with `==` and hashed
    interpreter  who the host's (or a venv's) python is: what a venv's hash covers of it
    installed    what a venv imports and from where (editable installs), for status and patch sets
    wheels       which local wheels fit the host and which it lacks; the pinned uv wheel
    caches       the JIT and compile caches of each venv
    host_scripts the text of the venv scripts the host's python runs (deploy_lib/host_scripts/venv_*.py)
"""

from deploy_lib.profile.settings import VenvSpec
from deploy_lib.venvs.caches import cache_dir_steps, cache_environment
from deploy_lib.venvs.host_scripts import (
    FETCH_UV_SCRIPT,
    INSPECT_SCRIPT,
    INSTALLED_FACTS_SCRIPT,
    PYTHON_FACTS_SCRIPT,
    RELOCATE_SCRIPT,
    TREE_SCRIPT,
    VERIFY_SCRIPT,
)
from deploy_lib.venvs.installed import InstalledFacts, Origin, installed_fact, installed_step, parse_installed
from deploy_lib.venvs.interpreter import FACT_PYTHON, PythonFacts, python_step
from deploy_lib.venvs.lock import Lock, load_lock, parse_lock
from deploy_lib.venvs.paths import (
    HASH_CHARS,
    MARKER_FILE,
    release_venv_hash,
    staging_path,
    venv_path,
    wheel_dir,
)
from deploy_lib.venvs.wheels import UV_BINARY_MEMBER, UV_VERSION, UV_WHEELS, select_wheels, wheel_fits

__all__ = [
    "FACT_PYTHON", "FETCH_UV_SCRIPT", "HASH_CHARS", "INSPECT_SCRIPT", "INSTALLED_FACTS_SCRIPT", "MARKER_FILE",
    "PYTHON_FACTS_SCRIPT", "RELOCATE_SCRIPT", "TREE_SCRIPT", "UV_BINARY_MEMBER", "UV_VERSION", "UV_WHEELS",
    "VERIFY_SCRIPT", "InstalledFacts", "Lock", "Origin", "PythonFacts", "VenvSpec", "cache_dir_steps",
    "cache_environment", "installed_fact", "installed_step", "load_lock", "parse_installed", "parse_lock",
    "python_step", "release_venv_hash", "select_wheels", "staging_path", "venv_path", "wheel_dir", "wheel_fits",
]
