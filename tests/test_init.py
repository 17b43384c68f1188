"""`sglang-deploy init` for any model: the profile it writes holds only what the user gave, loads and renders, the
inventory holds their host; a hostile value is refused naming its option, one YAML would misread is quoted."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
import yaml
from helpers.deploy_plan import NOW, facts

from deploy_lib.deploy.plan import VenvChoice, plan_deploy
from deploy_lib.deploy.project import Project, resolve_target
from deploy_lib.deploy.starter import ModelRequest, for_model, new_project, write_project
from deploy_lib.errors import ConfigError, PreflightError
from deploy_lib.facts.host import SGLangInstall
from deploy_lib.release.model import build_release
from deploy_lib.store import StoreLayout


def started(tmp_path: Path, request: ModelRequest, example: str | None = None) -> Project:
    write_project(tmp_path, new_project(example, request))
    return Project(tmp_path)


def launcher(project: Project, name: str) -> str:
    layout = StoreLayout(service="sglang", root=PurePosixPath("/opt/sglang-deploy"))
    return build_release(project.profile(name), layout, "0.5.23", {}).launcher_text


def test_a_model_on_two_gpus_is_a_short_profile_with_metrics_that_renders_and_an_inventory_of_the_host(
        tmp_path: Path) -> None:
    project = started(tmp_path, ModelRequest("Qwen/Qwen3-8B", 2, "192.0.2.10", user="deploy"))
    profile = tmp_path / "inventory" / "profiles" / "qwen3-8b.yaml"
    body = [line for line in profile.read_text().splitlines() if not line.startswith("#")]
    assert body == ["model: {path: Qwen/Qwen3-8B}", "parallel: {tp: 2}", "features: {metrics: true}"]
    argv = launcher(project, "qwen3-8b")
    assert "--model-path Qwen/Qwen3-8B" in argv and "--tp-size 2" in argv and "/root/ml-env/bin/python3" in argv
    assert "--enable-metrics" in argv  # /metrics for the watch and `workload` (issue 42)
    host = project.inventory(None).host(None)
    assert host.name == "gpu1" and host.address == "192.0.2.10"
    assert (host.vars.ansible_user, host.vars.gpu_count, host.vars.profile) == ("deploy", 2, "qwen3-8b")
    assert (tmp_path / ".gitignore").exists()


def test_the_venv_and_name_given_end_up_in_the_files_and_the_host_needs_that_venv(tmp_path: Path) -> None:
    request = ModelRequest("/models/llama-3.1-8b", 1, "gpu-box", venv="/opt/sglang", name="llama")
    made = for_model(request)
    assert made.profile == "llama" and "SGLang installed in a virtual environment at /opt/sglang" in made.host_needs[0]
    project = started(tmp_path, request)
    argv = launcher(project, "llama")
    assert "exec /opt/sglang/bin/python3 -m sglang.launch_server" in argv
    assert "--model-path /models/llama-3.1-8b" in argv
    assert project.inventory(None).host(None).vars.profile == "llama"


def test_without_a_venv_the_host_must_have_the_default_one(tmp_path: Path) -> None:
    assert for_model(ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10")).host_needs[0].startswith(
        "SGLang installed in a virtual environment at /root/ml-env")


def test_init_says_the_host_needs_a_venv_or_a_lock_and_that_the_first_plan_checks_it() -> None:
    need = for_model(ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10")).host_needs[0]
    assert need == ("SGLang installed in a virtual environment at /root/ml-env (the profile's service.venv), or a lock "
                    "to build one from (service.venv_build: `invoke docs venvs`); the first `invoke plan` checks it")


@pytest.mark.parametrize(("venv", "host_var", "venv_key"), [
    (None, None, "service.venv of {profile}, its default"),
    ("/opt/sglang", None, "service.venv of {profile}"),
    (None, "/srv/env", "the host's `venv` var in the inventory")])
def test_the_first_plan_on_a_host_without_the_venv_names_the_key_and_the_fix(
        tmp_path: Path, venv: str | None, host_var: str | None, venv_key: str) -> None:
    """Input tried: init's project, then a plan on a host that has no SGLang where the profile says (the venv's
    python3 missing, as the facts read it)."""
    project = started(tmp_path, ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10", venv=venv))
    target = resolve_target(project.inventory(None), None)
    if host_var is not None:
        target = replace(target, host=target.host.model_copy(update={
            "vars": target.host.vars.model_copy(update={"venv": host_var})}))
    missing = replace(facts(gpus=1), sglang=SGLangInstall(False, None, None, {}, "the venv's python3 was not found"))
    with pytest.raises(PreflightError) as caught:
        plan_deploy(project.profile("qwen3-8b"), target, missing, {}, False, NOW)
    path = host_var or venv or "/root/ml-env"
    key = venv_key.format(profile=tmp_path / "inventory" / "profiles" / "qwen3-8b.yaml")
    assert caught.value.message == f"gpu1: no SGLang found in {path} ({key}): the venv's python3 was not found"
    assert caught.value.hint == (f"install SGLang in a venv there (`python3 -m venv {path} && {path}/bin/pip install "
                                 "sglang`), or set service.venv to the venv that has it, or give service.venv_build "
                                 "a lock the deploy builds the venv from (`invoke docs venvs`)")
    assert caught.value.exit_code == 3
    # a managed venv (built, adopted, patched) is no key of the user's: none is named
    managed = "/opt/sglang-deploy/sglang/venvs/0123456789abcdef"
    with pytest.raises(PreflightError) as caught:
        plan_deploy(project.profile("qwen3-8b"), target, missing, {}, False, NOW, venv=VenvChoice(managed))
    assert caught.value.message == f"gpu1: no SGLang found in {managed}: the venv's python3 was not found"
    assert "`invoke venv.list`" in str(caught.value.hint)


@pytest.mark.parametrize(("request_", "option"), [
    (ModelRequest("Qwen/Qwen3-8B; rm -rf /", 1, "192.0.2.10"), "--model"),
    (ModelRequest("./weights", 1, "192.0.2.10"), "--model"),
    (ModelRequest("Qwen/Qwen3-8B", 3, "192.0.2.10"), "--gpus"),
    (ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10 -oProxyCommand=sh"), "--host"),
    (ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10", user="root\nHost *"), "--user"),
    (ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10", venv="ml-env"), "--venv"),
    (ModelRequest("Qwen/Qwen3-8B", 1, "192.0.2.10", name="../../etc/x"), "--name"),
    (ModelRequest(None, 1, "192.0.2.10"), "--model"),
], ids=["shell", "relative-model", "gpus", "ssh-option", "newline-user", "relative-venv", "path-name", "no-model"])
def test_a_hostile_or_missing_value_is_refused_naming_its_option_and_nothing_is_written(
        tmp_path: Path, request_: ModelRequest, option: str) -> None:
    with pytest.raises(ConfigError, match=option) as refused:
        write_project(tmp_path, new_project(None, request_))
    assert refused.value.exit_code == 2 and not any(tmp_path.iterdir())


def test_values_yaml_would_misread_are_quoted_and_read_back_as_given(tmp_path: Path) -> None:
    """A model path with `: ` and a host alias spelled as YAML's null and a number: written quoted, read back as
    text (failed without quoting: `null` would be no address, `10` a number)."""
    started(tmp_path, ModelRequest("/models/a: b", 1, "null", name="null"))
    written = yaml.safe_load((tmp_path / "inventory" / "profiles" / "null.yaml").read_text())
    assert written == {"model": {"path": "/models/a: b"}, "parallel": {"tp": 1}, "features": {"metrics": True}}
    host = Project(tmp_path).inventory(None).host(None)
    assert host.address == "null" and host.vars.profile == "null"


def test_the_reference_rig_is_an_example_and_model_with_example_or_neither_is_refused(tmp_path: Path) -> None:
    project = started(tmp_path, ModelRequest(None, 1, None), example="glm5-nvfp4")
    assert project.profile("glm5-nvfp4").profile.parallel.tp == 8
    with pytest.raises(ConfigError, match="not both"):
        new_project("glm5-nvfp4", ModelRequest("Qwen/Qwen3-8B", 1, None))
    with pytest.raises(ConfigError, match="did you mean `glm5-nvfp4`"):
        new_project("glm5-nvfp", ModelRequest(None, 1, None))
    with pytest.raises(ConfigError, match="--model and --host"):
        new_project(None, ModelRequest(None, 1, None))


class Terminal:
    """stdin as a terminal: init asks; the answers come from `input`, patched."""

    def isatty(self) -> bool:
        return True


def init_line(line: str, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """`sglang-deploy init ...` through the program's own run: (exit code, stdout, stderr)."""
    from deploy_cli.collection import user_tasks
    from deploy_cli.program import NAME, DeployProgram, OneTaskExecutor
    program = DeployProgram(name=NAME, binary=NAME, version="0", namespace=user_tasks(), executor_class=OneTaskExecutor)
    try:
        program.run([NAME, "init", *line.split()])
        code: object = 0
    except SystemExit as ended:
        code = ended.code
    shown = capsys.readouterr()
    return code, shown.out, shown.err


