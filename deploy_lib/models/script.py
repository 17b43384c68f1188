"""model_stage.py run by the release's venv python on the host, as the service user: the request (a token
included) travels on stdin, the result comes back as one line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from deploy_lib.host_paths import venv_python
from deploy_lib.host_scripts.model_stage import PLAN_HEADER, RECORD_DIR, plan_name
from deploy_lib.models.facts import ModelFacts, ModelFile
from deploy_lib.remote import Step, StepResult

STAGE_SOURCE = resources.files("deploy_lib.host_scripts").joinpath("model_stage.py").read_text(encoding="utf-8")
# Reads the request (first stdin line), then runs the rest of stdin (model_stage.py) and its main().
BOOTSTRAP = ('import json,sys;r=json.loads(sys.stdin.readline());g={"__name__":"model_stage"};'
             'exec(compile(sys.stdin.read(),"model_stage.py","exec"),g);sys.exit(g["main"](r))')

RESULT_PREFIX = "RESULT "
PROGRESS_PREFIX = "PROGRESS "
FREE_PREFIX = "FREE "  # the free bytes of a kept plan's cache filesystem, read by the shell now

# The plan of a pinned commit that a stage of ours completed (model_stage.keep_plan), printed by the shell when it
# still verifies: its payload's sha256, and every file's snapshot path resolving to a file of the recorded size;
# then the free bytes of the cache's filesystem. Otherwise (or without such a plan) the command after the first
# three arguments runs: the venv's python planning with huggingface_hub. $1 HF_HOME ("" for the user's default),
# $2 the user, $3 the plan's path under <HF_HOME>/{RECORD_DIR}.
PLAN_CHECK = f"""home=${{1:-$(getent passwd "$2" | cut -d: -f6)/.cache/huggingface}}
plan="$home/{RECORD_DIR}/$3"
shift 3
if [ -f "$plan" ] && [ "$(sed -n 1p "$plan")" = '{PLAN_HEADER}' ] \\
  && [ "$(sed -n 's/^J //p' "$plan" | sha256sum)" = "$(sed -n 's/^P //p' "$plan")  -" ] \\
  && [ "$(cd -- "$home/hub" && sed -n 's/^F //p' "$plan" | xargs -d '\\n' stat -L -c '%s %n' -- 2>/dev/null)" \\
       = "$(sed -n 's/^E //p' "$plan")" ]; then
  printf '{RESULT_PREFIX}%s\\n' "$(sed -n 's/^J //p' "$plan")"
  df -P -B1 -- "$home" | awk 'NR == 2 {{ print "{FREE_PREFIX}" $4 }}'
  exit 0
fi
exec "$@"
"""


def script_step(name: str, venv: str, user: str, request: Mapping[str, Any], timeout_s: float = 120,
                kept_plan: str | None = None) -> Step:
    """model_stage.py run by the venv's python as `user`; the request (a token included) travels on stdin. With
    `kept_plan` (a plan's path, model_stage.plan_name) the shell answers first when that plan still verifies."""
    stdin = (json.dumps(request) + "\n" + STAGE_SOURCE).encode()
    python = (str(venv_python(venv)), "-I", "-S", "-c", BOOTSTRAP)  # site-packages when needed (model_stage.py)
    check = ("sh", "-c", PLAN_CHECK, "sh", request.get("hf_home") or "", user, kept_plan) if kept_plan else ()
    return Step(name, ("runuser", "-u", user, "--", *check, *python), sudo=True, stdin=stdin,
                ok=frozenset({0, 1, 127}), timeout_s=timeout_s, secret=request.get("token") is not None)


def kept_plan_name(request: Mapping[str, Any]) -> str | None:
    """The plan a completed stage kept for this request's revision, when it is a full commit (a branch or tag
    must be resolved by the hub every time)."""
    revision = str(request["revision"])
    if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
        return None
    return plan_name(request["repo"], revision, request["allow"], request["ignore"])



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
    free = next((line[len(FREE_PREFIX):] for line in result.stdout.splitlines() if line.startswith(FREE_PREFIX)), "")
    if free.isdigit():
        data["free_bytes"] = int(free)
    return ModelFacts(commit=data["commit"], files=tuple(ModelFile(f["path"], int(f["size"]), f["blob"])
                                                         for f in data["files"]),
                      missing=tuple(data["missing"]), missing_bytes=int(data["missing_bytes"]),
                      free_bytes=data.get("free_bytes"), hf_home=data.get("hf_home"),
                      asked_hub=bool(data.get("asked_hub")))
