"""Content-addressed virtual environments on the host: built from a lock + wheelhouse, adopted, or derived.

Layout, under the store's <root>/<service>/ (store.py):

    venvs/<hash>/         immutable once published: venv.json (the marker) says it is complete
    venvs/<hash>.tmp/     a build in progress or an interrupted one: never used, cleared before a rebuild
    wheels/<sha256>/<wheel file>   wheels pushed from a local wheelhouse; a wheel travels once per host
    tools/<sha256>/uv     the uv binary, taken from the pinned uv wheel wheels/<sha256>/ (UV_WHEELS)
    uv-cache/             uv's cache: each wheel unpacked once, then hard-linked into every venv that installs it
    cache/<hash>/         JIT and compile caches of the processes that run from venvs/<hash>

A venv is created by `uv venv` in venvs/<hash>.tmp, filled by `uv pip install --no-deps --require-hashes` from the
host's wheels (hard links from uv's cache, on the same filesystem as the venvs), and renamed to venvs/<hash> only
once that succeeded and the marker is written, so a half-built venv never becomes usable. A derived venv (a
patched one) is a hard-linked copy of its base whose changed files are written as new files and renamed over the
links: the base never changes. Paths baked into a venv (console-script shebangs, activate scripts, pyvenv.cfg) are
rewritten for the new location, again as new files; the server itself runs as `<venv>/bin/python3 -m
sglang.launch_server`, which needs none.

Everything here builds Step/Put batches and parses what they read; the few functions that act (`ensure_venv`,
`adopt`, `derive`, `list_venvs`) only call a Remote they are given.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from deploy_lib.errors import ConfigError, DeployError, PreflightError, StepFailed
from deploy_lib.progress import NullProgress, Progress
from deploy_lib.readings import ABSENT_OK, Readings
from deploy_lib.remote import Put, Remote, Step, StepResult, describe
from deploy_lib.settings import VenvSpec
from deploy_lib.store import STAGING_SUFFIX, StoreLayout, host_lock, iso_time, json_line
from deploy_lib.venvs.host_scripts import (
    EXTRACT_UV_SCRIPT,
    FETCH_UV_SCRIPT,
    IMPORTED_FROM_SCRIPT,
    INSPECT_SCRIPT,
    INSTALLED_FACTS_SCRIPT,
    PYTHON_FACTS_SCRIPT,
    RELOCATE_SCRIPT,
    TREE_SCRIPT,
    VERIFY_SCRIPT,
)

MARKER_FILE = "venv.json"
LOCK_FILE = "requirements.lock"
HASH_CHARS = 16  # of the sha256 hex digest: short enough for shebangs, plenty for one host's venvs
WHEEL_MODE = 0o644
INSTALL_TIMEOUT_S = 3600
COPY_TIMEOUT_S = 1800
INSPECT_TIMEOUT_S = 1800
INSTALLER_ERROR_LINES = 40
# The installer: uv from PyPI, pinned by version and by the sha256 of its wheel per host machine (as PyPI serves
# them); the binary is the wheel's uv-<version>.data/scripts/uv.
UV_VERSION = "0.13.9"
UV_WHEELS = {
    "x86_64": ("uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
               "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"),
    "aarch64": ("uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
                "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe"),
}
UV_BINARY_MEMBER = f"uv-{UV_VERSION}.data/scripts/uv"
JIT_CACHE_DISTRIBUTION = "flashinfer-jit-cache"
STATUS_DISTRIBUTIONS = ("sglang", "flashinfer-python", "torch")
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

FACT_PYTHON = "venv facts: host python"
FACT_MARKERS = "venv facts: markers"
FACT_DIRS = "venv facts: venv directories"
FACT_WHEELS = "venv facts: wheels on the host"
FACT_TOOLS = "venv facts: uv binaries on the host"
FACT_SIZES = "venv facts: sizes"
FACT_INSPECT = "venv adopt: inspect"
FACT_ADOPT_PYTHON = "venv adopt: inspect interpreter"
FACT_MODES = "venv derive: modes of replaced files"
INSTALL_STEP = "venv build: uv pip install"
VERIFY_STEP = "venv build: verify wheels on the host"
FETCH_UV_STEP = "venv build: fetch uv from the index"

_HASH_RE = re.compile(rf"^[0-9a-f]{{{HASH_CHARS}}}$")
_NAME_RE = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")
_PIN_RE = re.compile(r"^==\s*([A-Za-z0-9_.!+-]+)\s*(?:;\s*(.+))?$")
_HASH_OPTION_RE = re.compile(r"--hash(?:=|\s+)(\S+)")
_SHA256_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                       r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _short_hash(text: str) -> str:
    return _sha256(text.encode())[:HASH_CHARS]


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name: `Flashinfer_Python` -> `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_venv_hash(venv_hash: str) -> str:
    if not _HASH_RE.fullmatch(venv_hash):
        raise ConfigError(f"invalid venv hash {venv_hash!r}", hint=f"a venv hash is {HASH_CHARS} hex digits "
                                                                    "(see `invoke venv.list`)")
    return venv_hash


# ---------------------------------------------------------------------------------------------------------
# The lock


@dataclass(frozen=True)
class Requirement:
    name: str                 # canonical
    version: str
    extras: tuple[str, ...]
    marker: str
    hashes: frozenset[str]    # sha256 hex digests
    line: int

    def normalized(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        marker = f" ; {self.marker}" if self.marker else ""
        hashes = " ".join(f"--hash=sha256:{digest}" for digest in sorted(self.hashes))
        return f"{self.name}{extras}=={self.version}{marker} {hashes}"


@dataclass(frozen=True)
class Lock:
    path: Path
    requirements: tuple[Requirement, ...]   # sorted by name

    def text(self) -> str:
        """The normalised lock: what the hash covers and what pip reads on the host (comments and order gone)."""
        return "".join(requirement.normalized() + "\n" for requirement in self.requirements)

    @property
    def sha256(self) -> str:
        return _sha256(self.text().encode())

    def distributions(self) -> dict[str, str]:
        return {r.name: r.version for r in self.requirements}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line number, joined text) with comments removed and backslash continuations joined."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate([*text.splitlines(), ""], start=1):  # the empty line ends a dangling continuation
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        pending.append(line.removesuffix("\\").strip())
        if line.endswith("\\"):
            continue
        joined = " ".join(part for part in pending if part)
        pending = []
        if joined:
            yield start, joined


def parse_lock(text: str, path: Path) -> Lock:
    """Every requirement pinned with `==` and at least one `--hash=sha256:`; anything else is a ConfigError."""
    found: dict[str, Requirement] = {}
    for number, line in _logical_lines(text):
        def bad(why: str, number: int = number, line: str = line) -> ConfigError:
            return ConfigError(f"{path}:{number}: {why}: {line[:200]}",
                               hint="generate the lock with `pip-compile --generate-hashes` or "
                                    "`uv pip compile --generate-hashes`; the profile says where wheels come from")
        hash_values = _HASH_OPTION_RE.findall(line)
        spec = _HASH_OPTION_RE.sub(" ", line).strip()
        if spec.startswith("-"):
            raise bad("options are not allowed in a lock (only requirements with --hash)")
        match = _NAME_RE.match(spec)
        pin = _PIN_RE.match(match.group(3).strip()) if match else None
        if match is None or pin is None or "*" in pin.group(1):
            raise bad("requirement is not pinned with `name==version`")
        digests = set()
        for value in hash_values:
            sha = _SHA256_RE.match(value)
            if sha is None:
                raise bad(f"hash {value!r} is not sha256:<64 hex digits>")
            digests.add(sha.group(1))
        if not digests:
            raise bad("requirement has no --hash=sha256:... (pip runs with --require-hashes)")
        name = canonical_name(match.group(1))
        if name in found:
            raise bad(f"{name} is already pinned on line {found[name].line}")
        extras = tuple(sorted(canonical_name(e.strip()) for e in (match.group(2) or "[]")[1:-1].split(",")
                              if e.strip()))
        found[name] = Requirement(name, pin.group(1), extras, (pin.group(2) or "").strip(), frozenset(digests),
                                  number)
    if not found:
        raise ConfigError(f"{path}: the lock has no requirements")
    return Lock(path, tuple(found[name] for name in sorted(found)))


def load_lock(path: Path) -> Lock:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read lock file {path}: {error}") from error
    return parse_lock(text, path)


# ---------------------------------------------------------------------------------------------------------
# Host facts: the interpreter, published venvs, directories, wheels already there



@dataclass(frozen=True)
class PythonFacts:
    implementation: str
    version: str
    platform: str
    soabi: str
    machine: str

    def identity(self) -> str:
        """What a venv's hash covers of its interpreter: implementation, version, ABI and platform."""
        return f"{self.implementation}-{self.version}-{self.soabi}-{self.platform}"

    def as_dict(self) -> dict[str, str]:
        return {"implementation": self.implementation, "version": self.version, "platform": self.platform,
                "soabi": self.soabi, "machine": self.machine}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PythonFacts:
        return cls(**{key: str(data[key]) for key in ("implementation", "version", "platform", "soabi", "machine")})


