"""A host's venv store as its fact steps answer it: the Python there, the managed venvs' markers, the wheels and
tools kept, and a hand-made venv's inspection for `venv.adopt`."""

from __future__ import annotations

import json

from deploy_lib import venvs
from deploy_lib.host import venv_adopt, venv_store
from helpers.fake_remote import FakeRemote

PY311 = venvs.PythonFacts("cpython", "3.11.2", "linux-x86_64", "cpython-311-x86_64-linux-gnu", "x86_64")
INSPECTION = {"prefix": "/root/ml-env", "base_prefix": "/usr", "distributions": {
    "sglang": {"version": "0.5.23", "record_sha256": "1" * 64, "drift": [["sglang/srt/x.py", "2" * 64]]},
    "flashinfer-jit-cache": {"version": "0.7.2", "record_sha256": "3" * 64, "drift": []}}}


def marker_stream(markers: dict[str, dict]) -> str:
    return "".join(f"\0{h}/venv.json\0{json.dumps(m)}\n" for h, m in markers.items())


def host(markers: dict[str, dict] | None = None, entries: tuple[str, ...] = (),
         wheels: tuple[str, ...] = (), python: venvs.PythonFacts = PY311, tools: tuple[str, ...] = ()) -> FakeRemote:
    """A FakeRemote answering the venv fact steps; every other step succeeds."""
    markers = markers or {}
    names = sorted(set(entries) | set(markers))
    return (FakeRemote()
            .reply(venvs.FACT_PYTHON, stdout=json.dumps(python.as_dict()) + "\n")
            .reply(venv_adopt.FACT_ADOPT_PYTHON, stdout=json.dumps(python.as_dict()) + "\n")
            .reply(venv_store.FACT_MARKERS, stdout=marker_stream(markers))
            .reply(venv_store.FACT_DIRS, stdout="".join(f"{n}\0" for n in names))
            .reply(venv_store.FACT_WHEELS, stdout="".join(f"{s}/w.whl\0" for s in wheels))
            .reply(venv_store.FACT_TOOLS, stdout="".join(f"{s}/uv\0" for s in tools)))
