"""Only where setuptools builds: pyproject.toml holds the project. A build from a source tree (`pip install .`) writes
its build/ and *.egg-info into a scratch directory that is removed when the build ends, so the tree stays as it was
and a file deleted from the source never reaches the next wheel from a stale build/lib."""

import atexit
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="sglang-deploy-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)
setup(options={"build": {"build_base": scratch}, "egg_info": {"egg_base": scratch}})