def wheel_store(layout: StoreLayout) -> PurePosixPath:
    return layout.base / "wheels"


def tool_store(layout: StoreLayout) -> PurePosixPath:
    return layout.base / "tools"


def uv_binary(layout: StoreLayout, wheel_sha256: str) -> PurePosixPath:
    """The uv binary taken from the uv wheel with this sha256: content-addressed like the wheel it comes from."""
    return tool_store(layout) / wheel_sha256 / "uv"


def uv_cache(layout: StoreLayout) -> PurePosixPath:
    """uv's cache, beside venvs/ in the store, so that installing from it hard-links on the same filesystem."""
    return layout.base / "uv-cache"


def venv_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.venvs / check_venv_hash(venv_hash)


def staging_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.venvs / (check_venv_hash(venv_hash) + STAGING_SUFFIX)


def python_step(python: str, name: str = FACT_PYTHON, sudo: bool = False) -> Step:
    """Who the interpreter is: the host's (for a build) or a venv's own (for an adoption, as root)."""
    return Step(name, (python, "-I", "-c", PYTHON_FACTS_SCRIPT), sudo=sudo, ok=frozenset({0, 126, 127}))


def store_fact_steps(layout: StoreLayout) -> list[Step | Put]:
    """Read-only: the markers of published venvs (with their text), every entry of venvs/, the wheels present."""
    venvs = str(layout.venvs)
    return [
        # "\0<hash>/venv.json\0<marker text>" per venv; a marker is one JSON line and JSON text holds no NUL.
        Step(FACT_MARKERS, ("find", venvs, "-mindepth", "2", "-maxdepth", "2", "-name", MARKER_FILE, "-printf",
                            "\\0%P\\0", "-exec", "cat", "--", "{}", ";"), ok=ABSENT_OK),
        Step(FACT_DIRS, ("find", venvs, "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0"), ok=ABSENT_OK),
        Step(FACT_WHEELS, ("find", str(wheel_store(layout)), "-mindepth", "2", "-maxdepth", "2", "-name", "*.whl",
                           "-type", "f", "-printf", "%P\\0"), ok=ABSENT_OK),
        Step(FACT_TOOLS, ("find", str(tool_store(layout)), "-mindepth", "2", "-maxdepth", "2", "-name", "uv",
                          "-type", "f", "-printf", "%P\\0"), ok=ABSENT_OK),
    ]


def fact_steps(layout: StoreLayout, python: str) -> list[Step | Put]:
    return [python_step(python), *store_fact_steps(layout)]


@dataclass(frozen=True)
class VenvStoreFacts:
    markers: Mapping[str, Mapping[str, Any]]   # hash -> marker of every published venv
    entries: tuple[str, ...]                   # every name in venvs/: published, staging leftovers, strays
    wheels: frozenset[str]                     # sha256 of each wheel in wheels/
    tools: frozenset[str] = frozenset()        # sha256 of each uv wheel whose binary is in tools/

    def published(self, venv_hash: str) -> bool:
        return venv_hash in self.markers

    @property
    def leftovers(self) -> tuple[str, ...]:
        """Interrupted builds: <hash>.tmp directories."""
        return tuple(name for name in self.entries
                     if name.endswith(STAGING_SUFFIX) and _HASH_RE.fullmatch(name.removesuffix(STAGING_SUFFIX)))

    @property
    def strays(self) -> tuple[str, ...]:
        """Entries that are neither published venvs nor interrupted builds (a damaged marker, a hand-made dir)."""
        return tuple(name for name in self.entries if name not in self.markers and name not in self.leftovers)


@dataclass(frozen=True)
class VenvFacts:
    python: PythonFacts
    store: VenvStoreFacts
    interpreter: str = ""   # the interpreter's path on the host (sys.executable); "" when it did not say


def parse_markers(find_out: str) -> dict[str, dict[str, Any]]:
    """hash -> marker, from "\\0<hash>/venv.json\\0<json>" records; an unreadable marker counts as absent."""
    pieces = find_out.split("\0")[1:]
    markers = {}
    for name, text in zip(pieces[::2], pieces[1::2], strict=False):
        venv_hash = name.split("/", 1)[0]
        try:
            marker = json.loads(text)
        except ValueError:
            continue
        if isinstance(marker, dict) and marker.get("hash") == venv_hash and _HASH_RE.fullmatch(venv_hash):
            markers[venv_hash] = marker
    return markers


def parse_wheel_names(find_out: str) -> frozenset[str]:
    """sha256 digests of the wheels in wheels/<sha256>/<file>."""
    return frozenset(entry.split("/", 1)[0] for entry in find_out.split("\0")
                     if "/" in entry and re.fullmatch(r"[0-9a-f]{64}", entry.split("/", 1)[0]))


def parse_python_facts(result: StepResult, python: str) -> PythonFacts:
    if result.exit_code != 0:
        raise PreflightError(f"the host has no usable interpreter {python!r} (exit {result.exit_code})",
                             hint="install python3 and python3-venv on the host, or set the venv's `python`")
    try:
        return PythonFacts.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise PreflightError(f"cannot read the facts of {python!r} on the host: {result.stdout[-300:]!r}") from error


def parse_store_facts(results: Sequence[StepResult]) -> VenvStoreFacts:
    found = Readings.of(results)
    return VenvStoreFacts(
        markers=parse_markers(found.stdout(FACT_MARKERS)),
        entries=tuple(sorted(name for name in found.stdout(FACT_DIRS).split("\0") if name)),
        wheels=parse_wheel_names(found.stdout(FACT_WHEELS)),
        tools=parse_wheel_names(found.stdout(FACT_TOOLS)),
    )


