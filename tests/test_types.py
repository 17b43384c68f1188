"""The type checker `make lint` runs (mypy, [tool.mypy] in pyproject.toml) fails a call with an old argument order.

Issue 30: bench/router.py called `behind_router` in the order it had before the router's deploy moved into
deploy_lib.ops (the connection factory third, the worker's URL fourth), and `make bench` died in StoreLayout with
`TypeError: expected string or bytes-like object, got 'function'`. The same call, written against today's
signature beside the call as it is meant, must fail mypy on its own line and on no other.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CALLS = '''
from deploy_lib.ops.router_deploy import RouterFront, behind_router
from deploy_lib.progress import NullProgress
from deploy_lib.deploy.project import Target
from deploy_lib.remote import FabricRemote, Remote


def as_meant(front: RouterFront, target: Target, remote: Remote) -> None:
    behind_router(front, target, "sglang", remote, NullProgress(), lambda drain: None)


def old_order(front: RouterFront, target: Target, remote: Remote) -> None:
    behind_router(front, target, lambda t: FabricRemote(t.ssh), "http://10.0.0.2:30000", NullProgress(),  # OLD
                  lambda drain: None)
'''


def test_mypy_fails_the_old_argument_order_of_behind_router_and_passes_the_call_as_meant(tmp_path: Path) -> None:
    wiring = tmp_path / "wiring.py"
    wiring.write_text(CALLS)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(wiring)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    old_line = next(number for number, line in enumerate(CALLS.splitlines(), 1) if line.endswith("# OLD"))
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert done.returncode == 1, done.stdout + done.stderr
    assert errors, done.stdout
    assert {int(re.match(r".*wiring\.py:(\d+):", line).group(1)) for line in errors} == {old_line}, done.stdout
    assert any('Argument 3 to "behind_router" has incompatible type' in line and '"str"' in line
               for line in errors), done.stdout
    assert any('Argument 4 to "behind_router" has incompatible type "str"; expected "Remote"' in line
               for line in errors), done.stdout
