"""Exit 0 when the venv's python imports a package from the given directory (argv: package, directory).

Standard library only, no deploy_lib imports; run by the venv's python (`python3 -I -c`).
"""

from __future__ import annotations

import importlib.util
import os
import sys

if __name__ == "__main__":
    spec = importlib.util.find_spec(sys.argv[1])
    where = list(spec.submodule_search_locations or []) if spec else []
    sys.exit(0 if where and os.path.normpath(where[0]) == sys.argv[2] else f"{sys.argv[1]} imports from {where}")