def parse_facts(results: Sequence[StepResult], python: str) -> VenvFacts:
    result = Readings.of(results)[FACT_PYTHON]
    facts = parse_python_facts(result, python)
    executable = json.loads(result.stdout.strip().splitlines()[-1]).get("executable")
    return VenvFacts(facts, parse_store_facts(results), executable if isinstance(executable, str) else "")


def read_facts(remote: Remote, layout: StoreLayout, python: str) -> VenvFacts:
    return parse_facts(remote.run(fact_steps(layout, python)), python)


# ---------------------------------------------------------------------------------------------------------
# What a venv imports, and from where: an editable install (a source checkout) lives outside the venv

FACT_INSTALLED = "venv facts: installed packages"


def file_url_path(url: str) -> str:
    """The path of a PEP 610 `file://` URL (percent-decoded); another URL is kept as it is."""
    parsed = urlparse(url)
    return unquote(parsed.path) if parsed.scheme == "file" else url


@dataclass(frozen=True)
class Origin:
    """PEP 610: a distribution installed from a local directory (`pip install [-e] DIR`)."""

    directory: PurePosixPath
    editable: bool
    direct_url: PurePosixPath | None   # its direct_url.json on the host

    def describe(self) -> str:
        return f"editable: {self.directory}" if self.editable else f"copy of {self.directory}"


@dataclass(frozen=True)
class InstalledFacts:
    venv: PurePosixPath
    site_packages: PurePosixPath
    versions: Mapping[str, str]                   # installed distributions only
    origins: Mapping[str, Origin]                 # distributions installed from a directory
    roots: Mapping[str, PurePosixPath]            # top-level package -> the directory it is imported from

    def location(self, path: str) -> PurePosixPath:
        """Where `path` (relative to site-packages, e.g. sglang/srt/x.py) really is: under its package's root."""
        return self.roots.get(path.split("/", 1)[0], self.site_packages) / path

    def outside(self) -> dict[str, PurePosixPath]:
        """Top-level packages imported from outside the venv (an editable install's checkout)."""
        return {top: root for top, root in self.roots.items()
                if root != self.site_packages and not root.is_relative_to(self.venv)}

    def editable(self) -> dict[str, PurePosixPath]:
        """Distribution -> the source directory it is installed from in editable mode."""
        return {name: origin.directory for name, origin in self.origins.items() if origin.editable}


def installed_step(venv: PurePosixPath, packages: Sequence[str], name: str = FACT_INSTALLED) -> Step:
    """Read-only, as root (a venv under /root is the usual hand-made one); exit 127: no python in the venv."""
    return Step(name, (str(venv / "bin" / "python3"), "-I", "-c", INSTALLED_FACTS_SCRIPT, *packages), sudo=True,
                ok=frozenset({0, 1, 126, 127}), timeout_s=60)


def parse_installed(venv: PurePosixPath, result: StepResult) -> InstalledFacts:
    if result.exit_code != 0:
        raise PreflightError(f"the venv {venv} does not run: "
                             f"{(result.stderr or result.stdout).strip()[-300:] or f'exit {result.exit_code}'}")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        origins = {name: Origin(PurePosixPath(o["dir"]), bool(o["editable"]),
                                PurePosixPath(o["direct_url"]) if o.get("direct_url") else None)
                   for name, o in data["origins"].items() if o}
        return InstalledFacts(venv=venv, site_packages=PurePosixPath(data["purelib"]),
                              versions={n: str(v) for n, v in data["versions"].items() if v}, origins=origins,
                              roots={top: PurePosixPath(r) for top, r in data["roots"].items() if r})
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise PreflightError(f"cannot read the packages of the venv {venv}: {result.stdout[-300:]!r}") from error


# ---------------------------------------------------------------------------------------------------------
# Hashes


def venv_hash(lock: Lock, python: PythonFacts) -> str:
    """A built venv's hash: the normalised lock, the interpreter's version and ABI, the platform."""
    return _short_hash(json.dumps({"kind": "built", "lock": lock.text(), "python": python.identity()}))


def derived_hash(base_hash: str, replaced_files: Mapping[str, bytes], trees: Mapping[str, str] | None = None) -> str:
    """A derived venv's hash: its base's hash, each replaced path with the sha256 of its new bytes, and each copied
    tree's path with the digest of its content."""
    files = sorted((path, _sha256(data)) for path, data in replaced_files.items())
    content: dict[str, Any] = {"kind": "derived", "base": check_venv_hash(base_hash), "files": files}
    if trees:
        content["trees"] = sorted(trees.items())
    return _short_hash(json.dumps(content))


# ---------------------------------------------------------------------------------------------------------
# Wheels: which local files the lock needs, and which of them the host lacks


def _python_tag_fits(tag: str, abis: Sequence[str], major: str, minor: str) -> bool:
    if tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"):
        return True
    # an abi3 wheel built for an older CPython 3.x runs on a newer one
    built_for = tag.removeprefix(f"cp{major}")
    return "abi3" in abis and tag.startswith(f"cp{major}") and built_for.isdigit() and int(built_for) <= int(minor)


def _wheel_fits(filename: str, python: PythonFacts) -> bool:
    """Whether pip on that interpreter could install this wheel (python tag, ABI and platform of its name)."""
    match = _WHEEL_RE.match(filename)
    if match is None:
        return False
    major, minor = python.version.split(".")[:2]
    pythons, abis, platforms = (match.group(key).split(".") for key in ("py", "abi", "plat"))
    return (any(_python_tag_fits(tag, abis, major, minor) for tag in pythons)
            and any(abi in ("none", "abi3", f"cp{major}{minor}") for abi in abis)
            and any(plat == "any" or (plat.startswith(("linux_", "manylinux")) and plat.endswith(python.machine))
                    for plat in platforms))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as wheel:
        while chunk := wheel.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LocalWheel:
    path: Path
    sha256: str
    size: int


def wheels_on_host(lock: Lock, on_host: frozenset[str]) -> frozenset[str]:
    """The sha256 of each wheel the lock lists that the host already has: neither read here nor sent."""
    return frozenset(sha for requirement in lock.requirements for sha in requirement.hashes & on_host)


def select_wheels(lock: Lock, wheelhouse: Path, python: PythonFacts,
                  on_host: frozenset[str] = frozenset()) -> tuple[LocalWheel, ...]:
    """For each requirement the host has no wheel of, the wheelhouse files with its name and version whose sha256
    the lock lists (a requirement with a hash in `on_host` is skipped: its wheels are not even read).

    A wheel of the right name and version with another hash (corrupted, or a different build) is an error
    here, before anything travels; so is a requirement without a wheel for the host's python and platform,
    unless it has an environment marker (`; sys_platform == "win32"`), which uv evaluates on the host.
    """
    if not wheelhouse.is_dir():
        raise ConfigError(f"wheelhouse {wheelhouse} is not a directory")
    by_release: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        match = _WHEEL_RE.match(path.name)
        if match:
            by_release.setdefault((canonical_name(match.group("name")), match.group("version").lower()),
                                  []).append(path)
    selected = []
    for requirement in lock.requirements:
        if requirement.hashes & on_host:
            continue
        candidates = [p for p in by_release.get((requirement.name, requirement.version.lower()), [])
                      if _wheel_fits(p.name, python)]
        if not candidates and requirement.marker:
            continue  # uv skips it when the marker is false on the host, and names it when it is true
        if not candidates:
            raise ConfigError(f"{lock.path}:{requirement.line}: no wheel of {requirement.name}=={requirement.version} "
                              f"for {python.identity()} in {wheelhouse}",
                              hint=f"pip download --no-deps --only-binary=:all: --dest {wheelhouse} "
                                   f"{requirement.name}=={requirement.version}")
        digests = {path: _file_sha256(path) for path in candidates}
        matching = [LocalWheel(path, digest, path.stat().st_size) for path, digest in digests.items()
                    if digest in requirement.hashes]
        if not matching:
            listed = ", ".join(f"{path.name} sha256 {digest}" for path, digest in digests.items())
            raise ConfigError(f"{lock.path}:{requirement.line}: hash mismatch for {requirement.name}=="
                              f"{requirement.version}: the lock does not list the sha256 of {listed}",
                              hint="the wheel is corrupted or a different build than the lock was made from: "
                                   "download it again, or regenerate the lock")
        selected.extend(matching)
    return tuple(selected)


