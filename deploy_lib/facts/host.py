"""Host facts (pure): the one read-only batch a deploy reads before acting, its parsers, a frozen HostFacts."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

from deploy_lib.digests import sha256_text
from deploy_lib.errors import PreflightError
from deploy_lib.facts.cuda_toolkit import CudaToolkit, parse_toolkit, toolkit_steps
from deploy_lib.host_paths import venv_python
from deploy_lib.profile import ParallelSpec
from deploy_lib.release.render import loaded_unit_digest
from deploy_lib.remote import Step, StepResult, concurrently
from deploy_lib.remote.readings import TOOL_ABSENT_OK, Fact, Readings
from deploy_lib.store import (
    ENV_FILE,
    LAUNCHER_FILE,
    UNIT_FILE,
    StoreFacts,
    StoreLayout,
    parse_store_facts,
    release_fact_steps,
)

GPU_FIELDS = ("index", "name", "uuid", "compute_cap", "memory.total", "memory.used", "power.draw", "power.limit",
              "utilization.gpu", "driver_version")
# The nvidia-smi arguments whose output parse_gpus reads (telemetry samples use the same columns).
NVIDIA_SMI_QUERY = ("nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
# The extractor, sent to the venv's python as text (never imported here); its cache's first line.
OPTIONS_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("sglang_options.py").read_text(encoding="utf-8")
CACHE_HEADER = "sglang-deploy sglang facts 1"

FACT_GPUS = "host facts: GPUs"
FACT_UNIT = "host facts: unit state"
FACT_UNIT_LINK = "host facts: unit link"
FACT_UNIT_FILE = "host facts: unit file"
FACT_UNIT_TIMES = "host facts: unit file times"
FACT_FILE_SUMS = "host facts: current release checksums"
FACT_RELEASE_SUMS = "host facts: checksums of the release to run"
FACT_PORT = "host facts: port listeners"
FACT_DISK = "host facts: free disk"
FACT_SGLANG = "host facts: SGLang in the venv"
FACT_IMPORT = "host facts: where the server imports SGLang from"
# Run by the venv's python in the unit's working directory, as `python -m sglang.launch_server` runs there (the
# working directory first on sys.path): where `sglang` is imported from, and where it is without that entry.
IMPORT_SCRIPT = r"""
import importlib.util, json, sys
def where():
    spec = importlib.util.find_spec("sglang")
    return sorted(spec.submodule_search_locations or [spec.origin]) if spec else None
served = where()
sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]
print(json.dumps({"served": served, "installed": where()}))
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str
    memory_total_mib: float
    memory_used_mib: float
    power_draw_w: float | None
    power_limit_w: float | None
    utilization_pct: float | None

    @property
    def arch(self) -> str:
        """`sm120` for compute capability 12.0."""
        return "sm" + self.compute_cap.replace(".", "")


@dataclass(frozen=True)
class UnitFacts:
    active_state: str
    sub_state: str
    main_pid: int
    n_restarts: int
    load_state: str
    result: str = "success"  # how the last run ended: exit-code, signal, start-limit-hit, ...
    # systemd's NeedDaemonReload: its unit file (through the link) is newer than what it loaded; unknown reads as yes
    need_daemon_reload: bool = True
    unit_digest: str | None = None  # of the unit text systemd has loaded, from its Description= (render.py)


@dataclass(frozen=True)
class SGLangInstall:
    python_found: bool
    sglang_version: str | None
    flashinfer_version: str | None
    options: dict[str, dict[str, Any]]
    error: str | None
    torch_version: str | None = None   # from the distributions' metadata, nothing imported
    nccl_version: str | None = None    # torch's NCCL (the nvidia-nccl-cuXX wheel); None: not installed as a wheel


