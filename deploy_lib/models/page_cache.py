"""A release's weights and the host's page cache: where they lie on the host, how much of them the page cache holds,
and whether the deploy reads them in before the old server stops (pure; host_scripts/page_cache.py measures and reads
on the host, host/page_cache.py runs it).

A release with weights not in the page cache reads them from disk while its endpoint is down; read once beforehand,
while the old release serves, the server loads them from memory. They are read only when the host's MemAvailable
holds what is not resident yet with a margin (reading more than that would evict the pages it just read), and only
the files not resident already: weights resident already are read again by nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from pathlib import PurePosixPath

from deploy_lib.host_scripts.page_cache import RESULT_PREFIX, WEIGHT_SUFFIXES
from deploy_lib.models.facts import ModelFile, Weights, size_text
from deploy_lib.models.hub import HubModel
from deploy_lib.models.pushed import PushedModel
from deploy_lib.models.sources import HostPathModel
from deploy_lib.remote import Step, StepResult

SCRIPT_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("page_cache.py").read_text(encoding="utf-8")
MEASURE = "page cache: weights resident"
READ = "page cache: read weights"
# Reads the request (stdin's first line), then runs the rest of stdin (page_cache.py) and its main().
BOOTSTRAP = ('import json,sys;r=json.loads(sys.stdin.readline());g={"__name__":"page_cache"};'
             'exec(compile(sys.stdin.read(),"page_cache.py","exec"),g);sys.exit(g["main"](r))')
READ_TIMEOUT_S = 6 * 3600           # hundreds of GB from a slow disk; Ctrl-C or a dropped connection stops it sooner
MARGIN_BYTES = 4 * 1024 ** 3        # memory left to the host beyond the weights read in
MARGIN_FRACTION = 0.10              # and a tenth of the weights: room for what the starting server allocates (a guess)
RESIDENT_ENOUGH = 0.99              # a file this resident is not read again (a few pages evicted do not cost a read)


def files_text(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def is_weight(path: str) -> bool:
    return path.endswith(WEIGHT_SUFFIXES)


def weights_root(model: Mapping[str, str]) -> str | None:
    """The directory on the host the server loads a release's weights from (its release.json's `model`): a hub
    revision's snapshot in its HF cache, a pushed version directory, or the host path; None when not known (a hub
    model recorded without its cache or commit)."""
    path = model.get("path", "")
    if model.get("hf_home") and model.get("commit"):
        folder = "models--" + path.replace("/", "--")
        return str(PurePosixPath(model["hf_home"]) / "hub" / folder / "snapshots" / model["commit"])
    return path if path.startswith("/") else None


@dataclass(frozen=True)
class FileResidency:
    path: str                 # the real path (a snapshot's link resolved)
    size: int
    resident: int | None      # bytes in the page cache; None: mincore could not tell

    @property
    def needs_read(self) -> bool:
        return self.resident is None or self.resident < self.size * RESIDENT_ENOUGH


@dataclass(frozen=True)
class Residency:
    """How much of one release's weights the page cache holds, and the host's MemAvailable, at one reading."""

    files: tuple[FileResidency, ...]
    mem_available: int | None
    root: str | None = None   # the directory measured (None: a hub revision its cache does not hold)

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    @property
    def resident_bytes(self) -> int | None:
        if any(item.resident is None for item in self.files):
            return None
        return sum(item.resident or 0 for item in self.files)

    def line(self, label: str) -> str:
        """`weights of release X: 16.0 GB in 8 files, 12.0 GB (75%) in the page cache`."""
        if not self.files:
            return f"weights of {label}: no weight files found"
        head = f"weights of {label}: {size_text(self.total_bytes)} in {files_text(len(self.files))}, "
        resident = self.resident_bytes
        if resident is None:
            return head + "in the page cache: unknown (mincore not available)"
        share = resident / self.total_bytes if self.total_bytes else 1.0
        return head + f"{size_text(resident)} ({share:.0%}) in the page cache"


def measure_step(root: str) -> Step:
    """The weight files under `root`, their residency and the host's MemAvailable: read-only, nothing faults in;
    named after its root, so that one batch may measure several."""
    return _script_step(f"{MEASURE}: {root}", {"measure": {"root": root}}, 300)


def measure_weights_step(model: Weights) -> Step:
    """measure_step for a profile's weights before any plan: a hub revision's snapshot found by the host (a branch
    through its cache's refs), so that it rides in the decision's read; the reading names the root it measured."""
    if isinstance(model, HubModel):
        where = {"hf_home": model.hf_home or "", "user": model.user, "repo": model.repo, "revision": model.revision}
    elif isinstance(model, PushedModel):
        where = {"root": str(model.version_dir)}
    else:
        assert isinstance(model, HostPathModel)
        where = {"root": model.path}
    return _script_step(f"{MEASURE}: {model.label}", {"measure": where}, 300)


def read_step(files: Sequence[str]) -> Step:
    return _script_step(READ, {"files": list(files)}, READ_TIMEOUT_S)


def _script_step(name: str, request: Mapping[str, object], timeout_s: float) -> Step:
    """page_cache.py on the host's python3, as root (the weights may belong to the service user), the request on
    stdin's first line (thousands of paths would pass an argument's length limit); exit 1 is a traceback that the
    parser turns into a reason, never a failed deploy."""
    stdin = (json.dumps(request) + "\n" + SCRIPT_SOURCE).encode()
    return Step(name, ("python3", "-I", "-S", "-c", BOOTSTRAP), sudo=True, stdin=stdin, ok=frozenset({0, 1, 127}),
                timeout_s=timeout_s, repeatable=True)


def _result_line(result: StepResult) -> dict[str, object] | str:
    line = next((line for line in reversed(result.stdout.splitlines()) if line.startswith(RESULT_PREFIX)), None)
    if line is None:
        tail = (result.stderr or result.stdout).strip().splitlines()
        return f"page_cache.py exited {result.exit_code}: {tail[-1] if tail else 'no output'}"
    try:
        data = json.loads(line[len(RESULT_PREFIX):])
    except ValueError as error:
        return f"page_cache.py's result is not JSON: {error}"
    return data if isinstance(data, dict) else "page_cache.py's result is not an object"


def parse_residency(result: StepResult) -> Residency | str:
    """The reading, or why there is none."""
    data = _result_line(result)
    if isinstance(data, str):
        return data
    try:
        files = tuple(FileResidency(str(item["path"]), int(item["size"]),
                                    None if item["resident"] is None else int(item["resident"]))
                      for item in data["files"])  # type: ignore[attr-defined]
        available, root = data.get("mem_available"), data.get("root")
        return Residency(files, None if available is None else int(available),  # type: ignore[call-overload]
                         None if root is None else str(root))
    except (KeyError, TypeError, ValueError) as error:
        return f"page_cache.py's result is incomplete: {error}"


def parse_read(result: StepResult) -> int | str:
    """Bytes read, or why the read did not complete."""
    data = _result_line(result)
    if isinstance(data, str):
        return data
    read = data.get("read_bytes")
    return read if isinstance(read, int) else "page_cache.py's result has no read_bytes"


class Warm(Enum):
    read = "read"                    # the files in `files` are read before the stop
    resident = "resident"            # every weight file is in the page cache already: nothing to read
    does_not_fit = "does not fit"    # MemAvailable does not hold what is to read with the margin
    unknown = "unknown"              # the host's memory (or the weights) could not be read


@dataclass(frozen=True)
class WarmDecision:
    """Whether the deploy reads the new release's weights into the page cache before the old server stops."""

    warm: Warm
    files: tuple[str, ...]       # what is read (Warm.read only)
    to_read_bytes: int
    weights_bytes: int
    mem_available: int | None
    why: str = ""

    @property
    def needed_bytes(self) -> int:
        return needed_bytes(self.to_read_bytes, self.weights_bytes)

    def line(self) -> str:
        weights, available = size_text(self.weights_bytes), size_text(self.mem_available or 0)
        if self.warm is Warm.read:
            return (f"page cache: {size_text(self.to_read_bytes)} of the new weights ({weights}) to read in "
                    f"{files_text(len(self.files))} before the old server stops ({available} memory available)")
        if self.warm is Warm.resident:
            return f"page cache: the new weights ({weights}) are resident already; nothing to read"
        if self.warm is Warm.does_not_fit:
            return (f"page cache: the new weights are not read in before the stop: {size_text(self.to_read_bytes)} "
                    f"to read ({weights} in all) with a margin needs {size_text(self.needed_bytes)}, only "
                    f"{available} memory is available; the server reads them from disk while it starts")
        return f"page cache: the new weights are not read in before the stop ({self.why})"