def uv_wheel(python: PythonFacts) -> tuple[str, str]:
    """(file name, sha256) of the pinned uv wheel for the host's machine."""
    pinned = UV_WHEELS.get(python.machine)
    if pinned is None:
        raise ConfigError(f"no uv wheel is pinned for {python.machine} hosts (uv builds the venvs)",
                          hint=f"uv {UV_VERSION} is pinned for {', '.join(sorted(UV_WHEELS))} hosts (UV_WHEELS in "
                               "deploy_lib/venvs.py)")
    return pinned


def select_uv_wheel(wheelhouse: Path, python: PythonFacts) -> LocalWheel:
    """The pinned uv wheel in the wheelhouse, its sha256 checked against the pin."""
    filename, expected = uv_wheel(python)
    platform_tag = filename.removesuffix(".whl").split("-")[-1].split(".")[0]
    hint = (f"pip download --no-deps --only-binary=:all: --platform {platform_tag} --dest {wheelhouse} "
            f"uv=={UV_VERSION}")
    path = wheelhouse / filename
    if not path.is_file():
        raise ConfigError(f"the wheelhouse {wheelhouse} has no {filename}: uv {UV_VERSION} builds the venv on the "
                          "host", hint=hint)
    digest = _file_sha256(path)
    if digest != expected:
        raise ConfigError(f"hash mismatch for {path}: sha256 {digest}, but uv {UV_VERSION} is pinned at {expected}",
                          hint=f"the wheel is corrupted or not PyPI's: download it again ({hint})")
    return LocalWheel(path, digest, path.stat().st_size)


@dataclass(frozen=True)
class WheelTransfer:
    """One local wheel the host lacks; its bytes are read (and their hash checked) only when it is sent."""

    wheel: LocalWheel
    dest: PurePosixPath

    def put(self) -> Put:
        data = self.wheel.path.read_bytes()
        if _sha256(data) != self.wheel.sha256:
            raise DeployError(f"wheel {self.wheel.path} changed while deploying (sha256 no longer "
                              f"{self.wheel.sha256})", hint="rerun once the wheelhouse is stable")
        return Put(self.dest, data, WHEEL_MODE, sudo=True)


def wheel_dir(layout: StoreLayout, sha256: str) -> PurePosixPath:
    return wheel_store(layout) / sha256


# ---------------------------------------------------------------------------------------------------------
# Steps shared by build, adopt and derive: relocate, staged files, publish, clear

def relocate_step(name: str, python: PurePosixPath | str, directory: PurePosixPath, old: PurePosixPath,
                  new: PurePosixPath) -> Step:
    return Step(name, (str(python), "-I", "-c", RELOCATE_SCRIPT, str(directory), str(old), str(new)), sudo=True)


def staged_file_step(name: str, path: PurePosixPath, data: bytes) -> Step:
    """A file written inside venvs/<hash>.tmp from stdin, in the batch's own round trip (a Put costs one of its
    own): nothing there is used before the publishing rename, so it needs no atomic replace. Mode 0644: the
    store's facts are read without sudo."""
    return Step(name, ("install", "-m", "0644", "--", "/dev/stdin", str(path)), stdin=data, sudo=True)


def publish_steps(what: str, staging: PurePosixPath, final: PurePosixPath,
                  marker: Mapping[str, Any]) -> list[Step | Put]:
    """Marker last, flushed to disk, then one rename: venvs/<hash> exists only complete."""
    return [
        staged_file_step(f"{what}: marker", staging / MARKER_FILE, json_line(marker)),
        Step(f"{what}: flush to disk", ("sync", "-f", "--", str(staging)), sudo=True, timeout_s=600),
        Step(f"{what}: publish", ("mv", "-T", "--", str(staging), str(final)), sudo=True),
    ]


def clear_steps(what: str, layout: StoreLayout, venv_hash: str, facts: VenvStoreFacts) -> list[Step | Put]:
    """Remove an interrupted build of this venv; a venvs/<hash> without a readable marker is left for a person."""
    if venv_hash in facts.entries and not facts.published(venv_hash):
        raise PreflightError(f"{venv_path(layout, venv_hash)} exists but has no readable {MARKER_FILE}: it was not "
                             "published by this tool, or its marker was damaged; refusing to replace it",
                             hint="look at it, then remove it by hand so that the venv is built again")
    return [
        Step(f"{what}: clear leftovers", ("rm", "-rf", "--", str(staging_path(layout, venv_hash))), sudo=True,
             timeout_s=600),
        Step(f"{what}: venvs directory", ("mkdir", "-p", "--", str(layout.venvs)), sudo=True),
    ]


# ---------------------------------------------------------------------------------------------------------
# Build from a lock


@dataclass(frozen=True)
class BuildPlan:
    """What building the venv of one lock takes on one host; empty (reuse) when it is already there."""

    hash: str
    path: PurePosixPath
    lock: Lock
    python: PythonFacts
    reuse: bool
    transfers: tuple[WheelTransfer, ...] = ()
    prepare: tuple[Step | Put, ...] = ()   # before the transfers: the wheel directories
    steps: tuple[Step | Put, ...] = ()     # after the transfers: clear, create, install, relocate, publish

    @property
    def bytes_to_send(self) -> int:
        return sum(transfer.wheel.size for transfer in self.transfers)

    def describe(self) -> list[str]:
        """Dry-run lines (the wheels are not read for this)."""
        if self.reuse:
            return [f"venv {self.hash}: reuse {self.path} (already built)"]
        sends = [f"send wheel {t.wheel.path.name} -> {t.dest} ({t.wheel.size} bytes)" for t in self.transfers]
        return [*describe(self.prepare), *sends, *describe(self.steps)]

    def batches(self) -> Iterator[list[Step | Put]]:
        """The batches to run in order; each wheel is read from disk only when its batch is reached."""
        if self.prepare:
            yield list(self.prepare)
        for transfer in self.transfers:
            yield [transfer.put()]
        if self.steps:
            yield list(self.steps)


def uv_options(layout: StoreLayout) -> tuple[str, ...]:
    """What every uv command on the host gets: no config files, no Python downloads, the store's cache."""
    return ("--no-config", "--no-python-downloads", "--color", "never", "--no-progress", "--cache-dir",
            str(uv_cache(layout)))


