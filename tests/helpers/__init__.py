"""Shared test helpers: fakes, recorders and the sandbox rig that several test modules use (no test module imports
another; fixtures several modules use live in a conftest.py)."""