@dataclass(frozen=True)
class HostFacts:
    store: StoreFacts
    gpus: tuple[Gpu, ...] | None          # None: nvidia-smi missing or failing
    gpu_error: str | None
    unit: UnitFacts
    unit_link: str | None                 # where /etc/systemd/system/<unit> points, None if absent
    file_sums: dict[str, str]             # file name in current release -> sha256
    port_listeners: tuple[str, ...]       # `ss` lines of processes listening on the profile's port
    free_bytes: int | None
    sglang: SGLangInstall
    cuda_toolkit: CudaToolkit | None = None  # at the release's CUDA_HOME; None when not asked for
    import_shadow: str | None = None  # the server would import SGLang from here (its working directory), not the venv's
    unit_file: str | None = None          # `systemctl cat` of the unit (file and drop-ins); None: no such unit
    model_results: tuple[StepResult, ...] = ()  # what the weights' own fact steps read (models.Weights parses them)
    release_sums: Mapping[str, str] = field(default_factory=dict)  # the files of the release to run (rollback)
    unit_times: Mapping[str, Decimal] = field(default_factory=dict)  # release id -> its unit file's mtime


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]" and "[Not Supported]" in nvidia-smi output


def parse_gpus(result: StepResult) -> tuple[tuple[Gpu, ...] | None, str | None]:
    if result.exit_code == 127:
        return None, "nvidia-smi not found on the host (no NVIDIA driver?)"
    if result.exit_code != 0:
        return None, f"nvidia-smi exited {result.exit_code}: {(result.stderr or result.stdout).strip()[-300:]}"
    gpus = []
    for row in csv.reader(io.StringIO(result.stdout), skipinitialspace=True):
        if len(row) != len(GPU_FIELDS):
            continue
        values = dict(zip(GPU_FIELDS, (cell.strip() for cell in row), strict=True))
        gpus.append(Gpu(index=int(values["index"]), name=values["name"], compute_cap=values["compute_cap"],
                        memory_total_mib=_number(values["memory.total"]) or 0.0,
                        memory_used_mib=_number(values["memory.used"]) or 0.0,
                        power_draw_w=_number(values["power.draw"]), power_limit_w=_number(values["power.limit"]),
                        utilization_pct=_number(values["utilization.gpu"])))
    return tuple(gpus), None


def parse_systemctl_show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_unit(result: StepResult) -> UnitFacts:
    props = parse_systemctl_show(result.stdout)

    def integer(name: str) -> int:
        value = props.get(name, "")
        return int(value) if value.isdigit() else 0

    return UnitFacts(active_state=props.get("ActiveState", "unknown"), sub_state=props.get("SubState", "unknown"),
                     main_pid=integer("MainPID"), n_restarts=integer("NRestarts"),
                     load_state=props.get("LoadState", "unknown"), result=props.get("Result", "success"),
                     need_daemon_reload=props.get("NeedDaemonReload") != "no",
                     unit_digest=loaded_unit_digest(props.get("Description", "")))


def parse_unit_times(text: str) -> dict[str, Decimal]:
    """release id -> mtime of its unit file, from `find -printf '%h %T@\\0'` (the release directory, seconds)."""
    times = {}
    for entry in filter(None, text.split("\0")):
        directory, _, seconds = entry.rpartition(" ")
        try:
            times[PurePosixPath(directory).name] = Decimal(seconds)
        except InvalidOperation:
            continue
    return times


def parse_sha256sums(text: str) -> dict[str, str]:
    sums = {}
    for line in text.splitlines():
        match = re.match(r"^([0-9a-f]{64})\s+\*?(.+)$", line)
        if match:
            sums[PurePosixPath(match.group(2)).name] = match.group(1)
    return sums


def parse_free_bytes(df_output: str) -> int | None:
    """Available bytes on the last filesystem `df -P -B1` listed (the nearest existing parent of the store)."""
    rows = [line.split() for line in df_output.splitlines()[1:]]
    available = [int(row[3]) for row in rows if len(row) >= 6 and row[3].isdigit()]
    return available[-1] if available else None


def parse_sglang_install(result: StepResult) -> SGLangInstall:
    if result.exit_code == 127:
        return SGLangInstall(False, None, None, {}, "the venv's python3 was not found")
    try:
        payload = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return SGLangInstall(True, None, None, {}, (result.stderr or result.stdout).strip()[-300:] or "no output")
    if "error" in payload:
        return SGLangInstall(True, None, None, {}, str(payload["error"]))
    return SGLangInstall(True, payload.get("sglang_version"), payload.get("flashinfer_version"),
                         payload.get("options", {}), None, payload.get("torch_version"), payload.get("nccl_version"))