def uv_venv_argv(uv: PurePosixPath, layout: StoreLayout, interpreter: str, staging: PurePosixPath) -> tuple[str, ...]:
    return (str(uv), "venv", *uv_options(layout), "--offline", "--quiet", "--python", interpreter, "--",
            str(staging))


def uv_install_argv(uv: PurePosixPath, layout: StoreLayout, python: PurePosixPath, lock_file: PurePosixPath,
                    spec: VenvSpec, find_links: Iterable[PurePosixPath]) -> tuple[str, ...]:
    """uv pip install of the lock into the venv of `python`: hashes required, no resolution, hard links from the
    cache (uv copies, with a warning, where the cache is on another filesystem)."""
    argv = [str(uv), "pip", "install", *uv_options(layout), "--python", str(python), "--link-mode", "hardlink",
            "--require-hashes", "--no-deps", "--only-binary", ":all:"]
    if spec.wheelhouse is not None:
        argv += ["--offline", "--no-index"]
        for directory in find_links:
            argv += ["--find-links", str(directory)]
    else:
        argv += ["--index-url", str(spec.index)]
    return (*argv, "-r", str(lock_file))


def build_marker(venv_hash: str, lock: Lock, python: PythonFacts, wheels: Iterable[str],
                 now: datetime) -> dict[str, Any]:
    return {"hash": venv_hash, "kind": "built", "lock_sha256": lock.sha256, "python": python.as_dict(),
            "created": iso_time(now), "distributions": lock.distributions(), "wheels": sorted(set(wheels))}


@dataclass(frozen=True)
class UvSteps:
    """The pinned uv wheel on a host: fetched by the host in index mode (a wheelhouse sends it like any wheel), and
    its binary taken out into tools/<sha256>/ once the wheel is verified; no step once they are there."""

    sha256: str
    fetch: tuple[Step, ...]     # before the wheels are verified
    extract: tuple[Step, ...]   # after


def uv_steps(spec: VenvSpec, layout: StoreLayout, facts: VenvFacts, interpreter: str) -> UvSteps:
    filename, sha = uv_wheel(facts.python)
    fetch = ()
    if spec.index is not None and sha not in facts.store.wheels:
        fetch = (Step(FETCH_UV_STEP, (interpreter, "-I", "-c", FETCH_UV_SCRIPT, spec.index, filename, sha,
                                      str(wheel_dir(layout, sha))), sudo=True, timeout_s=900),)
    extract = ()
    if sha not in facts.store.tools:
        extract = (Step("venv build: uv binary", (interpreter, "-I", "-c", EXTRACT_UV_SCRIPT,
                                                  str(wheel_dir(layout, sha)), UV_BINARY_MEMBER,
                                                  str(uv_binary(layout, sha).parent)), sudo=True, timeout_s=300),)
    return UvSteps(sha, fetch, extract)


def plan_build(spec: VenvSpec, lock: Lock, layout: StoreLayout, facts: VenvFacts, now: datetime) -> BuildPlan:
    """Reuse the published venv of this lock on this interpreter, or the steps that build it.

    Only wheels the host lacks are read here (hashed) and sent; the uv wheel travels the same way.
    """
    digest = venv_hash(lock, facts.python)
    final, staging = venv_path(layout, digest), staging_path(layout, digest)
    if facts.store.published(digest):
        return BuildPlan(digest, final, lock, facts.python, reuse=True)
    interpreter = facts.interpreter or spec.python
    on_host = wheels_on_host(lock, facts.store.wheels) if spec.wheelhouse is not None else frozenset()
    local: tuple[LocalWheel, ...] = ()
    if spec.wheelhouse is not None:
        local = select_wheels(lock, spec.wheelhouse, facts.python, facts.store.wheels)
    installer = uv_steps(spec, layout, facts, interpreter)
    uv_sha = installer.sha256
    if spec.wheelhouse is not None and uv_sha not in facts.store.wheels:
        local = (*local, select_uv_wheel(spec.wheelhouse, facts.python))
    unique = {wheel.sha256: wheel for wheel in local}
    transfers = tuple(WheelTransfer(wheel, wheel_dir(layout, sha) / wheel.path.name)
                      for sha, wheel in sorted(unique.items()))
    prepare: tuple[Step | Put, ...] = ()
    if transfers:
        prepare = (Step("venv build: wheel directories",
                        ("mkdir", "-p", "--", *(str(t.dest.parent) for t in transfers)), sudo=True),)
    used = sorted({*on_host, *unique, uv_sha})
    verify = Step(VERIFY_STEP, (interpreter, "-I", "-c", VERIFY_SCRIPT,
                                *(part for sha in used for part in (sha, str(wheel_dir(layout, sha))))),
                  sudo=True, timeout_s=1800)
    python = staging / "bin" / "python3"
    lock_file = staging / LOCK_FILE
    uv = uv_binary(layout, uv_sha)
    find_links = [wheel_dir(layout, sha) for sha in used if sha != uv_sha]
    steps = [
        *clear_steps("venv build", layout, digest, facts.store),
        *installer.fetch,
        verify,
        *installer.extract,
        Step("venv build: create", uv_venv_argv(uv, layout, interpreter, staging), sudo=True, timeout_s=300),
        staged_file_step("venv build: lock file", lock_file, lock.text().encode()),
        Step(INSTALL_STEP, uv_install_argv(uv, layout, python, lock_file, spec, find_links), sudo=True,
             timeout_s=INSTALL_TIMEOUT_S),
        relocate_step("venv build: relocate scripts", python, staging, staging, final),
        *publish_steps("venv build", staging, final, build_marker(digest, lock, facts.python, used, now)),
    ]
    return BuildPlan(digest, final, lock, facts.python, reuse=False, transfers=transfers, prepare=prepare,
                     steps=tuple(steps))


def installer_error_lines(output: str) -> list[str]:
    """uv's own error: from its first `error:` line on (capped), else the last lines it printed."""
    lines = output.rstrip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(("error:", "ERROR:"))), None)
    return lines[first:first + INSTALLER_ERROR_LINES] if first is not None else lines[-12:]


def installer_failure(failure: StepFailed, venv_hash: str) -> StepFailed:
    result = failure.result
    output = "" if not isinstance(result, StepResult) else (result.stderr or result.stdout)
    lines = "\n".join("    " + line for line in installer_error_lines(output))
    first_line = failure.message.splitlines()[0]
    return type(failure)(f"uv could not build venv {venv_hash}; nothing was published ({first_line})\n"
                         f"  uv said:\n{lines}", step=failure.step, result=failure.result,
                         hint=failure.hint or "fix the lock or the wheelhouse; the unfinished build is cleared "
                                              "before the next attempt")


@dataclass(frozen=True)
class VenvResult:
    hash: str
    path: PurePosixPath
    reused: bool
    distributions: Mapping[str, str]
    bytes_sent: int = 0
    wheels_sent: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    drift: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    editable: Mapping[str, str] = field(default_factory=dict)  # distribution -> its source checkout

    @property
    def python(self) -> PurePosixPath:
        return self.path / "bin" / "python3"


