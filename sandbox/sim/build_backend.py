"""Minimal PEP 517 backend: a pure-Python wheel of sglang_sim plus sglang_sim.pth, built with the stdlib."""

from __future__ import annotations

import base64
import hashlib
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).parent
PACKAGE = "sglang_sim"
TOP_LEVEL_FILES = ("sglang_sim.pth",)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((HERE / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(HERE).as_posix()] = path.read_bytes()
    for top in TOP_LEVEL_FILES:
        files[top] = (HERE / top).read_bytes()
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {project['description']}\n"
        f"Requires-Python: {project['requires-python']}\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: sglang-sim build_backend\n" \
                                  b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file_name, data in files.items():
            info = zipfile.ZipInfo(file_name, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible wheel
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data, zipfile.ZIP_DEFLATED)
    return wheel_name
