"""The rendered unit, launcher and env file run under the sandbox guest's real systemd (PID 1) and deliver exactly
the argv and environment we rendered, hostile values included.

Needs the fixture `sandbox_ssh` from tests/sandbox/conftest.py (sandbox engineer): a deploy_lib.remote.Remote
logged in to the guest as root or as a passwordless-sudo user. Skips with a reason until it exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import PurePosixPath

import pytest
from helpers.systemd_syntax import exec_start_argv, parse_env_file

from deploy_lib.release.render import (
    EnvSpec,
    UnitSpec,
    render_env,
    render_launcher,
    render_unit,
    systemd_env_value,
    systemd_exec_arg,
)
from deploy_lib.remote import Put, Remote, Step
from deploy_lib.store import ENV_FILE_MODE, FILE_MODE, LAUNCHER_MODE

pytestmark = pytest.mark.sandbox

UNIT_NAME = "sglang-render-test.service"
WORK_DIR = PurePosixPath("/run/sglang-render-test")
SEEN = WORK_DIR / "seen.json"
ENV_FILE = WORK_DIR / "sglang.env"
LAUNCHER = WORK_DIR / "launch"
# Records the argv exactly as exec'd (argv[0] included) and the environment, then exits 0.
PROBE = ("import json, os; names = json.loads(os.environ['PROBE_NAMES']); "
         "argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]; "
         f"open({str(SEEN)!r}, 'w').write(json.dumps({{'argv': [a.decode() for a in argv], "
         "'env': {n: os.environ.get(n) for n in names}}))")
HOSTILE = (
    "a model path/with spaces", "it's", 'say "hi"', "back\\slash", "trailing\\", "$VAR", "${X}", "$$", "$",
    "%n", "%%", "100%", ";", "\\;", "`id`", "$(rm -rf /)", "\ttab", "two\nlines", "ünïcödé ✓ 🚀", "", "  padded  ",
    "#not-a-comment", "--flag=$HOME",
)
HOSTILE_ENV = {f"AWKWARD_{index}": value for index, value in enumerate(HOSTILE) if "\n" not in value}


@pytest.fixture
def guest(sandbox_ssh: Remote) -> Iterator[Remote]:
    yield sandbox_ssh
    sandbox_ssh.run([
        Step("remove test unit", ("rm", "-rf", f"/etc/systemd/system/{UNIT_NAME}", str(WORK_DIR)), sudo=True),
        Step("daemon-reload", ("systemctl", "daemon-reload"), sudo=True),
    ])


def run_probe(guest: Remote, unit_text: str, env_text: str, launcher_text: str | None = None
              ) -> tuple[dict[str, object], str]:
    """Install (with the launcher at LAUNCHER) and run the unit to completion; what the probe process saw, and
    `systemctl show` of it."""
    launcher = [Put(LAUNCHER, launcher_text.encode(), LAUNCHER_MODE, sudo=True)] if launcher_text else []
    results = guest.run([
        Step("make work dir", ("mkdir", "-p", str(WORK_DIR)), sudo=True),
        *launcher,
        Put(ENV_FILE, env_text.encode(), ENV_FILE_MODE, sudo=True, secret=True),
        Put(PurePosixPath("/etc/systemd/system") / UNIT_NAME, unit_text.encode(), FILE_MODE, sudo=True),
        Step("daemon-reload", ("systemctl", "daemon-reload"), sudo=True),
        Step("run the unit to completion", ("systemctl", "start", "--wait", UNIT_NAME), sudo=True, timeout_s=60),
        Step("read what the process saw", ("cat", str(SEEN)), sudo=True),
        Step("systemd's view", ("systemctl", "show", "-p", "ExecStart", "-p", "EnvironmentFiles", UNIT_NAME),
             sudo=True),
    ])
    return json.loads(results[-2].stdout), results[-1].stdout


def test_real_systemd_execs_exactly_the_rendered_argv_and_environment(guest: Remote) -> None:
    argv = ("/usr/bin/python3", "-c", PROBE, *HOSTILE)
    environment = {"X": "set", "VAR": "set", **HOSTILE_ENV, "HF_TOKEN": "hf_$ecret\"`\\"}
    environment["PROBE_NAMES"] = json.dumps(sorted([*environment, "PROBE_NAMES"]))
    unit = render_unit(UnitSpec(
        description="render round trip 100% \"quoted\"", user="root", group=None, working_directory="/",
        environment_file=str(ENV_FILE), exec_argv=argv, timeout_start_s=60, timeout_stop_s=10, restart="no",
        restart_sec=0, start_limit_burst=3, start_limit_interval_s=900, limit_nofile=4096,
        syslog_identifier="sglang-render-test",
    ))
    env_text = render_env(EnvSpec(values=environment, secret_names=frozenset({"HF_TOKEN"})))

    seen, shown = run_probe(guest, unit, env_text)

    assert tuple(seen["argv"]) == argv
    assert seen["env"] == environment
    assert "path=/usr/bin/python3" in shown and "status=0/0" in shown
    assert f"EnvironmentFiles={ENV_FILE} (ignore_errors=no)" in shown


def test_real_systemd_runs_the_launcher_which_execs_exactly_the_rendered_argv(guest: Remote) -> None:
    """A server's unit: ExecStart= is the launcher, which execs the argv (hostile values included) in its place."""
    argv = ("/usr/bin/python3", "-c", PROBE, *HOSTILE)
    environment = {"X": "set", "VAR": "set", "PROBE_NAMES": json.dumps(["PROBE_NAMES", "X"])}
    unit = render_unit(UnitSpec(
        description="launcher round trip", user="root", group=None, working_directory="/",
        environment_file=str(ENV_FILE), exec_argv=(str(LAUNCHER),), timeout_start_s=60, timeout_stop_s=10,
        restart="no", restart_sec=0, start_limit_burst=3, start_limit_interval_s=900, limit_nofile=4096,
        syslog_identifier="sglang-render-test",
    ))

    seen, shown = run_probe(guest, unit, render_env(EnvSpec(values=environment)), render_launcher(argv))

    assert tuple(seen["argv"]) == argv
    assert seen["env"] == {"PROBE_NAMES": environment["PROBE_NAMES"], "X": "set"}
    assert f"path={LAUNCHER}" in shown and "status=0/0" in shown