def run_build(remote: Remote, plan: BuildPlan, progress: Progress) -> VenvResult:
    result = VenvResult(plan.hash, plan.path, plan.reuse, plan.lock.distributions(),
                        warnings=tuple(jit_cache_warnings(plan.lock.distributions())))
    if plan.reuse:
        progress.note(f"venv {plan.hash}: reusing {plan.path}")
        return result
    progress.phase_started(f"venv {plan.hash}: build ({len(plan.transfers)} wheels, {plan.bytes_to_send} bytes "
                           "to send)")
    for batch in plan.batches():
        try:
            for step_result in remote.run(batch):
                progress.step_done(step_result.step.name, step_result.duration_s)
        except StepFailed as failure:
            name = getattr(failure.step, "name", None)
            if name == INSTALL_STEP:
                raise installer_failure(failure, plan.hash) from failure
            if name == VERIFY_STEP:
                raise StepFailed(failure.message, step=failure.step, result=failure.result,
                                 hint="wheels on the host were damaged and have been removed; rerun to send them "
                                      "again") from failure
            raise
    return replace(result, bytes_sent=plan.bytes_to_send,
                   wheels_sent=tuple(t.wheel.path.name for t in plan.transfers))


def ensure_venv(remote: Remote, layout: StoreLayout, spec: VenvSpec, now: datetime | None = None,
                progress: Progress | None = None, lock: Lock | None = None, where: str = "the host") -> VenvResult:
    """The venv of the spec's lock on this host: reused when published, else built (only missing wheels sent).

    Under the host's lock, so that no prune removes the build or its wheels while it runs."""
    lock = lock if lock is not None else load_lock(spec.lock)
    with host_lock(remote, layout, "venv build", where):
        facts = read_facts(remote, layout, spec.python)
        plan = plan_build(spec, lock, layout, facts, now or datetime.now(UTC))
        return run_build(remote, plan, progress or NullProgress())


# ---------------------------------------------------------------------------------------------------------
# Adopt a venv made by hand


def _check_host_path(path: PurePosixPath) -> PurePosixPath:
    if not path.is_absolute() or ".." in path.parts or str(path) == "/":
        raise ConfigError(f"{str(path)!r} must be an absolute path to a venv, without '..'")
    return path


def inspect_step(venv: PurePosixPath) -> Step:
    """The venv's own python lists its distributions and checks every file against their RECORD."""
    return Step(FACT_INSPECT, (str(_check_host_path(venv) / "bin" / "python3"), "-I", "-c", INSPECT_SCRIPT),
                sudo=True, ok=frozenset({0, 126, 127}), timeout_s=INSPECT_TIMEOUT_S)


@dataclass(frozen=True)
class Inspection:
    source: PurePosixPath
    python: PythonFacts
    distributions: Mapping[str, str]             # name -> version
    record_sha256: Mapping[str, str]             # name -> sha256 of its RECORD file
    drift: Mapping[str, tuple[tuple[str, str], ...]]   # name -> (path, actual sha256 or "missing"), drifted only
    editable: Mapping[str, str] = field(default_factory=dict)  # name -> source directory of an editable install


def parse_inspection(source: PurePosixPath, result: StepResult, interpreter: StepResult) -> Inspection:
    """The venv's distributions (`inspect_step`) and its interpreter (`python_step` of its python)."""
    if result.exit_code != 0:
        raise PreflightError(f"{source} is not a usable venv: {source / 'bin/python3'} exited {result.exit_code}",
                             hint=(result.stderr or result.stdout).strip()[-300:] or None)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
        dists = data["distributions"]
        inspection = Inspection(
            source=source, python=parse_python_facts(interpreter, str(source / "bin" / "python3")),
            distributions={name: str(d["version"]) for name, d in dists.items()},
            record_sha256={name: str(d["record_sha256"]) for name, d in dists.items()},
            drift={name: tuple((str(p), str(s)) for p, s in d["drift"]) for name, d in dists.items() if d["drift"]},
            editable={name: file_url_path(str(d["editable"])) for name, d in dists.items() if d.get("editable")})
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise PreflightError(f"cannot read the inspection of {source}: {result.stdout[-300:]!r}") from error
    if data["prefix"] == data["base_prefix"]:
        raise PreflightError(f"{source} is not a virtual environment (its python's prefix is {data['prefix']})",
                             hint="adopt the directory made by `python3 -m venv`, not a system python")
    return inspection


def adopted_hash(inspection: Inspection) -> str:
    """From the interpreter, each distribution's version and RECORD, and the actual hash of each drifted file."""
    dists = sorted((name, inspection.distributions[name], inspection.record_sha256[name],
                    sorted(inspection.drift.get(name, ()))) for name in inspection.distributions)
    return _short_hash(json.dumps({"kind": "adopted", "python": inspection.python.identity(), "dists": dists}))


def adopt_steps(layout: StoreLayout, inspection: Inspection, facts: VenvStoreFacts,
                now: datetime) -> tuple[str, list[Step | Put]]:
    """Hard-linked copy into venvs/<hash>.tmp, paths rewritten (new files), marker, rename; nothing if published."""
    digest = adopted_hash(inspection)
    if facts.published(digest):
        return digest, []
    staging, final = staging_path(layout, digest), venv_path(layout, digest)
    marker = {"hash": digest, "kind": "adopted", "source": str(inspection.source),
              "python": inspection.python.as_dict(), "created": iso_time(now),
              "distributions": dict(inspection.distributions),
              "drift": {name: [list(entry) for entry in files] for name, files in inspection.drift.items()}}
    if inspection.editable:  # their files stay in the checkout: the managed copy imports from there, as the original
        marker["editable"] = dict(inspection.editable)
    return digest, [
        *clear_steps("venv adopt", layout, digest, facts),
        Step("venv adopt: hard-linked copy", ("cp", "-al", "--", str(inspection.source), str(staging)), sudo=True,
             timeout_s=COPY_TIMEOUT_S),
        relocate_step("venv adopt: relocate scripts", staging / "bin" / "python3", staging, inspection.source,
                      final),
        *publish_steps("venv adopt", staging, final, marker),
    ]


def adopt(remote: Remote, layout: StoreLayout, source: PurePosixPath, now: datetime | None = None,
          where: str = "the host") -> VenvResult:
    """Record a hand-made venv as a managed, immutable one; drifted distributions are reported, not refused."""
    with host_lock(remote, layout, f"venv adopt {source}", where):
        return _adopt(remote, layout, source, now)


def _adopt(remote: Remote, layout: StoreLayout, source: PurePosixPath, now: datetime | None) -> VenvResult:
    python = str(_check_host_path(source) / "bin" / "python3")
    found = Readings(remote.run([inspect_step(source), python_step(python, FACT_ADOPT_PYTHON, sudo=True),
                                 *store_fact_steps(layout)]))
    inspection = parse_inspection(source, found[FACT_INSPECT], found[FACT_ADOPT_PYTHON])
    digest, steps = adopt_steps(layout, inspection, parse_store_facts(found.results), now or datetime.now(UTC))
    try:
        if steps:
            remote.run(steps)
    except StepFailed as failure:
        if getattr(failure.step, "name", None) == "venv adopt: hard-linked copy":
            raise type(failure)(failure.message, step=failure.step, result=failure.result,
                                hint="hard links need the venv and the store on one filesystem") from failure
        raise
    return VenvResult(digest, venv_path(layout, digest), reused=not steps, distributions=inspection.distributions,
                      warnings=tuple(jit_cache_warnings(inspection.distributions)), drift=inspection.drift,
                      editable=inspection.editable)