# SGLang's options and versions as the venv's python computed them last time (sglang_options.py's cache file), when
# the cache is whole (its payload's sha256), every file they were read from still has the sha256 recorded, and the
# directories on the python's sys.path still list the same names, __pycache__ aside (nothing installed or removed);
# otherwise that python computes them again ("write": and stores them). $1 the cache file, $2 the venv's python,
# $3 write or read; sglang_options.py on stdin.
SGLANG_CHECK = f"""if [ -x "$2" ] && [ -f "$1" ] && [ "$(sed -n 1p "$1")" = '{CACHE_HEADER}' ] \\
  && [ "$(sed -n 's/^J //p' "$1" | sha256sum)" = "$(sed -n 's/^P //p' "$1")  -" ] \\
  && sed -n 's/^S //p' "$1" | sha256sum -c --status - 2>/dev/null \\
  && [ "$(sed -n 's/^D //p' "$1" | while IFS= read -r d; do printf '%s\\n' "$d"
         find "$d" -mindepth 1 -maxdepth 1 ! -name __pycache__ -printf '%f\\n' 2>/dev/null | LC_ALL=C sort
       done | sha256sum)" \\
       = "$(sed -n 's/^L //p' "$1")  -" ]; then
  exec sed -n 's/^J //p' "$1"
fi
[ "$3" = write ] && [ -d "$4" ] && exec "$2" -I - --cache "$1" '{CACHE_HEADER}'
exec "$2" -I -
"""
# The cache's name changes with the extractor and the check, so another version of the tool never reads it.
SGLANG_FACTS_FILE = f"sglang-{sha256_text(OPTIONS_SOURCE + SGLANG_CHECK)[:16]}.facts"


def sglang_step(layout: StoreLayout, venv: str, write_cache: bool) -> Step:
    """The venv's SGLang options and versions (no import): from the cache beside the store when it still verifies,
    else from the venv's own python running sglang_options.py, which refreshes the cache when `write_cache` and the
    store already holds releases: a deploy refused on first contact with a host leaves no file there."""
    cache = layout.sglang_facts_dir(venv) / SGLANG_FACTS_FILE
    return Step(FACT_SGLANG, ("sh", "-c", SGLANG_CHECK, "sh", str(cache), str(venv_python(venv)),
                              "write" if write_cache else "read", str(layout.releases)),
                stdin=OPTIONS_SOURCE.encode(), sudo=True, ok=frozenset({0, 1, 127}), timeout_s=120)


# The working directory can only shadow the venv's SGLang through an entry named `sglang` (a package, or a namespace
# portion) or `sglang.*` (a module: .py, .pyc, an extension); without one the shell answers and no Python starts.
IMPORT_CHECK = """cd -- "$1" 2>/dev/null || exit 125
for entry in sglang sglang.*; do
  if [ -e "$entry" ] || [ -L "$entry" ]; then exec "$2" -c "$3"; fi
done
"""


def import_step(venv: str, working_directory: str) -> Step:
    """IMPORT_SCRIPT run by the venv's python in the working directory, only when that directory has an entry that
    could be imported as `sglang`; otherwise nothing is printed (no shadow)."""
    return Step(FACT_IMPORT, ("sh", "-c", IMPORT_CHECK, "sh", working_directory, str(venv_python(venv)),
                              IMPORT_SCRIPT), sudo=True, ok=frozenset({0, 1, 125, 126, 127}), timeout_s=60)


def parse_import_shadow(result: StepResult) -> str | None:
    """Where the server would import sglang from when that is not where the venv has it (e.g. a checkout's parent
    holding `sglang/`, imported as a namespace package before an editable install's finder); None when the same."""
    if result.exit_code != 0 or not result.stdout.strip():  # no directory, or nothing in it named sglang
        return None
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except ValueError:
        return None
    served, installed = data.get("served"), data.get("installed")
    return ", ".join(served) if served and installed and served != installed else None


def gpu_step(name: str) -> Step:
    """One read of every GPU; a host without nvidia-smi (exit 127) is a fact for parse_gpus, not a failure."""
    return Step(name, NVIDIA_SMI_QUERY, ok=TOOL_ABSENT_OK, timeout_s=30)


