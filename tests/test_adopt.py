"""`invoke adopt`: a hand-run server's command and environment back to a profile, checked with the real parsers of
the released SGLang wheels; reading /proc and the venv from captured output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import yaml
from helpers.adopt import HAND_0523, HAND_ENV, PROFILES, TOKEN, hand, reference_as_hand_launched
from helpers.deploy_plan import NOW, deployed, facts, first_plan, target
from helpers.fake_remote import FakeRemote

from deploy_lib.commands.adopt import STEP_UNIT, read_process, read_unit
from deploy_lib.deploy.plan import hand_run_check, hand_run_pid, plan_deploy
from deploy_lib.deploy.preflight import preflight
from deploy_lib.errors import DriftDetected, PreflightError
from deploy_lib.facts.hand_process import (
    STEP_CMDLINE,
    STEP_CWD,
    STEP_ENVIRON,
    STEP_EXISTS,
    STEP_USER,
    adopt_profile,
    choose_venv,
    interpreter_candidates,
    interpreter_fact,
    profile_yaml,
    split_launch,
)
from deploy_lib.facts.host import UnitFacts
from deploy_lib.profile import Profile, load_profile
from deploy_lib.release.argv_check import check_argv
from deploy_lib.release.server_args import sglang_args
from deploy_lib.remote import Step, StepResult
from deploy_lib.store import ReleaseRecord

pytest_plugins = ("helpers.wheelcache",)


def adopted(version: str, argv: list[str], options: Callable[[str], dict[str, Any]],
            environ: dict[str, str] | None = None):
    process = hand(argv, environ)
    return adopt_profile(process, split_launch(process, "gpu1"), "/root/ml-env", options(version), version,
                         "adopted")


@pytest.mark.wheels
def test_the_users_command_on_0523_becomes_the_reference_profile(options) -> None:
    result = adopted("0.5.23", HAND_0523, options)
    reference = reference_as_hand_launched()  # the hand launch serves no /metrics; the reference profile adds them
    assert sglang_args(result.profile, "0.5.23") == sglang_args(reference, "0.5.23")
    with_metrics = list(sglang_args(load_profile(PROFILES, "glm5-nvfp4").profile, "0.5.23"))
    with_metrics.remove("--enable-metrics")
    assert with_metrics == list(sglang_args(result.profile, "0.5.23")), "the one flag the reference profile adds"
    assert result.profile.extra_args == [] and result.profile.environment() == reference.environment()
    assert check_argv(options("0.5.23"), list(sglang_args(result.profile, "0.5.23"))) == []
    assert result.notes == ("--model lukealonso/GLM-5-NVFP4 is written --model-path lukealonso/GLM-5-NVFP4",
                            "--tp 8 is written --tp-size 8",
                            "--disable-cuda-graph is written --cuda-graph-backend-decode disabled "
                            "--cuda-graph-backend-prefill disabled")
    assert result.launch_args == tuple(HAND_0523[3:])  # release 0 runs the command as written


@pytest.mark.wheels
def test_the_users_original_command_on_059_maps_the_nsa_spelling(options) -> None:
    argv = [("--nsa-decode-backend" if a == "--dsa-decode-backend" else "--nsa-prefill-backend"
             if a == "--dsa-prefill-backend" else a) for a in HAND_0523]
    result = adopted("0.5.9", argv, options)
    reference = reference_as_hand_launched()
    assert sglang_args(result.profile, "0.5.9") == sglang_args(reference, "0.5.9")


@pytest.mark.wheels
def test_secrets_become_references_and_never_reach_the_profile_text(options) -> None:
    argv = [*HAND_0523, "--api-key", "sk-hand-key"]
    result = adopted("0.5.23", argv, options)
    assert result.profile.secrets["HF_TOKEN"].env == "HF_TOKEN"
    assert result.profile.server.api_key is not None and result.profile.server.api_key.env == "SGLANG_API_KEY"
    assert result.secrets == {"HF_TOKEN": TOKEN, "SGLANG_API_KEY": "sk-hand-key"}
    assert "--api-key" not in result.launch_args  # release 0 passes it through the env file's launcher
    text = profile_yaml(result.profile, "header")
    assert TOKEN not in text and "sk-hand-key" not in text
    assert Profile.model_validate(yaml.safe_load(text)) == result.profile


@pytest.mark.wheels
def test_session_variables_are_dropped_and_the_venv_is_the_profiles(options) -> None:
    profile = adopted("0.5.23", HAND_0523, options).profile
    assert not {"HOME", "SHELL", "SSH_CONNECTION", "PWD", "TERM", "PATH", "VIRTUAL_ENV"} & set(profile.env)
    assert (profile.service.venv, profile.service.user, profile.service.working_directory) == \
        ("/root/ml-env", "root", "/root")


@pytest.mark.wheels
def test_flags_no_key_models_and_values_the_profile_refuses_stay_in_extra_args(options) -> None:
    argv = [*HAND_0523, "--enable-torch-compile", "--chunked-prefill-size", "4096", "--tool-call-parser", "Glm!47"]
    argv.remove("--tool-call-parser"), argv.remove("glm47")
    result = adopted("0.5.23", argv, options, {**HAND_ENV, "NCCL_IB_DISABLE": "yes"})
    assert result.profile.memory.chunked_prefill_size == 4096
    assert result.profile.extra_args == ["--enable-torch-compile", "--tool-call-parser", "Glm!47"]
    assert result.profile.env["NCCL_IB_DISABLE"] == "yes"
    assert any("model.tool_call_parser" in note for note in result.notes)


def test_a_process_that_is_not_sglang_is_refused() -> None:
    with pytest.raises(PreflightError, match=r"is not `python -m sglang\.launch_server"):
        split_launch(hand(["python", "-m", "http.server", "8000"]), "gpu1")
    launch = split_launch(hand(["/root/ml-env/bin/python3", "-u", "-m", "sglang.launch_server", "--port", "1"]), "h")
    assert launch.unbuffered and launch.args == ("--port", "1")


def test_proc_files_are_read_with_their_nul_separators_in_one_round_trip() -> None:
    remote = (FakeRemote().reply(STEP_CMDLINE, stdout="python\0-m\0sglang.launch_server\0--model\0a b\0")
              .reply(STEP_ENVIRON, stdout="A=1\0B=x=y\0").reply(STEP_CWD, stdout="/root\n")
              .reply(STEP_USER, stdout="root\n"))
    process = read_process(remote, 4242, "gpu1")
    assert process.argv == ("python", "-m", "sglang.launch_server", "--model", "a b")
    assert process.environ == {"A": "1", "B": "x=y"} and (process.cwd, process.user) == ("/root", "root")
    [batch] = remote.batches
    assert [step.name for step in batch] == [STEP_EXISTS, STEP_CMDLINE, STEP_ENVIRON, STEP_CWD, STEP_USER]
    assert next(step for step in batch if step.name == STEP_ENVIRON).secret  # its output (the secrets) never shows


def test_a_process_that_is_gone_is_refused_by_name() -> None:
    """Input tried: a pid /proc does not have (every read of it finds nothing)."""
    remote = FakeRemote().reply(lambda step: step.name.startswith("adopt: "), exit_code=1)
    with pytest.raises(PreflightError, match="gpu1: no process 4242 on the host"):
        read_process(remote, 4242, "gpu1")


def test_the_interpreter_is_found_as_the_shell_found_it_and_must_be_a_venv() -> None:
    process = hand(["python"])
    candidates = interpreter_candidates(process, "python")
    assert candidates[:2] == ["/root/ml-env/bin/python", "/usr/local/bin/python"]
    ls = "/usr/bin/python\n/root/ml-env/bin/python\n/root/ml-env/pyvenv.cfg\n"
    assert choose_venv(candidates, ls, "gpu1") == ("/root/ml-env/bin/python", "/root/ml-env")
    found = interpreter_fact(candidates, "gpu1")
    assert found.parse(StepResult(found.step, 0, ls, "", 0.0)) == ("/root/ml-env/bin/python", "/root/ml-env")
    assert interpreter_candidates(process, "ml-env/bin/python") == ["/root/ml-env/bin/python"]
    with pytest.raises(PreflightError, match="/usr/bin/python, which is not in a venv"):
        choose_venv(["/usr/bin/python"], "/usr/bin/python\n", "gpu1")


def test_the_first_deploy_over_an_adopted_server_stops_the_hand_run_process_first() -> None:
    loaded, plan = first_plan()
    release_zero = ReleaseRecord("0", "2026-11-29T10:00:00+00:00", {
        **deployed(plan).metadata, "id": "0", "adopted": {"pid": 4242, "cmdline_sha256": "ab" * 32}})
    check = hand_run_check(release_zero.metadata)
    assert [step.argv for step in check] == [("sha256sum", "--", "/proc/4242/cmdline")]
    assert hand_run_pid(release_zero.metadata, [StepResult(check[0], 0, f"{'ab' * 32}  /proc/4242/cmdline\n",
                                                           "", 0.0)]) == 4242
    assert hand_run_pid(release_zero.metadata, [StepResult(check[0], 0, f"{'cd' * 32}  x\n", "", 0.0)]) is None
    held = facts(plan.release.args, current=release_zero,
                 listeners=('LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:(("python",pid=4242,fd=7))',))
    new = plan_deploy(loaded, target(), held, {}, False, NOW, hand_pid=4242)
    preflight(new, loaded, target(), held, hand_pid=4242)  # the port is held by the server being replaced
    with pytest.raises(PreflightError, match="port 8000 is already in use"):
        preflight(new, loaded, target(), held)
    activation = [step.argv for step in new.batches.switch.activate if isinstance(step, Step)]
    stop = [("kill", "-TERM", "--", "4242"), ("tail", "--pid=4242", "-s", "0.2", "-f", "/dev/null")]
    # after the switch, before systemd starts the new release
    assert activation.index(stop[0]) > activation.index(("mv", "-T", "--", "/opt/sglang-deploy/sglang/.current.tmp",
                                                                 "/opt/sglang-deploy/sglang/current"))
    assert activation[activation.index(stop[0]):][:2] == stop
    assert activation.index(stop[1]) < activation.index(("systemctl", "restart", "--", "sglang.service"))
    assert any("the hand-run server (pid 4242, adopted as release 0) is stopped" in line
               for line in new.dry_run_lines())


HAND_UNIT = ("# /etc/systemd/system/sglang.service\n[Service]\n"
             "ExecStart=/root/ml-env/bin/python -m sglang.launch_server\n")


def test_a_first_deploy_over_a_hand_made_unit_is_refused_showing_it_and_forced_keeps_a_copy() -> None:
    # reported: a first deploy replaced a running hand-written unit with a symlink, no backup, no warning
    loaded, plan = first_plan()
    hand = replace(facts(plan.release.args, active="active"), unit_link=None, unit_file=HAND_UNIT,
                   unit=UnitFacts("active", "running", 77, 0, "loaded"))
    with pytest.raises(DriftDetected) as refused:
        plan_deploy(loaded, target(), hand, {}, False, NOW)
    assert refused.value.exit_code == 9
    assert "/etc/systemd/system/sglang.service is a unit the tool did not write" in refused.value.message
    assert "ExecStart=/root/ml-env/bin/python -m sglang.launch_server" in refused.value.message
    assert "--force" in str(refused.value.hint)
    forced = plan_deploy(loaded, target(), hand, {}, True, NOW)
    copy = next(step for step in forced.batches.stage if step.name == "keep the replaced unit: copy")
    assert copy.argv[:3] == ("cp", "-P", "--preserve=all") and copy.argv[-2] == "/etc/systemd/system/sglang.service"
    assert copy.argv[-1].startswith("/opt/sglang-deploy/sglang/replaced/sglang.service.")
    # deploy runs the stage batch before the switch replaces the file
    assert forced.batches.in_order()[0].kind == "stage"
    assert any("a copy of the replaced unit is kept at /opt/sglang-deploy/sglang/replaced/" in line
               for line in forced.dry_run_lines())


def test_adopting_a_unit_that_does_not_run_is_refused() -> None:
    remote = FakeRemote().reply(STEP_UNIT, stdout="MainPID=0\nFragmentPath=/etc/systemd/system/x.service\n"
                                                  "ActiveState=failed\n")
    with pytest.raises(PreflightError, match=r"unit x\.service is not running"):
        read_unit(remote, "x.service", "gpu1")
    remote = FakeRemote().reply(STEP_UNIT, stdout="MainPID=77\nFragmentPath=/etc/systemd/system/x.service\n"
                                                  "ActiveState=active\n").reply("adopt: unit file", stdout=HAND_UNIT)
    assert read_unit(remote, "x.service", "gpu1") == (77, "/etc/systemd/system/x.service", HAND_UNIT)
