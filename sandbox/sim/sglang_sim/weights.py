"""Where SGLang would find the weights, and whether they are there: the sim refuses to start offline without them.

SGLang (0.5.23 srt/model_loader/weight_utils.py, `_find_local_hf_snapshot_dir_unlocked`) reads a repo id from
the HF cache: <hub cache>/models--ORG--NAME/refs/<revision or main> names the snapshot, snapshots/<commit>/ holds
it; a full commit is used as the snapshot name directly. With HF_HUB_OFFLINE=1 nothing is downloaded, and the
config is read first (transformers' AutoConfig), so a missing snapshot fails with transformers' OSError.

The weights phase reads every shard's bytes from disk, as safetensors_weights_iterator does (same file,
0.5.9 and 0.5.23: one shard after another, each mapped and every tensor copied out), so a cold page cache costs
the sim real time and a warm one does not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

# transformers 5.19.0 utils/hub.py, cached_files(), for a LocalEntryNotFoundError (offline and not cached)
OFFLINE_MESSAGE = ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
                   "them in the cached files.\nCheck your internet connection or see how to run the library in "
                   "offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'.")
_TRUE = ("1", "ON", "YES", "TRUE")  # huggingface_hub.constants._is_true
READ_CHUNK = 16 * 1024 * 1024


def offline(environ: Mapping[str, str]) -> bool:
    return environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_cache(environ: Mapping[str, str]) -> Path:
    """huggingface_hub's cache: HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME (or ~/.cache)/huggingface/hub."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
    return Path(home) / "hub"


def snapshot_dir(model_path: str, revision: str | None, environ: Mapping[str, str]) -> Path | None:
    """The directory the server would load from: the path itself, or the cached snapshot of a repo id."""
    if model_path.startswith("/"):
        return Path(model_path)
    repo_dir = hub_cache(environ) / ("models--" + model_path.replace("/", "--"))
    ref = repo_dir / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    return repo_dir / "snapshots" / commit if commit else None


def missing_weights(model_path: str, revision: str | None, environ: Mapping[str, str]) -> bool:
    """Offline and no config.json where the server would read it: SGLang could not start."""
    found = snapshot_dir(model_path, revision, environ)
    return offline(environ) and (found is None or not (found / "config.json").is_file())


def shard_files(snapshot: Path | None) -> list[Path]:
    """The snapshot's safetensors shards (loader.py _prepare_weights globs `*.safetensors`), sorted so that the
    log is the same at every start."""
    return sorted(snapshot.glob("*.safetensors")) if snapshot is not None and snapshot.is_dir() else []


def read_shard(shard: Path, stop: threading.Event) -> bool:
    """Read every byte of one shard, through the page cache; False when `stop` was set meanwhile."""
    buffer = bytearray(READ_CHUNK)
    with shard.open("rb", buffering=0) as stream:
        while stream.readinto(buffer):
            if stop.is_set():
                return False
    return True