def needed_bytes(to_read: int, weights: int) -> int:
    return to_read + MARGIN_BYTES + int(weights * MARGIN_FRACTION)


def decide(reading: Residency | str) -> WarmDecision:
    """Read the files not resident yet when MemAvailable holds them with the margin; nothing when all are resident."""
    if isinstance(reading, str):
        return WarmDecision(Warm.unknown, (), 0, 0, None, reading)
    weights = reading.total_bytes
    if not reading.files:
        return WarmDecision(Warm.unknown, (), 0, 0, reading.mem_available, "no weight files found")
    pending = tuple(item for item in reading.files if item.needs_read)
    to_read = sum(item.size - (item.resident or 0) for item in pending)
    if not pending:
        return WarmDecision(Warm.resident, (), 0, weights, reading.mem_available)
    if reading.mem_available is None:
        return WarmDecision(Warm.unknown, (), to_read, weights, None, "MemAvailable could not be read")
    if needed_bytes(to_read, weights) > reading.mem_available:
        return WarmDecision(Warm.does_not_fit, (), to_read, weights, reading.mem_available)
    return WarmDecision(Warm.read, tuple(item.path for item in pending), to_read, weights, reading.mem_available)


def planned_decision(files: Sequence[ModelFile], mem_available: int | None) -> WarmDecision:
    """A plan's decision for weights not staged yet (their sizes from the hub's listing): none of it is resident."""
    weights = tuple(FileResidency(item.path, item.size, 0) for item in files if is_weight(item.path))
    return decide(Residency(weights, mem_available))


