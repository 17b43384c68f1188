"""model_stage.py run by the release's venv python on the host, as the service user: the request (a token
included) travels on stdin, the result comes back as one line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from deploy_lib.host_paths import venv_python
from deploy_lib.models.facts import ModelFacts, ModelFile
from deploy_lib.remote import Step, StepResult

STAGE_SOURCE = resources.files("deploy_lib").joinpath("model_stage.py").read_text(encoding="utf-8")
# Reads the request (first stdin line), then runs the rest of stdin (model_stage.py) and its main().
BOOTSTRAP = ('import json,sys;r=json.loads(sys.stdin.readline());g={"__name__":"model_stage"};'
             'exec(compile(sys.stdin.read(),"model_stage.py","exec"),g);sys.exit(g["main"](r))')


def script_step(name: str, venv: str, user: str, request: Mapping[str, Any], timeout_s: float = 120) -> Step:
    """model_stage.py run by the venv's python as `user`; the request (a token included) travels on stdin."""
    stdin = (json.dumps(request) + "\n" + STAGE_SOURCE).encode()
    python = str(venv_python(venv))
    return Step(name, ("runuser", "-u", user, "--", python, "-I", "-c", BOOTSTRAP), sudo=True, stdin=stdin,
                ok=frozenset({0, 1, 127}), timeout_s=timeout_s, secret=request.get("token") is not None)


RESULT_PREFIX = "RESULT "
PROGRESS_PREFIX = "PROGRESS "


def parse_model_result(result: StepResult) -> ModelFacts:
    if result.exit_code == 127:
        return ModelFacts(error="no_library", message="the venv's python3 (or runuser) was not found on the host")
    line = next((line for line in reversed(result.stdout.splitlines()) if line.startswith(RESULT_PREFIX)), None)
    if line is None:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return ModelFacts(error="script", message=f"model_stage.py exited {result.exit_code}: {tail or 'no output'}")
    data: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
    if "error" in data:
        return ModelFacts(error=str(data["error"]), message=str(data.get("message", "")))
    return ModelFacts(commit=data["commit"], files=tuple(ModelFile(f["path"], int(f["size"]), f["blob"])
                                                         for f in data["files"]),
                      missing=tuple(data["missing"]), missing_bytes=int(data["missing_bytes"]),
                      free_bytes=data.get("free_bytes"), hf_home=data.get("hf_home"),
                      asked_hub=bool(data.get("asked_hub")))
