"""Rendering of the unit and the env file: content, refusals, and round trips of hostile values.

Round trips are checked twice: through tests/helpers/systemd_syntax.py (a reader written from systemd's
documented rules) and, independently of that reader, through the host's real systemd binaries:
`systemd-analyze verify` and the unit dump of `systemd --test` (which shows systemd's own argv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.launcher_run import argv_printer, launched_argv
from helpers.systemd_syntax import exec_start_argv, parse_env_file, parse_exec, parse_unit_file

from deploy_lib.digests import short_hash
from deploy_lib.errors import ConfigError
from deploy_lib.release.render import (
    MAX_ARG_BYTES,
    REDACTED,
    EnvSpec,
    UnitSpec,
    render_digested_unit,
    render_env,
    render_env_redacted,
    render_launcher,
    render_unit,
    systemd_env_value,
    systemd_exec_arg,
    unit_digest_of,
)

HOSTILE = (
    "a model path/with spaces", "it's", 'say "hi"', "back\\slash", "trailing\\", "\\", "$VAR", "${X}",
    "$$", "$", "cost $5", "%n", "%%", "100%", "%", ";", "\\;", "a;b", "`id`", "$(rm -rf /)", "\ttab",
    "two\nlines", "carriage\rreturn", "\x01\x1b\x7f", "ünïcödé ✓ 🚀", "", " ", "  padded  ", "#not-a-comment",
    "--flag=$HOME", "-", "'", '"', "\\x41", "\\n", "%%%", "${X:-d}", "=",
)
# A line break cannot go into an environment value (render refuses it); everything else can.
HOSTILE_ENV = tuple(value for value in HOSTILE if "\n" not in value and "\r" not in value)

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
SYSTEMD = next((path for path in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.access(path, os.X_OK)),
               None)


def unit_spec(argv: tuple[str, ...], **changes: object) -> UnitSpec:
    spec = UnitSpec(
        description="SGLang glm-5 (release abc123)", user="root", group=None, working_directory="/root",
        environment_file="/opt/sglang-deploy/sglang/releases/abc123/sglang.env", exec_argv=argv,
        timeout_start_s=1800, timeout_stop_s=120, restart="on-failure", restart_sec=10, start_limit_burst=3,
        start_limit_interval_s=900, limit_nofile=65536, syslog_identifier="sglang",
    )
    return replace(spec, **changes)


REFERENCE_ARGV = (
    "/root/ml-env/bin/python", "-m", "sglang.launch_server", "--model", "lukealonso/GLM-5-NVFP4",
    "--served-model-name", "glm-5", "--tp-size", "8", "--mem-fraction-static", "0.92", "--trust-remote-code",
    "--host", "0.0.0.0", "--port", "8000",
)


def test_unit_has_every_directive_the_server_needs() -> None:
    unit = parse_unit_file(render_unit(unit_spec(REFERENCE_ARGV)))
    service = {key: unit.values("Service", key) for _, key, _ in unit.entries}
    assert service == {
        "Type": ("simple",), "User": ("root",), "WorkingDirectory": ("/root",),
        "EnvironmentFile": ("/opt/sglang-deploy/sglang/releases/abc123/sglang.env",),
        "ExecStart": service["ExecStart"], "KillMode": ("control-group",), "TimeoutStartSec": ("1800",),
        "TimeoutStopSec": ("120",), "Restart": ("on-failure",), "RestartSec": ("10",),
        "LimitNOFILE": ("65536",), "LimitMEMLOCK": ("infinity",), "StandardOutput": ("journal",),
        "StandardError": ("journal",), "SyslogIdentifier": ("sglang",),
        "Description": (), "After": (), "Wants": (), "WantedBy": (), "StartLimitIntervalSec": (),
        "StartLimitBurst": (),
    }
    assert unit.values("Unit", "Description") == ("SGLang glm-5 (release abc123)",)
    # a crash loop stops: the start limit belongs in [Unit] (systemd ignores it in [Service] since v230)
    assert (unit.values("Unit", "StartLimitIntervalSec"), unit.values("Unit", "StartLimitBurst")) == (("900",),
                                                                                                    ("3",))
    assert unit.values("Install", "WantedBy") == ("multi-user.target",)
    assert "Group" not in {key for _, key, _ in unit.entries}


def test_group_is_written_when_given() -> None:
    unit = parse_unit_file(render_unit(unit_spec(REFERENCE_ARGV, group="sglang")))
    assert unit.values("Service", "Group") == ("sglang",)


def test_reference_argv_is_readable_one_flag_a_line() -> None:
    text = render_unit(unit_spec(REFERENCE_ARGV))
    assert ("ExecStart=/root/ml-env/bin/python -m sglang.launch_server \\\n"
            "    --model lukealonso/GLM-5-NVFP4 \\\n") in text
    assert "    --trust-remote-code \\\n    --host 0.0.0.0 \\\n    --port 8000\n" in text
    assert exec_start_argv(text) == REFERENCE_ARGV


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_hostile_argument_round_trips_through_the_unit(value: str) -> None:
    argv = (*REFERENCE_ARGV, "--served-model-name", value, "--port", "8000")
    assert exec_start_argv(render_unit(unit_spec(argv))) == argv


def test_all_hostile_arguments_together_round_trip_even_with_variables_set() -> None:
    argv = ("/root/ml-env/bin/python", *HOSTILE)
    # Set the variables the hostile strings mention: systemd must still pass them through literally.
    assert exec_start_argv(render_unit(unit_spec(argv)), {"VAR": "x", "X": "y", "HOME": "/root"}) == argv


def test_lone_semicolon_is_quoted_so_it_cannot_start_a_second_command() -> None:
    assert systemd_exec_arg(";") == '";"'
    assert systemd_exec_arg("$HOME%n") == '"$$HOME%%n"'


@pytest.mark.parametrize("value", HOSTILE_ENV, ids=repr)
def test_hostile_environment_value_round_trips_through_the_env_file(value: str) -> None:
    values = {"BEFORE": "1", "AWKWARD": value, "AFTER": "2"}
    assert parse_env_file(render_env(EnvSpec(values=values))) == values


def test_env_file_keeps_order_and_quotes_every_value() -> None:
    text = render_env(EnvSpec(values={"NCCL_P2P_LEVEL": "5", "CUDA_HOME": "/usr/local/cuda-12.8", "E": ""}))
    assert text.splitlines()[1:] == ['NCCL_P2P_LEVEL="5"', 'CUDA_HOME="/usr/local/cuda-12.8"', 'E=""']
    assert systemd_env_value('a"$`\\%') == '"a\\"\\$\\`\\\\%"'


def test_redacted_env_hides_secrets_and_only_secrets() -> None:
    env = EnvSpec(values={"HF_TOKEN": "hf_s3cret", "NCCL_IB_DISABLE": "1", "SGLANG_API_KEY": "k3y"},
                  secret_names=frozenset({"HF_TOKEN", "SGLANG_API_KEY"}))
    redacted = render_env_redacted(env)
    assert "hf_s3cret" not in redacted and "k3y" not in redacted
    assert parse_env_file(redacted) == {"HF_TOKEN": REDACTED, "NCCL_IB_DISABLE": "1", "SGLANG_API_KEY": REDACTED}
    assert parse_env_file(render_env(env))["HF_TOKEN"] == "hf_s3cret"


@pytest.mark.parametrize(("changes", "message"), [
    ({"exec_argv": ("/root/ml-env/bin/python", "--model", "a\0b")}, r"ExecStart argument 2 \('a\\x00b'\).*NUL"),
    ({"exec_argv": ("/root/ml-env/bin/python", "x" * 1_000_000)}, "ExecStart argument 1 .*1000000 bytes"),
    ({"exec_argv": ("/root/ml-env/bin/python", "\ufdd0")}, "ExecStart argument 1 .*U\\+FDD0"),
    ({"exec_argv": ("python3", "-m")}, "ExecStart executable 'python3' must be an absolute"),
    ({"exec_argv": ("/opt/$venv/bin/python",)}, "ExecStart executable .*'\\$'"),
    ({"exec_argv": ("/opt/venv/../bin/python",)}, "normalized"),
    ({"working_directory": "//root"}, "WorkingDirectory must be an absolute, normalized path"),
    ({"exec_argv": ()}, "ExecStart has no command"),
    ({"description": "two\nlines"}, "Description contains a control character"),
    ({"description": "ends in \\"}, "Description contains a backslash"),
    ({"working_directory": "relative/dir"}, "WorkingDirectory must be an absolute"),
    ({"environment_file": "/opt/x/ sglang.env "}, "EnvironmentFile has leading or trailing whitespace"),
    ({"user": "root; rm"}, "User 'root; rm' is not a valid user/group name"),
    ({"group": "-g"}, "Group '-g' is not a valid"),
    ({"restart": "sometimes"}, "Restart='sometimes' is not one of no, on-failure, always"),
    ({"timeout_start_s": 0}, "TimeoutStartSec=0 must be an integer >= 1"),
    ({"restart_sec": -1}, "RestartSec=-1 must be"),
    ({"start_limit_burst": 0}, "StartLimitBurst=0 must be an integer >= 1"),
    ({"start_limit_interval_s": "900"}, "StartLimitIntervalSec='900' must be an integer"),
])
def test_unit_refuses_what_systemd_cannot_carry_and_names_it(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_unit(unit_spec(REFERENCE_ARGV, **changes))


@pytest.mark.parametrize(("values", "secret_names", "message"), [
    ({"MODEL_DIR": "a\0b"}, frozenset(), "environment variable MODEL_DIR contains a NUL byte"),
    ({"MODEL_DIR": "a\nb"}, frozenset(), "environment variable MODEL_DIR contains a line break"),
    ({"MODEL_DIR": "a\rb"}, frozenset(), "environment variable MODEL_DIR contains a line break"),
    ({"MODEL_DIR": "x" * MAX_ARG_BYTES}, frozenset(), "environment variable MODEL_DIR is .* bytes long"),
    ({"1BAD": "x"}, frozenset(), "environment variable name '1BAD' is not valid"),
    ({"BAD-NAME": "x"}, frozenset(), "environment variable name 'BAD-NAME' is not valid"),
    ({"A": "x"}, frozenset({"HF_TOKEN"}), "secret names without a value: HF_TOKEN"),
])
def test_env_refuses_what_systemd_cannot_carry_and_names_it(
        values: dict[str, str], secret_names: frozenset[str], message: str) -> None:
    env = EnvSpec(values=values, secret_names=secret_names)
    for render in (render_env, render_env_redacted):
        with pytest.raises(ConfigError, match=message):
            render(env)


def test_filters_refuse_unrepresentable_values_on_their_own() -> None:
    with pytest.raises(ConfigError, match="NUL"):
        systemd_exec_arg("\0")
    with pytest.raises(ConfigError, match="line break"):
        systemd_env_value("a\nb")


# --- the host's real systemd -------------------------------------------------------------------------


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory the unprivileged `systemd --test` can read (pytest's tmp_path is private to root)."""
    with tempfile.TemporaryDirectory(prefix="sglang-render-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def hostile_unit(directory: Path) -> tuple[Path, UnitSpec]:
    """A unit whose ExecStart points at a real executable (verify checks it) and carries every hostile value."""
    python = directory / "venv with space" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    spec = unit_spec((str(python), "-m", "sglang.launch_server", "--model", *HOSTILE, "--port", "8000"),
                     description="SGLang 100% \"quoted\" $HOME 'x' ; %n")
    path = directory / "sglang-render-test.service"
    path.write_text(render_unit(spec))
    path.chmod(0o644)
    return path, spec


def systemd_analyze_verify(unit: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", "--generators=no", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)


needs_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None,
                                   reason="systemd-analyze not installed (Debian package systemd)")


@needs_analyze
def test_systemd_analyze_verify_accepts_the_rendered_unit(world_readable_dir: Path) -> None:
    unit, _ = hostile_unit(world_readable_dir)
    result = systemd_analyze_verify(unit)
    assert (result.returncode, result.stderr) == (0, "")


@needs_analyze
@pytest.mark.parametrize(("quoted", "naive"), [('";"', ";"), ('"it\'s"', "it's")], ids=["bare ;", "bare '"])
def test_systemd_analyze_verify_catches_a_naively_quoted_unit(
        world_readable_dir: Path, quoted: str, naive: str) -> None:
    # Control for the test above: one word written without our quoting must make verify complain.
    unit, _ = hostile_unit(world_readable_dir)
    unit.write_text(unit.read_text().replace(quoted, naive))
    result = systemd_analyze_verify(unit)
    lines = unit.read_text().splitlines()
    last = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    while lines[last].endswith("\\"):
        last += 1
    # systemd names the last line of a continued setting
    assert result.returncode != 0 and f"sglang-render-test.service:{last + 1}" in result.stderr


def decode_dump_command_line(text: str) -> tuple[str, ...]:
    """Words of a `Command Line:` of systemd's unit dump: bare, or "…" with shell and C backslash escapes."""
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
    words: list[str] = []
    position = 0
    while position < len(text):
        if text[position] == " ":
            position += 1
            continue
        if text[position] != '"':
            end = text.find(" ", position)
            end = len(text) if end < 0 else end
            words.append(text[position:end])
            position = end
            continue
        raw = bytearray()
        position += 1
        while text[position] != '"':
            char = text[position]
            if char != "\\":
                raw += char.encode()
                position += 1
            elif text[position + 1].isdigit():
                raw.append(int(text[position + 1:position + 4], 8))
                position += 4
            else:
                raw += simple.get(text[position + 1], text[position + 1]).encode()
                position += 2
        words.append(raw.decode())
        position += 1
    return tuple(words)


def systemd_unit_dump(directory: Path, unit_name: str) -> dict[str, list[str]]:
    """`systemd --test` (system mode, run unprivileged as it insists) loads the unit and dumps its settings."""
    assert SYSTEMD is not None
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
    result = subprocess.run(
        [*as_nobody, SYSTEMD, "--test", "--system", f"--unit={unit_name}", "--no-pager"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/", "LANG": "C.UTF-8",
             "SYSTEMD_UNIT_PATH": f"{directory}:"},  # our directory first, then the host's units
    )
    assert result.returncode == 0, result.stderr
    settings: dict[str, list[str]] = {}
    inside = False
    for line in result.stdout.split("\n"):
        if line.startswith("\t-> Unit "):
            inside = line == f"\t-> Unit {unit_name}:"
        elif inside and ": " in line:
            key, _, value = line.strip("\t").partition(": ")
            settings.setdefault(key, []).append(value)
    assert settings, f"{unit_name} missing from the dump; stderr: {result.stderr}"
    return settings


@pytest.mark.skipif(SYSTEMD is None or (os.geteuid() == 0 and shutil.which("setpriv") is None),
                    reason="needs /lib/systemd/systemd (Debian package systemd) and, as root, setpriv")
def test_systemd_itself_reads_back_the_hostile_argv_and_settings(world_readable_dir: Path) -> None:
    unit, spec = hostile_unit(world_readable_dir)
    settings = systemd_unit_dump(world_readable_dir, unit.name)
    # The dump shows argv after unquoting and specifiers, before `$$` -> `$` at exec time.
    (command_line,) = settings["Command Line"]
    assert decode_dump_command_line(command_line) == tuple(arg.replace("$", "$$") for arg in spec.exec_argv)
    assert settings["Description"] == [spec.description]
    assert settings["WorkingDirectory"] == ["/root"] and settings["User"] == ["root"]
    assert settings["EnvironmentFile"] == [spec.environment_file]
    assert (settings["Type"], settings["Restart"], settings["KillMode"]) == (["simple"], ["on-failure"],
                                                                             ["control-group"])
    assert settings["LimitNOFILE"] == ["65536"] and settings["LimitMEMLOCK"] == [str(2**64 - 1)]
    assert settings["StandardOutput"] == ["journal"] and settings["StandardError"] == ["journal"]


@pytest.mark.skipif(SYSTEMD is None or (os.geteuid() == 0 and shutil.which("setpriv") is None),
                    reason="needs /lib/systemd/systemd (Debian package systemd) and, as root, setpriv")
@pytest.mark.parametrize("exec_start", [
    "/bin/echo $SPLIT ${SPLIT} a\\sb 'c d'\"e\" \\; \"%%\" 50%% $$X ${X:-d} \"\\x41\\u00e9\\101\\t\" ''",
    "/bin/echo one \\\n  # a comment line inside a continued line\n  'two' ; /bin/echo \"three four\" ;",
    "-/bin/echo a;b ;a \"\\\\\" x\\sy",
])
def test_reader_agrees_with_systemd_on_hand_written_exec_lines(world_readable_dir: Path, exec_start: str) -> None:
    # Drift checks read files a person may have edited, so the reader is held to systemd on those too.
    unit_text = f"[Service]\nType=oneshot\nExecStart={exec_start}\n"
    (world_readable_dir / "sglang-render-test.service").write_text(unit_text)
    (world_readable_dir / "sglang-render-test.service").chmod(0o644)
    settings = systemd_unit_dump(world_readable_dir, "sglang-render-test.service")
    ours = [command.argv for value in parse_unit_file(unit_text).values("Service", "ExecStart")
            for command in parse_exec(value)]
    assert [decode_dump_command_line(line) for line in settings["Command Line"]] == ours


def test_the_launcher_execs_exactly_the_hostile_argv(tmp_path: Path) -> None:
    """Input tried: every HOSTILE string as one argument and as a flag's value, run by the real /bin/sh (dash)."""
    flags = (part for value in HOSTILE for part in ("--flag", value))
    argv = (argv_printer(tmp_path / "bin" / "python"), "-m", "sglang.launch_server", *HOSTILE, *flags)
    assert launched_argv(render_launcher(argv), tmp_path) == argv


def test_the_launcher_refuses_what_no_exec_can_carry() -> None:
    """Input tried: a NUL byte in an argument and a relative interpreter."""
    with pytest.raises(ConfigError, match=r"ExecStart argument 2 \('a\\x00b'\).*NUL"):
        render_launcher(("/root/ml-env/bin/python", "--model", "a\0b"))
    with pytest.raises(ConfigError, match="must be an absolute"):
        render_launcher(("python3", "-m"))


def test_the_unit_carries_the_digest_of_its_own_text() -> None:
    """Equal unit settings, equal text and digest; one setting changed, another digest."""
    spec = unit_spec(("/opt/sglang-deploy/sglang/current/launch",))
    text = render_digested_unit(spec)
    assert unit_digest_of(text) == short_hash(render_unit(spec))
    assert parse_unit_file(text).values("Unit", "Description") == (
        f"SGLang glm-5 (release abc123) (unit {short_hash(render_unit(spec))})",)
    assert render_digested_unit(replace(spec)) == text
    assert unit_digest_of(render_digested_unit(replace(spec, timeout_stop_s=121))) != unit_digest_of(text)
    assert unit_digest_of(render_unit(spec)) is None