def residency_line(label: str, reading: Residency | str) -> str:
    return f"weights of {label}: in the page cache: unknown ({reading})" if isinstance(reading, str) \
        else reading.line(label)


def plan_lines(current: tuple[str, Residency | str] | None, new: tuple[str, Residency | str] | None,
               staged: bool, listed: Sequence[ModelFile], same_weights: bool = False) -> tuple[str, ...]:
    """What a plan says of the page cache: the current release's weights resident, the new release's, and whether
    the deploy reads them in before the stop. `current` / `new`: (release label, its reading), None where the
    weights' directory is not known; `staged`: the new weights are all on the host (else `listed`, their sizes
    from the hub or the local directory, decide: none of them is resident yet); `same_weights`: the new release
    loads the current one's files (`new` is None), so the current reading decides."""
    if same_weights and current is not None:
        return (residency_line(f"{current[0]}, the new release's too", current[1]), decide(current[1]).line())
    known = [pair for pair in (current, new) if pair is not None]
    lines = [residency_line(label, reading) for label, reading in known]
    available = next((reading.mem_available for _, reading in known if isinstance(reading, Residency)), None)
    if staged and new is not None:
        lines.append(decide(new[1]).line())
    elif not staged:
        lines.append(planned_decision(listed, available).line())
    return tuple(lines)
