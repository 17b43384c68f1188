"""deploy_lib/versions.py, row by row, against the real sglang wheels of every release in KNOWN_SGLANG."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from deploy_lib.profile import choices
from deploy_lib.release.argv_check import find_option
from deploy_lib.release.server_args import spelling
from deploy_lib.versions import (
    BENCH_MODULES,
    CHOICE_FLAGS,
    KNOWN_SGLANG,
    NEWEST_SGLANG,
    READY_ENDPOINT_SINCE,
    SPELLINGS,
    health_path_for,
    reached,
    version_key,
)

pytest_plugins = ("helpers.wheelcache",)  # the real_options fixture


def test_known_releases_are_in_order_and_the_newest_is_last() -> None:
    assert sorted(KNOWN_SGLANG, key=version_key) == list(KNOWN_SGLANG) and NEWEST_SGLANG == KNOWN_SGLANG[-1]
    assert [row.since for row in BENCH_MODULES] == sorted((row.since for row in BENCH_MODULES), key=version_key)


@pytest.mark.parametrize(("version", "path"), [("0.5.15.post1", "/health"), ("0.5.20", "/ready"),
                                               ("0.5.20rc1", "/health"), ("0.5.23", "/ready")])
def test_the_readiness_endpoint_follows_the_release(version: str, path: str) -> None:
    assert health_path_for(version) == path


@pytest.mark.wheels
@pytest.mark.parametrize("version", KNOWN_SGLANG)
def test_ready_is_routed_exactly_from_its_release_on(sglang_source: Callable[[str], Path], version: str) -> None:
    server = (sglang_source(version) / "sglang" / "srt" / "entrypoints" / "http_server.py").read_text()
    assert ('"/ready"' in server) == reached(version, READY_ENDPOINT_SINCE)


@pytest.mark.wheels
@pytest.mark.parametrize("version", KNOWN_SGLANG)
def test_each_benchmark_module_is_in_the_wheel_from_its_release_on(sglang_source: Callable[[str], Path],
                                                                   version: str) -> None:
    package = sglang_source(version) / "sglang"
    assert {row.module: (package / row.path).is_file() for row in BENCH_MODULES} == {
        row.module: reached(version, row.since) for row in BENCH_MODULES}


@pytest.mark.wheels
@pytest.mark.parametrize("setting", sorted(SPELLINGS))
@pytest.mark.parametrize("version", KNOWN_SGLANG)
def test_each_spelling_is_what_that_releases_parser_registers(real_options: Callable[[str], dict[str, Any]],
                                                              setting: str, version: str) -> None:
    """The spelling chosen for a release is registered there and not deprecated; before the first, it is absent."""
    options = real_options(version)
    chosen = spelling(setting, version)
    if chosen is None:
        assert find_option(options, SPELLINGS[setting][0].argv[0]) is None
        return
    for flag in (part for part in chosen.argv if part.startswith("--")):
        found = find_option(options, flag)
        assert found is not None, f"{flag} is not an option of SGLang {version}"
        assert not found["deprecated"], f"{flag} is deprecated in SGLang {version}: add the new spelling"


@pytest.mark.wheels
@pytest.mark.parametrize("enum_name", sorted(CHOICE_FLAGS))
def test_every_backend_choice_of_the_profile_is_accepted_by_a_known_release(
        real_options: Callable[[str], dict[str, Any]], enum_name: str) -> None:
    accepted: set[str] = set()
    for version in KNOWN_SGLANG:
        for flag in CHOICE_FLAGS[enum_name]:
            found = find_option(real_options(version), flag)
            accepted |= {str(choice) for choice in (found or {}).get("choices") or ()}
    enum: type[StrEnum] = getattr(choices, enum_name)
    assert {member.value for member in enum} - accepted == set()


def test_every_backend_enum_of_the_profile_has_its_flags_named() -> None:
    backends = {name for name, value in vars(choices).items()
                if isinstance(value, type) and issubclass(value, StrEnum) and value.__module__ == choices.__name__}
    assert set(CHOICE_FLAGS) == backends - {"P2PLevel", "NcclDebug", "RestartPolicy"}
