"""The JIT and compile caches of the processes that run from a venv, in cache/<venv-hash>/: a kernel built from
one venv's sources is never loaded by another.
"""

from __future__ import annotations

from deploy_lib.remote import Put, Step
from deploy_lib.store import StoreLayout
from deploy_lib.venvs.paths import cache_path

# Environment variable -> subdirectory of cache/<venv-hash>/ (FlashInfer adds .cache/flashinfer below its base).
# Bytecode too: uv does not compile at install (compiling a whole venv costs about a minute for the sandbox's and
# more for a real one), so the server compiles what it imports on its first start and keeps it here, never in the
# published venv, whose files are hard links shared with uv's cache and other venvs.
CACHE_VARIABLES = {
    "PYTHONPYCACHEPREFIX": "pycache",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "XDG_CACHE_HOME": "xdg",
}


def cache_environment(layout: StoreLayout, venv_hash: str) -> dict[str, str]:
    """Env-file entries pointing the JIT and compile caches at cache/<venv-hash>/: a kernel built from one venv's
    sources is never loaded by another, and an old release finds its own warm cache."""
    base = cache_path(layout, venv_hash)
    return {variable: str(base / subdir) for variable, subdir in CACHE_VARIABLES.items()}


def cache_dir_steps(layout: StoreLayout, venv_hash: str, owner: str) -> list[Step | Put]:
    """Create the cache directories, owned by the user the server runs as."""
    base = cache_path(layout, venv_hash)
    dirs = [str(base), *(str(base / subdir) for subdir in CACHE_VARIABLES.values())]
    return [Step("venv cache: directories", ("mkdir", "-p", "--", *dirs), sudo=True),
            Step("venv cache: owner", ("chown", "--", f"{owner}:", *dirs), sudo=True)]
