"""The inventory: hosts, groups and their vars as pydantic models (model.py), read from YAML or
INI with group_vars/ and host_vars/ (formats.py)."""
