"""What a venv imports, and from where: an editable install (a source checkout) lives outside the venv.

Read by the venv's own python (host_scripts/venv_installed.py), for `invoke status` and for patch sets, which need
the real location of the files they change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

from deploy_lib.errors import PreflightError
from deploy_lib.host_paths import venv_python
from deploy_lib.remote import Step, StepResult
from deploy_lib.remote.readings import Fact
from deploy_lib.venvs.host_scripts import INSTALLED_FACTS_SCRIPT

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


def installed_step(venv: PurePosixPath, distributions: Iterable[str], packages: Iterable[str],
                   name: str = FACT_INSTALLED) -> Step:
    """The versions and origins of `distributions` and where the top-level `packages` are imported from: what the
    caller decides on (a patch set's own packages, the versions `status` shows), not a fixed list.

    Read-only, as root (a venv under /root is the usual hand-made one); exit 127: no python in the venv."""
    asked = json.dumps({"distributions": sorted(set(distributions)), "packages": sorted(set(packages))})
    return Step(name, (str(venv_python(venv)), "-I", "-c", INSTALLED_FACTS_SCRIPT, asked), sudo=True,
                ok=frozenset({0, 1, 126, 127}), timeout_s=60)


def installed_fact(venv: PurePosixPath, distributions: Iterable[str], packages: Iterable[str],
                   name: str = FACT_INSTALLED) -> Fact[InstalledFacts]:
    return Fact(installed_step(venv, distributions, packages, name), partial(parse_installed, venv))


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