def unit_step(layout: StoreLayout) -> Step:
    return Step(FACT_UNIT, ("systemctl", "show", "-p",
                            "ActiveState,SubState,MainPID,NRestarts,LoadState,Result,NeedDaemonReload,Description",
                            "--",
                            layout.unit_name))


def _stdout_if_found(result: StepResult) -> str | None:
    return result.stdout if result.exit_code == 0 else None


def _sums(layout: StoreLayout, name: str, release: PurePosixPath) -> Fact[dict[str, str]]:
    # a release written before launchers has none: sha256sum says so on stderr and sums the others
    return Fact(Step(name, ("sha256sum", "--", *(str(release / file) for file in (UNIT_FILE, ENV_FILE, LAUNCHER_FILE))),
                     sudo=True, ok=TOOL_ABSENT_OK), lambda result: parse_sha256sums(result.stdout))


# What only preflight reads (and the CUDA toolkit): none of it computes the release or says whether the current one
# serves, so a deploy reads it once it knows it changes the host (`preflight_batch`), a no-op never.
PREFLIGHT_ONLY = ("gpus", "port_listeners", "free_bytes", "import_shadow")
NOT_READ = "not read"


@dataclass(frozen=True)
class FactRequest:
    """What a read of the host facts asks for. Without a venv (status) SGLang is not inspected; without a port no
    listener is looked up; without a CUDA_HOME no toolkit is read; the weights' own fact steps
    (models.Weights.fact_steps) ride along; with a release id (a rollback target) that release's files are
    checksummed. The one thing it may write is the cache of what the venv holds of SGLang (derived, verified on
    read), and only with `write_caches` (not for a dry run). Without `preflight`, what a deploy decides from: all
    but what only preflight reads (GPUs, listeners, disk, toolkit, ...: `preflight_part`)."""

    layout: StoreLayout
    venv: str | None
    port: int | None
    cuda_home: str | None = None
    working_directory: str | None = None
    model_steps: tuple[Step, ...] = ()
    release_id: str | None = None
    write_caches: bool = True
    preflight: bool = True

    @property
    def preflight_part(self) -> FactRequest:
        """The request of what only preflight reads of this one: a deploy reads it once it knows it changes the host."""
        return FactRequest(self.layout, self.venv, self.port, self.cuda_home, self.working_directory)

    def facts(self, decision: bool = True) -> dict[str, Fact[Any]]:
        """The single-step facts of the batch by the HostFacts field each fills; the optional ones only when asked;
        those a deploy decides from (all but PREFLIGHT_ONLY), those only preflight reads, or both."""
        layout = self.layout
        facts: dict[str, Fact[Any]] = {
            "gpus": Fact(gpu_step(FACT_GPUS), parse_gpus),
            "unit": Fact(unit_step(layout), parse_unit),
            "unit_link": Fact(Step(FACT_UNIT_LINK, ("readlink", "--", str(layout.unit_link)), ok=TOOL_ABSENT_OK),
                              lambda result: result.stdout.strip() if result.exit_code == 0 else None),
            "unit_file": Fact(Step(FACT_UNIT_FILE, ("systemctl", "cat", "--", layout.unit_name), ok=TOOL_ABSENT_OK),
                              _stdout_if_found),
            "file_sums": _sums(layout, FACT_FILE_SUMS, layout.current),
            # what decides whether a switch keeps systemd's NeedDaemonReload "no" (deploy/plan.py unit_held)
            "unit_times": Fact(Step(FACT_UNIT_TIMES, ("find", str(layout.releases), "-mindepth", "2", "-maxdepth",
                                                      "2", "-name", UNIT_FILE, "-printf", "%h %T@\\0"),
                                    ok=TOOL_ABSENT_OK),
                               lambda result: parse_unit_times(result.stdout)),
            "free_bytes": Fact(Step(FACT_DISK, ("df", "-P", "-B1", "--", "/", *_existing_parents(layout.root)),
                                    ok=TOOL_ABSENT_OK), lambda result: parse_free_bytes(result.stdout)),
        }
        if self.release_id is not None:
            facts["release_sums"] = _sums(layout, FACT_RELEASE_SUMS, layout.release(self.release_id))
        if self.port is not None:
            facts["port_listeners"] = Fact(
                Step(FACT_PORT, ("ss", "-Htlnp", f"sport = :{self.port}"), sudo=True, ok=TOOL_ABSENT_OK),
                lambda result: tuple(line for line in result.stdout.splitlines() if line.strip()))
        if self.venv is not None:
            facts["sglang"] = Fact(sglang_step(layout, self.venv, self.write_caches), parse_sglang_install)
        if self.venv is not None and self.working_directory is not None:
            facts["import_shadow"] = Fact(import_step(self.venv, self.working_directory), parse_import_shadow)
        return {role: fact for role, fact in facts.items()
                if (self.preflight if role in PREFLIGHT_ONLY else decision)}


