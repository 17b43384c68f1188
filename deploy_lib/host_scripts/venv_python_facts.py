"""Who the interpreter is, for a venv's hash and for `uv venv --python` (run by that interpreter: `python3 -I -c`).

Standard library only, no deploy_lib imports. Prints one JSON object; the interpreter's own path (sys.executable) is
what `uv venv --python` gets, not a name uv would look up itself.
"""

from __future__ import annotations

import json
import platform
import sys
import sysconfig


def python_facts() -> dict[str, str]:
    return {"implementation": sys.implementation.name, "version": platform.python_version(),
            "platform": sysconfig.get_platform(), "soabi": sysconfig.get_config_var("SOABI") or "",
            "machine": platform.machine(), "executable": sys.executable}


if __name__ == "__main__":
    print(json.dumps(python_facts()))
