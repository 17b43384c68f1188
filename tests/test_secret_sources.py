"""A secret from a local command (a password manager's CLI): run without a shell, its stdout the value, never shown;
refused clearly when it fails, prints nothing or is written as one string."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.deploy_plan import NOW, facts, first_plan, target

from deploy_lib.deploy.plan import plan_deploy
from deploy_lib.errors import ConfigError
from deploy_lib.profile import SecretRef, load_profile
from deploy_lib.release.model import available_secrets, resolve_secrets

HOSTILE = "hf_$(touch PWNED);`id`'\"\\ *"


def _profile_with(tmp_path: Path, ref: str):
    (tmp_path / "p.yaml").write_text(f"model: {{path: m}}\nsecrets:\n  HF_TOKEN: {ref}\n")
    return load_profile(tmp_path, "p").profile


def test_the_commands_stdout_is_the_value_and_no_shell_reads_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Input tried: a command printing a value full of shell syntax, and an argument that would run `touch` if a
    shell saw it."""
    monkeypatch.chdir(tmp_path)
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1])", HOSTILE]
    profile = _profile_with(tmp_path, json.dumps({"command": argv}))
    assert resolve_secrets(profile, {}) == {"HF_TOKEN": HOSTILE}
    assert not (tmp_path / "PWNED").exists()


def test_a_failing_command_names_the_secret_status_and_its_message_never_its_output(tmp_path: Path) -> None:
    """Input tried: a command that prints a would-be value on stdout, an error on stderr, and exits 3."""
    argv = [sys.executable, "-c", "import sys; print('hf_' + 'LEAKED'); sys.exit('op: not signed in')"]
    with pytest.raises(ConfigError) as refused:
        resolve_secrets(_profile_with(tmp_path, json.dumps({"command": argv})), {})
    message = str(refused.value)
    assert "secret HF_TOKEN:" in message and "exited with status 1: op: not signed in" in message
    assert "hf_LEAKED" not in message


def test_a_command_not_installed_or_printing_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="command 'no-such-password-manager' is not found on this machine"):
        resolve_secrets(_profile_with(tmp_path, "{command: [no-such-password-manager, read, x]}"), {})
    with pytest.raises(ConfigError, match="value from `true` is empty"):
        resolve_secrets(_profile_with(tmp_path, "{command: ['true']}"), {})


@pytest.mark.parametrize(("ref", "expected"), [
    ("{command: op read op://v/i/f}", 'write the command as a list of words, run without a shell: e.g. '
                                      '`command: ["op", "read", "op://v/i/f"]`'),
    ("{command: []}", "Tuple should have at least 1 item"),
    ("{command: [pass, show, x], env: HF_TOKEN}", "give exactly one of"),
])
def test_a_command_written_wrong_is_refused_naming_the_key(tmp_path: Path, ref: str, expected: str) -> None:
    """Input tried: a command as one string, an empty one, and a command beside an env var."""
    with pytest.raises(ConfigError) as refused:
        _profile_with(tmp_path, ref)
    assert "secrets.HF_TOKEN" in str(refused.value) and expected in str(refused.value)


def test_a_plan_shows_where_the_secret_comes_from_never_its_value() -> None:
    loaded, _ = first_plan()
    ref = SecretRef(command=(sys.executable, "-c", "print('hf_' + 'X' * 3 + 'MANAGER')"))
    loaded = loaded.model_copy(update={"profile": loaded.profile.model_copy(update={"secrets": {"HF_TOKEN": ref}})})
    values, not_available = available_secrets(loaded.profile, {})
    assert values == {"HF_TOKEN": "hf_XXXMANAGER"} and not not_available
    plan = plan_deploy(loaded, target(), facts(), values, False, NOW)
    lines = plan.dry_run_lines()
    assert f"  + secret HF_TOKEN = {{command: [{sys.executable}, -c, print('hf_' + 'X' * 3 + 'MANAGER')]}}" in lines
    shown = "\n".join([*lines, plan.release.env_text_redacted, json.dumps(plan.release.record())])
    assert "hf_XXXMANAGER" not in shown


@pytest.mark.parametrize(("content", "refusal"), [
    ("hf_caf\xe9".encode("latin-1"), "secret HF_TOKEN: {path}:1: not UTF-8: byte 0xe9 at offset 6"),
    (None, "secret HF_TOKEN: {path}: cannot read: a directory"),
    (b"", "secret HF_TOKEN: value from {path} is empty")])
def test_a_secret_file_that_is_not_text_is_refused_naming_it(tmp_path: Path, content: bytes | None,
                                                              refusal: str) -> None:
    """Input tried: a secret file in Latin-1 (a UnicodeDecodeError traceback) and a directory given as the file."""
    path = tmp_path / "token"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        resolve_secrets(_profile_with(tmp_path, json.dumps({"file": str(path)})), {})
    assert str(refused.value).startswith(refusal.format(path=path))