def fact_batch(request: FactRequest) -> list[Step]:
    """Everything preflight and the plan need (what `request` asks for), read-only, in as few round trips as the
    batching allows."""
    facts = request.facts()
    # the steps that each start a Python in the venv (SGLang's options, its import origin, the model plan) run
    # at the same time, after the quick reads
    slow = [facts.pop(role).step for role in ("sglang", "import_shadow") if role in facts]
    return [*release_fact_steps(request.layout), *(fact.step for fact in facts.values()),
            *(toolkit_steps(request.cuda_home) if request.cuda_home is not None and request.preflight else ()),
            *concurrently([*slow, *request.model_steps])]


def preflight_batch(request: FactRequest) -> list[Step]:
    """What `fact_batch` of the request without `preflight` leaves out, read-only: a deploy's read before it changes
    anything."""
    whole = request.preflight_part
    decision = fact_batch(replace(whole, preflight=False))
    return [step for step in fact_batch(whole) if step not in decision]


def _existing_parents(path: PurePosixPath) -> tuple[str, ...]:
    # df fails for a path that does not exist yet but still prints the others; the last line is the nearest.
    return tuple(str(p) for p in reversed([path, *path.parents]) if str(p) != "/")


def _values(readings: Readings, facts: dict[str, Fact[Any]], cuda_home: str | None) -> dict[str, Any]:
    """The HostFacts fields that `facts` and the toolkit at `cuda_home` fill, from a batch that read them."""
    values = {role: readings.value(fact) for role, fact in facts.items()}
    if "gpus" in values:
        values["gpus"], values["gpu_error"] = values.pop("gpus")
    return {**values, "cuda_toolkit": parse_toolkit(cuda_home, readings) if cuda_home is not None else None}


def parse_host_facts(readings: Readings, request: FactRequest) -> HostFacts:
    """HostFacts from a batch holding `fact_batch(request)` (and steps of the caller's own); without `preflight`,
    what only preflight reads is "not read" (nothing found) until `with_preflight_facts`."""
    values: dict[str, Any] = {"gpus": None, "gpu_error": NOT_READ, "free_bytes": None, "port_listeners": (),
                              "sglang": SGLangInstall(True, None, None, {}, NOT_READ),
                              **_values(readings, request.facts(), request.cuda_home if request.preflight else None)}
    return HostFacts(store=parse_store_facts(request.layout, readings),
                     model_results=tuple(readings[step.name] for step in request.model_steps), **values)


def with_preflight_facts(facts: HostFacts, readings: Readings, request: FactRequest) -> HostFacts:
    """`facts` with what only preflight reads, from a batch holding `preflight_batch(request)`."""
    whole = request.preflight_part
    return replace(facts, **_values(readings, whole.facts(decision=False), whole.cuda_home))


def require_gpus(facts: HostFacts, parallel: ParallelSpec, where: str) -> tuple[Gpu, ...]:
    if facts.gpus is None:
        raise PreflightError(f"{where}: cannot read the GPUs: {facts.gpu_error}",
                             "install the NVIDIA driver (nvidia-smi) on the host")
    if len(facts.gpus) < parallel.gpus_per_node:
        raise PreflightError(f"{where}: the profile's parallel: {parallel.shape} needs {parallel.gpus_per_node} "
                             f"GPUs per node, nvidia-smi shows {len(facts.gpus)}", parallel.fitting(len(facts.gpus)))
    return facts.gpus