def answering(monkeypatch: pytest.MonkeyPatch, *answers: str) -> None:
    """stdin a terminal whose user types ANSWERS in turn, then Ctrl-D (the questions go to stderr)."""
    import builtins
    left = iter(answers)

    def typed(prompt: str = "") -> str:
        answer = next(left, None)
        if answer is None:
            raise EOFError
        return answer

    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr(builtins, "input", typed)


def questions(err: str) -> list[str]:
    return re.findall(r"(Your model|GPUs it runs on|The GPU host's address)[^:]*?(\[\d+\])?: ", err)


def test_at_a_terminal_init_without_flags_asks_model_gpus_and_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An empty answer takes the default shown ([1] GPUs); a model or host left empty is asked again; a count that
    is not a number too."""
    answering(monkeypatch, "", "Qwen/Qwen3-32B", "four", "4", "", "192.0.2.10")
    code, out, err = init_line(f"--directory {tmp_path}", capsys)
    assert code == 0, err
    assert questions(err) == [("Your model", ""), ("Your model", ""), ("GPUs it runs on", "[1]"),
                              ("GPUs it runs on", "[1]"), ("The GPU host's address", ""),
                              ("The GPU host's address", "")]
    assert "'four' is not a number of GPUs" in err
    profile = tmp_path / "inventory" / "profiles" / "qwen3-32b.yaml"
    assert [line for line in profile.read_text().splitlines() if not line.startswith("#")] == [
        "model: {path: Qwen/Qwen3-32B}", "parallel: {tp: 4}", "features: {metrics: true}"]
    assert Project(tmp_path).inventory(None).host(None).address == "192.0.2.10"
    assert f"wrote {profile}" in out


def test_a_host_given_is_not_asked_and_enter_takes_the_gpus_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    answering(monkeypatch, "Qwen/Qwen3-8B", "")
    code, _, err = init_line(f"--host 192.0.2.11 --gpus 2 --directory {tmp_path}", capsys)
    assert code == 0, err
    assert questions(err) == [("Your model", ""), ("GPUs it runs on", "[2]")]
    assert Project(tmp_path).inventory(None).host(None).vars.gpu_count == 2


def test_input_ended_before_the_last_answer_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    answering(monkeypatch, "Qwen/Qwen3-8B", "1")
    code, _, err = init_line(f"--directory {tmp_path}", capsys)
    assert code == 1 and "nothing was written" in err and not any(tmp_path.iterdir())


def test_an_answer_is_checked_as_its_flag_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    answering(monkeypatch, "Qwen/Qwen3-8B", "3", "192.0.2.10")
    code, _, err = init_line(f"--directory {tmp_path}", capsys)
    assert code == 2 and "--gpus" in err and "Traceback" not in err and not any(tmp_path.iterdir())


def test_not_at_a_terminal_init_without_flags_asks_nothing_and_names_the_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import builtins
    monkeypatch.setattr(builtins, "input", lambda prompt="": pytest.fail(f"asked {prompt!r}"))
    code, _, err = init_line(f"--directory {tmp_path}", capsys)
    assert code == 2 and "--model and --host" in err and not any(tmp_path.iterdir())