# ---------------------------------------------------------------------------------------------------------
# Derived venvs


def check_relpath(relpath: str) -> PurePosixPath:
    path = PurePosixPath(relpath)
    if (not relpath or path.is_absolute() or any(part in ("", ".", "..") for part in relpath.split("/"))
            or "\n" in relpath or "\0" in relpath or path.parts[0] == MARKER_FILE):
        raise ConfigError(f"cannot replace {relpath!r} in a venv: give a relative path inside it "
                          f"(no '..', not {MARKER_FILE})")
    return path


def mode_step(layout: StoreLayout, base_hash: str, relpaths: Iterable[str]) -> Step:
    base = venv_path(layout, base_hash)
    return Step(FACT_MODES, ("stat", "--printf", "%a %n\\0", "--", *(str(base / check_relpath(p)) for p in relpaths)),
                ok=ABSENT_OK)


def parse_modes(layout: StoreLayout, base_hash: str, stat_out: str) -> dict[str, int]:
    """relpath -> mode of each replaced file that exists in the base."""
    prefix = f"{venv_path(layout, base_hash)}/"
    modes = {}
    for entry in stat_out.split("\0"):
        mode, _, name = entry.partition(" ")
        if name.startswith(prefix) and re.fullmatch(r"[0-7]{3,4}", mode):
            modes[name[len(prefix):]] = int(mode, 8)
    return modes


FACT_TREES = "venv derive: digests of copied trees"
@dataclass(frozen=True)
class CopiedTree:
    """A directory copied into a derived venv (an editable install's package), and the digest of its content."""

    source: PurePosixPath
    digest: str


def tree_digest_step(python: PurePosixPath, sources: Iterable[PurePosixPath]) -> Step:
    return Step(FACT_TREES, (str(python), "-I", "-c", TREE_SCRIPT, "digest", *map(str, sources)), sudo=True,
                timeout_s=COPY_TIMEOUT_S)


def derive_steps(layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
                 facts: VenvStoreFacts, modes: Mapping[str, int], now: datetime,
                 trees: Mapping[str, CopiedTree] | None = None) -> tuple[str, list[Step | Put]]:
    """Hard-linked copy of the base, each changed file written new and renamed over its link; nothing if published.

    `trees` (relative path in the venv -> source directory) are copied in as new files before the replaced files
    are written; the copy must have the digest read beforehand, and the venv's python must import from it.
    A replaced .py file's cached bytecode is unlinked in the copy (its directory entry only), so Python
    compiles the new source instead of checking a timestamp shared with the base.
    """
    trees = trees or {}
    if not replaced_files:
        raise ConfigError("a derived venv needs at least one replaced file")
    base_marker = facts.markers.get(base_hash)
    if base_marker is None:
        raise PreflightError(f"base venv {base_hash} is not published on the host", hint="see `invoke venv.list`")
    digest = derived_hash(base_hash, replaced_files, {relpath: tree.digest for relpath, tree in trees.items()})
    if facts.published(digest):
        return digest, []
    base, staging, final = venv_path(layout, base_hash), staging_path(layout, digest), venv_path(layout, digest)
    python = staging / "bin" / "python3"
    paths = {relpath: check_relpath(relpath) for relpath in sorted(replaced_files)}
    parents = sorted({str(staging / path.parent) for path in paths.values()})
    steps: list[Step | Put] = [
        *clear_steps("venv derive", layout, digest, facts),
        Step("venv derive: hard-linked copy", ("cp", "-al", "--", str(base), str(staging)), sudo=True,
             timeout_s=COPY_TIMEOUT_S),
        *(Step(f"venv derive: copy {tree.source}", (str(python), "-I", "-c", TREE_SCRIPT, "copy", str(tree.source),
                                                    str(staging / check_relpath(relpath)), tree.digest),
               sudo=True, timeout_s=COPY_TIMEOUT_S) for relpath, tree in sorted(trees.items())),
        Step("venv derive: directories", ("mkdir", "-p", "--", *parents), sudo=True),
    ]
    for relpath, path in paths.items():
        steps.append(Put(staging / path, replaced_files[relpath], modes.get(relpath, 0o644), sudo=True))
        if path.suffix == ".py":
            steps.append(Step(f"venv derive: stale bytecode of {relpath}",
                              ("find", str(staging / path.parent / "__pycache__"), "-maxdepth", "1", "-name",
                               f"{path.stem}.*.pyc", "-delete"), sudo=True, ok=ABSENT_OK))
    steps += [Step(f"venv derive: imports {PurePosixPath(relpath).name} from the copy",
                   (str(python), "-I", "-c", IMPORTED_FROM_SCRIPT, PurePosixPath(relpath).name,
                    str(staging / relpath)), sudo=True) for relpath in sorted(trees)]
    marker = {"hash": digest, "kind": "derived", "base": base_hash, "python": base_marker.get("python"),
              "created": iso_time(now), "distributions": base_marker.get("distributions", {}),
              "replaced": {relpath: _sha256(data) for relpath, data in sorted(replaced_files.items())}}
    if trees:
        marker["copied"] = {relpath: {"source": str(tree.source), "digest": tree.digest}
                            for relpath, tree in sorted(trees.items())}
    steps += [relocate_step("venv derive: relocate scripts", python, staging, base, final),
              *publish_steps("venv derive", staging, final, marker)]
    return digest, steps


def derive(remote: Remote, layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
           now: datetime | None = None, *, copied: Mapping[str, PurePosixPath] | None = None,
           where: str = "the host") -> VenvResult:
    """A new venv: the base with `replaced_files` (relative path -> new bytes) and the `copied` directories
    (relative path -> source directory on the host, copied in whole); the base stays byte-identical."""
    with host_lock(remote, layout, "venv derive", where):
        return _derive(remote, layout, base_hash, replaced_files, now, copied or {})


def _derive(remote: Remote, layout: StoreLayout, base_hash: str, replaced_files: Mapping[str, bytes],
            now: datetime | None, copied: Mapping[str, PurePosixPath]) -> VenvResult:
    fact_batch: list[Step | Put] = [*store_fact_steps(layout), mode_step(layout, base_hash, replaced_files)]
    if copied:
        fact_batch.append(tree_digest_step(venv_path(layout, base_hash) / "bin" / "python3", copied.values()))
    results = remote.run(fact_batch)
    facts = parse_store_facts(results)
    modes = parse_modes(layout, base_hash, Readings.of(results)[FACT_MODES].stdout)
    digests = json.loads(Readings.of(results)[FACT_TREES].stdout) if copied else {}
    trees = {relpath: CopiedTree(source, str(digests[str(source)])) for relpath, source in copied.items()}
    digest, steps = derive_steps(layout, base_hash, replaced_files, facts, modes, now or datetime.now(UTC), trees)
    if steps:
        remote.run(steps)
    distributions = {str(k): str(v) for k, v in dict(facts.markers[base_hash].get("distributions", {})).items()}
    return VenvResult(digest, venv_path(layout, digest), reused=not steps, distributions=distributions,
                      warnings=tuple(jit_cache_warnings(distributions)))


# ---------------------------------------------------------------------------------------------------------
# Per-venv caches


def cache_path(layout: StoreLayout, venv_hash: str) -> PurePosixPath:
    return layout.cache / check_venv_hash(venv_hash)


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


