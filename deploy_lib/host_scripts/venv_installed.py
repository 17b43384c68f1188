"""What a venv imports, and from where (run by the venv's own python: `python3 -I -c`; argv: one JSON object,
{"distributions": [names whose version and origin to read], "packages": [top-level packages to locate]}).

Standard library only, no deploy_lib imports. The import system is asked where each package is
(importlib.util.find_spec, which does not import it), so whatever pip/setuptools wrote is followed exactly: a
`__editable__.*.pth` with its finder module, a .pth path line, or a plain site-packages directory. PEP 610's
direct_url.json says which distributions come from a local directory, and whether editable.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import sys
import sysconfig
import urllib.parse


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def origin(name: str) -> dict | None:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    text = dist.read_text("direct_url.json")
    data = json.loads(text) if text else {}
    url = urllib.parse.urlparse(data.get("url", ""))
    if url.scheme != "file" or "dir_info" not in data:
        return None
    record = [str(dist.locate_file(f)) for f in dist.files or () if f.name == "direct_url.json"]
    return {"dir": urllib.parse.unquote(url.path), "editable": bool(data["dir_info"].get("editable")),
            "direct_url": record[0] if record else None}


def root(top: str) -> str | None:
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.normpath(next(iter(spec.submodule_search_locations))))


if __name__ == "__main__":
    asked = json.loads(sys.argv[1])
    print(json.dumps({"purelib": sysconfig.get_paths()["purelib"],
                      "versions": {n: version(n) for n in asked["distributions"]},
                      "origins": {n: origin(n) for n in asked["distributions"]},
                      "roots": {top: root(top) for top in asked["packages"]}}))
