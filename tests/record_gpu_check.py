"""Re-record tests/data/p2p/<machine>-<date>/gpu-check-run.json: gpu-check's steps for a one-GPU host, run on one.

Part 1, here (the project's venv): gpu-check runs through the tests' own fake-remote route
(tests/helpers/gpu_check_p2p_wiring.py, one_gpu_gpu_check), so the steps are the ones the code sends today, and this
prints a shell command that runs them on the machine:

    .venv/bin/python tests/record_gpu_check.py [--answers tests/data/p2p/<older>/gpu-check-run.json]

`--answers` answers the fake host by argv from an older recording, so the step list follows what a real one-GPU
host says (without it every step answers exit 0 and nothing). Part 2 is the command: Python's stdlib only, run as
root in a checkout of this repo on the machine (the all-reduce program is rebuilt there from
deploy_lib/host_scripts/gpu_check.py, and its SHA-256 checked against part 1's); it runs each step by
`subprocess.run` (argv, stdin; exit 127 where the tool is missing, as the shell would say) and writes the results
JSON to `$OUT/gpu-check-run.json` ($OUT defaults to the current folder).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import inspect
import json
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

Part = list[str]  # ["text", literal] | ["file", repo path] | ["repr", repo path]: a piece of a step's stdin


def stdin_parts(stdin: bytes, files: dict[str, str]) -> list[Part]:
    """`stdin` as literal pieces and the repo files (by path: their text, or its repr) it embeds whole."""
    parts: list[Part] = [["text", stdin.decode()]]
    for path, text in files.items():
        for kind, needle in (("repr", repr(text)), ("file", text)):  # the repr first: it holds the text escaped
            split: list[Part] = []
            for part in parts:
                if part[0] != "text":
                    split.append(part)
                    continue
                for i, piece in enumerate(part[1].split(needle)):
                    split += [[kind, path]] if i else []
                    split += [["text", piece]] if piece else []
            parts = split
    return parts


# Part 2: stdlib only, shipped to the machine as source (device_command).
def join_parts(parts: list[Part]) -> bytes:
    """The stdin part 1 split, rebuilt from this checkout's files."""
    def piece(kind: str, value: str) -> str:
        if kind == "text":
            return value
        text = open(value, encoding="utf-8").read()
        return text if kind == "file" else repr(text)
    return "".join(piece(kind, value) for kind, value in parts).encode()


def record(plan: dict[str, Any]) -> dict[str, Any]:
    """Run the plan's steps in order, as root, without a shell; the results in gpu-check-run.json's format."""
    import datetime
    import os
    import subprocess

    def run(argv: list[str], stdin: bytes | None = None, timeout_s: float = 60) -> dict[str, Any]:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s)
        except FileNotFoundError:
            return {"argv": argv, "exit_code": 127, "stdout": "", "stderr": f"bash: {argv[0]}: command not found\n"}
        return {"argv": argv, "exit_code": done.returncode, "stdout": done.stdout.decode(errors="replace"),
                "stderr": done.stderr.decode(errors="replace")}

    for folder in plan["make_dirs"]:
        os.makedirs(folder, exist_ok=True)
    check = join_parts(plan["check_stdin"])
    if hashlib.sha256(check).hexdigest() != plan["check_stdin_sha256"]:
        raise SystemExit("this checkout's gpu_check.py is not the one part 1 read: record from the same commit")
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    results = [run(argv, check, plan["check_timeout_s"]) if i == plan["check_at"] else run(argv)
               for i, argv in enumerate(plan["steps"])]
    os_name = [line.split("=", 1)[1].strip().strip('"') for line in open("/etc/os-release")
               if line.startswith("PRETTY_NAME=")]
    torch = run([plan["python"], "-c", "import torch; print(torch.__version__)"])["stdout"].strip()
    machine = {"kernel": os.uname().release, "gpus": run(["nvidia-smi", "-L"])["stdout"].strip(),
               "os": os_name[0] if os_name else "", "torch": torch}
    return {"recorded_at": started, "machine": machine, "check_stdin_sha256": plan["check_stdin_sha256"],
            "results": results}


def plan(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Part 1: the steps gpu-check sends a one-GPU host, through the test's fake-remote route."""
    from helpers.gpu_check_p2p_wiring import TOPO_DUMP, one_gpu_gpu_check, sent_steps

    from deploy_lib.gpu_check.allreduce import SCRIPT_SOURCE

    with tempfile.TemporaryDirectory() as folder:
        host, _ = one_gpu_gpu_check(Path(folder), answers)
    steps = sent_steps(host)
    (check,) = [step for step in steps if step.name == "all-reduce check"]
    parts = stdin_parts(check.stdin or b"", {"deploy_lib/host_scripts/gpu_check.py": SCRIPT_SOURCE})
    if any(step.stdin is not None and step is not check for step in steps):
        raise SystemExit("a step besides the all-reduce sends stdin: teach this recorder to carry it")
    return {"make_dirs": [str(Path(TOPO_DUMP).parent)], "python": check.argv[0], "check_stdin": parts,
            "check_stdin_sha256": hashlib.sha256(check.stdin or b"").hexdigest(),
            "check_at": steps.index(check), "check_timeout_s": check.timeout_s,
            "steps": [list(step.argv) for step in steps]}


def device_command(the_plan: dict[str, Any]) -> str:
    """Part 2 as one shell line: join_parts and record, with the plan, compressed into `python3 -c`."""
    functions = ast.parse(f"{inspect.getsource(join_parts)}\n{inspect.getsource(record)}")
    for node in ast.walk(functions):  # docstrings off: the line must fit the device tool's 2,000 characters
        if isinstance(node, ast.FunctionDef) and isinstance(node.body[0], ast.Expr):
            node.body = node.body[1:]
    source = (f"from __future__ import annotations\nimport hashlib,json,os\n{ast.unparse(functions)}\n"
              f"out=os.path.join(os.environ.get('OUT','.'),'gpu-check-run.json')\n"
              f"open(out,'w').write(json.dumps(record({the_plan!r}),indent=1)+'\\n')\nprint(out)\n")
    packed = base64.b85encode(zlib.compress(source.encode(), 9)).decode()  # b85 holds no quote or backslash
    return f"python3 -c 'import base64,zlib;exec(zlib.decompress(base64.b85decode(\"{packed}\")))'"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, help="an older gpu-check-run.json answering the fake host by argv")
    args = parser.parse_args()
    answers = json.loads(args.answers.read_text())["results"] if args.answers else []
    print(device_command(plan(answers)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the test helpers, as pytest's pythonpath has them
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