HAND_WRITTEN_ENV = (
    "# a comment continued \\\nHIDDEN=1\n  SPACED = value with  interior   \n"
    "SQ='single $x \"q\" \\n\nnext line'\nDQ=\"a\\\"b\\\\c\\`d\\$e\\qf\"\n"
    "UNQ=a\"b\"'c' \\\\ \\$x\nCONT=one \\\ntwo\nJOINED= \"x\" 'y' \nEMPTY=\n"
    "SPLIT=one \"two three\" 'four'\nX=ex\nDUP=first\nDUP=second\nJUNK LINE\n"
)
HAND_WRITTEN_EXEC = (
    "$SPLIT ${SPLIT} a\\sb 'c d'\"e\" \\; \"%%\" $$X ${X:-d} \"\\x41\\u00e9\\101\" \\\n"
    "  # a comment line inside a continued line\n  'last'"
)


def test_reader_agrees_with_real_systemd_on_hand_written_files(guest: Remote) -> None:
    # Files written by a person (drift checks read those), not by render: the reader must match systemd.
    expected_env = parse_env_file(HAND_WRITTEN_ENV)
    names = [*expected_env, "HIDDEN", "PROBE_NAMES"]
    env_text = HAND_WRITTEN_ENV + f"PROBE_NAMES={systemd_env_value(json.dumps(names))}\n"
    unit_text = (f"[Service]\nType=simple\nEnvironmentFile={ENV_FILE}\n"
                 f"ExecStart=/usr/bin/python3 -c {systemd_exec_arg(PROBE)} {HAND_WRITTEN_EXEC}\n")
    environment = parse_env_file(env_text)

    seen, _ = run_probe(guest, unit_text, env_text)

    assert seen["env"] == {name: environment.get(name) for name in names}
    assert tuple(seen["argv"]) == exec_start_argv(unit_text, environment)