def jit_cache_warnings(distributions: Mapping[str, str]) -> list[str]:
    version = {canonical_name(name): v for name, v in distributions.items()}.get(JIT_CACHE_DISTRIBUTION)
    if version is None:
        return []
    return [f"{JIT_CACHE_DISTRIBUTION} {version} is installed: FlashInfer can load its prebuilt kernels, which "
            "ignore patched headers; remove it from the lock when the venv is patched"]


# ---------------------------------------------------------------------------------------------------------
# Lifecycle: list and prune


@dataclass(frozen=True)
class VenvRecord:
    hash: str
    marker: Mapping[str, Any]
    size_bytes: int | None             # bytes not already counted for its base (hard links count once)
    releases: tuple[str, ...] = ()     # releases whose release.json names this venv
    derived: tuple[str, ...] = ()      # venvs derived from this one

    @property
    def kind(self) -> str:
        return str(self.marker.get("kind", ""))

    @property
    def base(self) -> str | None:
        base = self.marker.get("base")
        return str(base) if base else None

    def versions(self) -> dict[str, str]:
        """The versions `invoke status` shows: SGLang, FlashInfer, torch (those installed)."""
        installed = {canonical_name(str(k)): str(v) for k, v in dict(self.marker.get("distributions", {})).items()}
        return {name: installed[name] for name in STATUS_DISTRIBUTIONS if name in installed}


def release_venv_hash(layout: StoreLayout, venv: str) -> str | None:
    """The managed venv a release.json `venv` field names (a path under venvs/ or a bare hash); None otherwise."""
    path = PurePosixPath(venv)
    name = path.name if path.parent == layout.venvs else venv
    return name if _HASH_RE.fullmatch(name) else None


def _base_first(markers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    def depth(venv_hash: str, seen: frozenset[str] = frozenset()) -> int:
        base = markers.get(venv_hash, {}).get("base")
        return 0 if base not in markers or base in seen else 1 + depth(base, seen | {venv_hash})
    return sorted(markers, key=lambda h: (depth(h), h))


def size_step(layout: StoreLayout, facts: VenvStoreFacts) -> Step | None:
    """`du -sb` over the venvs, bases before their derived venvs: a hard-linked file counts for the first."""
    order = _base_first(facts.markers)
    if not order:
        return None
    return Step(FACT_SIZES, ("du", "-sb", "--", *(str(venv_path(layout, h)) for h in order)), ok=ABSENT_OK,
                timeout_s=300)


def parse_sizes(du_out: str) -> dict[str, int]:
    sizes = {}
    for line in du_out.splitlines():
        size, _, path = line.partition("\t")
        if size.isdigit():
            sizes[PurePosixPath(path).name] = int(size)
    return sizes


def venv_records(facts: VenvStoreFacts, sizes: Mapping[str, int],
                 release_venvs: Mapping[str, str | None]) -> list[VenvRecord]:
    """Published venvs, base before derived, with the releases that use each (release id -> venv hash)."""
    users: dict[str, list[str]] = {}
    for release, venv in sorted(release_venvs.items()):
        if venv is not None:
            users.setdefault(venv, []).append(release)
    children: dict[str, list[str]] = {}
    for venv_hash, marker in facts.markers.items():
        if marker.get("base"):
            children.setdefault(str(marker["base"]), []).append(venv_hash)
    return [VenvRecord(h, facts.markers[h], sizes.get(h), tuple(users.get(h, ())), tuple(sorted(children.get(h, ()))))
            for h in _base_first(facts.markers)]


def list_venvs(remote: Remote, layout: StoreLayout, release_venvs: Mapping[str, str | None]) -> list[VenvRecord]:
    facts = parse_store_facts(remote.run(store_fact_steps(layout)))
    step = size_step(layout, facts)
    sizes = parse_sizes(remote.run([step])[0].stdout) if step is not None else {}
    return venv_records(facts, sizes, release_venvs)


@dataclass(frozen=True)
class PrunePlan:
    venvs: tuple[str, ...]          # published venvs no kept release needs
    leftovers: tuple[str, ...]      # interrupted builds (<hash>.tmp); strays are never pruned
    wheels: tuple[str, ...]         # sha256 of wheels no kept built venv was made from


def plan_prune(facts: VenvStoreFacts, kept_venvs: Iterable[str | None]) -> PrunePlan:
    """Remove a venv only when no kept release uses it and it is not the base (at any depth) of one that is.

    An adopted venv is the one a hand-run server used: it stays until `venv.remove` names it."""
    needed: set[str] = set()
    for venv_hash in kept_venvs:
        while venv_hash is not None and venv_hash not in needed:
            needed.add(venv_hash)
            base = facts.markers.get(venv_hash, {}).get("base")
            venv_hash = str(base) if base else None
    doomed = tuple(sorted(h for h in facts.markers if h not in needed and facts.markers[h].get("kind") != "adopted"))
    wanted_wheels = {sha for h in needed for sha in facts.markers.get(h, {}).get("wheels", [])}
    return PrunePlan(doomed, facts.leftovers, tuple(sorted(facts.wheels - wanted_wheels)))


def removal_plan(facts: VenvStoreFacts, venv_hash: str, release_venvs: Mapping[str, str | None]) -> PrunePlan:
    """`venv.remove HASH`: any managed venv (adopted ones included) that no release on the host and no derived
    venv needs; otherwise ConfigError naming what still needs it."""
    if venv_hash not in facts.markers:
        raise ConfigError(f"no managed venv {venv_hash!r} on the host",
                          f"managed venvs: {', '.join(sorted(facts.markers)) or 'none'} (`invoke venv.list`)")
    users = sorted(release for release, used in release_venvs.items() if used == venv_hash)
    derived = sorted(h for h, marker in facts.markers.items() if marker.get("base") == venv_hash)
    if users or derived:
        raise ConfigError(f"venv {venv_hash} is still needed: releases {', '.join(users) or 'none'}, derived venvs "
                          f"{', '.join(derived) or 'none'}", "roll forward past those releases (they are pruned "
                          "beyond service.keep_releases) or remove the derived venvs first")
    wanted = {sha for h, marker in facts.markers.items() if h != venv_hash for sha in marker.get("wheels", [])}
    return PrunePlan((venv_hash,), (), tuple(sorted(set(facts.markers[venv_hash].get("wheels", [])) - wanted)))
def describe_prune(plan: PrunePlan) -> list[str]:
    """One phrase per removed thing, for the user and history."""
    phrases = [f"venv {venv_hash}" for venv_hash in plan.venvs]
    phrases += [f"unfinished venv build {name}" for name in plan.leftovers]
    if plan.wheels:
        phrases.append(f"{len(plan.wheels)} wheel(s) no kept venv was built from")
    return phrases


def prune_steps(layout: StoreLayout, plan: PrunePlan) -> list[Step | Put]:
    doomed = [venv_path(layout, h) for h in plan.venvs] + [cache_path(layout, h) for h in plan.venvs]
    doomed += [staging_path(layout, name.removesuffix(STAGING_SUFFIX)) for name in plan.leftovers]
    for sha in plan.wheels:
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"refusing to prune wheel {sha!r}: not a sha256")
        doomed += [wheel_dir(layout, sha), tool_store(layout) / sha]  # a uv wheel's binary goes with it
    if not doomed:
        return []
    return [Step("prune venvs", ("rm", "-rf", "--", *map(str, doomed)), sudo=True, timeout_s=900)]
