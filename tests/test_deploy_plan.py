"""Deploy planning and preflight as pure functions of a profile and host facts (no SSH)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from decimal import Decimal
from pathlib import Path, PurePosixPath

import pytest
from helpers.deploy_plan import NOW, PROJECT, deployed, facts, first_plan, target
from helpers.server_args import with_changes

from deploy_lib.deploy.plan import plan_against, plan_deploy, recorded_switch
from deploy_lib.deploy.preflight import preflight
from deploy_lib.errors import ConfigError, DriftDetected, PreflightError
from deploy_lib.facts.host import (
    FACT_IMPORT,
    HostFacts,
    parse_free_bytes,
    parse_gpus,
    parse_import_shadow,
    parse_sha256sums,
    parse_unit,
    parse_unit_times,
)
from deploy_lib.profile import LoadedProfile, SecretRef, load_profile
from deploy_lib.release.model import available_secrets, resolve_secrets
from deploy_lib.remote import Step, StepResult
from deploy_lib.store import (
    ENV_FILE,
    HEALTHY,
    LAUNCHER_FILE,
    UNIT_FILE,
    DamagedRelease,
    ReleaseRecord,
    StoreLayout,
    Tags,
    history_entry,
)


def with_profile(loaded: LoadedProfile, **sections: dict[str, object]) -> LoadedProfile:
    """`loaded` with each section's settings updated."""
    return loaded.model_copy(update={"profile": with_changes(loaded.profile, **sections)})


def test_first_deploy_stages_switches_and_restarts() -> None:
    _, plan = first_plan()
    assert [batch.kind for batch in plan.batches.in_order()] == ["stage", "switch and restart", "once verified"]
    assert plan.current_id is None and not plan.unchanged
    assert any(str(c) == "+ flag --tp-size = 8" for c in plan.changes)
    layout = StoreLayout("sglang")
    puts = [step for step in plan.batches.stage if not isinstance(step, Step)]
    assert {p.dest for p in puts} == {layout.staging(plan.release.id) / name
                                      for name in ("sglang.service", "sglang.env", "launch", "release.json")}
    assert next(p for p in puts if p.dest.name == "sglang.env").mode == 0o600
    assert next(p for p in puts if p.dest.name == "launch").mode == 0o755
    lines = plan.dry_run_lines()
    assert any("systemctl restart -- sglang.service" in line for line in lines)


@pytest.mark.parametrize(("section", "value", "named"), [
    ("env", {"env": {"SGLANG_X": "a\ufffeb"}}, "environment variable SGLANG_X contains U+FFFE"),
    ("model", {"model": {"served_name": "glm\ufffe"}}, "ExecStart argument"),
])
def test_what_systemd_cannot_carry_is_refused_when_the_release_is_built(
        section: str, value: dict[str, dict[str, str]], named: str) -> None:
    """Input tried: a U+FFFE (which the profile's text check lets through) in an env value and a served name; the
    files are rendered only when staged, so the release's build checks them: a plan refuses before any step."""
    changed = with_profile(PROJECT.profile("glm5-nvfp4"), **{section: value[section]})
    with pytest.raises(ConfigError, match=re.escape(named)):
        plan_deploy(changed, target(), facts(), {}, False, NOW)


def test_redeploy_of_the_running_verified_release_is_a_no_op() -> None:
    loaded, plan = first_plan()
    again = plan_deploy(loaded, target(), facts(current=deployed(plan), active="active"), {}, False, NOW)
    assert again.unchanged and again.changes == ()
    assert "no changes" in again.dry_run_lines()
    assert not any("systemctl" in line for line in again.dry_run_lines()), "a no-op lists no steps"


def test_redeploy_of_a_running_release_history_does_not_record_healthy_restarts_it() -> None:
    """Input tried: `current` switched to the release, its unit active, no history line (a deploy killed mid-ladder)."""
    loaded, plan = first_plan()
    again = plan_deploy(loaded, target(), facts(current=deployed(plan), active="active", verified=False), {}, False,
                        NOW)
    assert not again.unchanged and [batch.kind for batch in again.batches.in_order()] == [
        "switch and restart", "once verified"]
    assert any("does not record it as verified" in note for note in again.notes)


def test_redeploy_when_the_current_release_directory_was_deleted_stages_it_again() -> None:
    """Input tried: the `current` link names the release, but releases/<id> is gone (systemd: not-found)."""
    loaded, plan = first_plan()
    gone = facts(current=deployed(plan), active="active")
    gone = replace(gone, store=replace(gone.store, releases=()), unit=replace(gone.unit, load_state="not-found"),
                   file_sums={})
    again = plan_deploy(loaded, target(), gone, {}, False, NOW)
    assert not again.unchanged and [batch.kind for batch in again.batches.in_order()] == [
        "stage", "switch and restart", "once verified"]
    assert any("missing or damaged on the host" in note for note in again.notes)


def test_redeploy_of_a_stopped_release_restarts_without_restaging() -> None:
    loaded, plan = first_plan()
    again = plan_deploy(loaded, target(), facts(current=deployed(plan), active="failed"), {}, False, NOW)
    assert [batch.kind for batch in again.batches.in_order()] == ["switch and restart", "once verified"]


def _reloads(plan) -> bool:  # type: ignore[no-untyped-def]
    return "systemd: daemon-reload" in [step.name for step in plan.batches.switch.activate]


def holding(host: HostFacts, release: ReleaseRecord | None = None, **times: Decimal) -> HostFacts:
    """`host` with systemd holding the unit text of `release` (default current) and not asking for a reload;
    `times`: the unit files' mtimes by release id."""
    record = release or host.store.release(str(host.store.current))
    assert record is not None
    unit = replace(host.unit, need_daemon_reload=False, unit_digest=record.metadata["unit_digest"])
    return replace(host, unit=unit, unit_times=times)


def test_restarting_the_release_whose_unit_systemd_holds_needs_no_daemon_reload() -> None:
    """Input tried: the current release stopped, its unit text loaded and its file not newer (NeedDaemonReload=no);
    then the same with systemd reporting the file changed, another unit text loaded, and a unit edited by hand."""
    loaded, plan = first_plan()
    host = facts(current=deployed(plan), active="failed")
    held = holding(host)
    assert not _reloads(plan_deploy(loaded, target(), held, {}, False, NOW))
    other_text = replace(held, unit=replace(held.unit, unit_digest="0" * 16))
    assert _reloads(plan_deploy(loaded, target(), other_text, {}, False, NOW)), "systemd holds another unit text"
    old_format = replace(held, unit=replace(held.unit, unit_digest=None))
    assert _reloads(plan_deploy(loaded, target(), old_format, {}, False, NOW)), "a unit without a digest"
    assert _reloads(plan_deploy(loaded, target(), host, {}, False, NOW)), "NeedDaemonReload=yes (or not read)"
    edited = replace(held, file_sums={**held.file_sums, UNIT_FILE: "0" * 64})
    assert _reloads(plan_deploy(loaded, target(), edited, {}, True, NOW)), "a forced repair rewrites the unit"


def test_a_new_release_with_the_same_unit_settings_links_current_unit_file_and_skips_daemon_reload() -> None:
    """Input tried: a deploy changing a flag (fusion) and one changing the environment, while systemd holds current's
    unit text; then a change of a unit-level setting (service.stop_timeout_s), and systemd asking for a reload."""
    loaded, plan = first_plan()
    held = holding(facts(current=deployed(plan), active="active"))
    layout = StoreLayout("sglang")
    for other in (PROJECT.profile("glm5-nvfp4-fusion"), with_profile(loaded, env={"NCCL_DEBUG": "WARN"})):
        switch = plan_deploy(other, target(), held, {}, False, NOW)
        assert switch.release.id != plan.release.id and switch.release.unit_text == plan.release.unit_text
        assert not _reloads(switch)
        link = next(step for step in switch.batches.stage if isinstance(step, Step) and step.argv[0] == "ln")
        assert link.argv[-2:] == (str(layout.release(plan.release.id) / UNIT_FILE),
                                  str(layout.staging(switch.release.id) / UNIT_FILE))
        assert UNIT_FILE not in {step.dest.name for step in switch.batches.stage if not isinstance(step, Step)}
    slower_stop = with_profile(loaded, service={"stop_timeout_s": 123})
    changed = plan_deploy(slower_stop, target(), held, {}, False, NOW)
    assert "TimeoutStopSec=123" in changed.release.unit_text and _reloads(changed)
    assert UNIT_FILE in {step.dest.name for step in changed.batches.stage if not isinstance(step, Step)}
    asking = replace(held, unit=replace(held.unit, need_daemon_reload=True))
    assert _reloads(plan_deploy(PROJECT.profile("glm5-nvfp4-fusion"), target(), asking, {}, False, NOW))


def test_a_switch_to_a_recorded_release_skips_daemon_reload_only_when_its_unit_file_is_not_newer() -> None:
    """Input tried: current A and an older release B of the same unit text (rollback), B's unit file older, as old
    and newer than A's by mtime, and unknown; then B of another unit text."""
    _, plan = first_plan()
    fusion = plan_deploy(PROJECT.profile("glm5-nvfp4-fusion"), target(), facts(), {}, False, NOW)
    current, older = deployed(plan), deployed(fusion)
    host = facts(current=current, active="active")
    host = replace(host, store=replace(host.store, releases=(older, current)))
    layout, a, b = StoreLayout("sglang"), current.id, older.id

    def reloads(**times: Decimal) -> bool:
        return "systemd: daemon-reload" in [step.name for step in recorded_switch(layout, holding(host, **times),
                                                                                    b).activate]

    assert not reloads(**{a: Decimal("20.5"), b: Decimal("10.25")})
    assert not reloads(**{a: Decimal("20.5"), b: Decimal("20.5")})
    assert reloads(**{a: Decimal("20.5"), b: Decimal("20.500000001")}), "newer: systemd would ask for a reload"
    assert reloads(**{a: Decimal("20.5")}), "B's unit file time not read"
    other = replace(older, metadata={**older.metadata, "unit_digest": "0" * 16})
    host = replace(host, store=replace(host.store, releases=(other, current)))
    assert reloads(**{a: Decimal("20.5"), b: Decimal("10.25")}), "B's unit text is another"


def test_switching_profiles_shows_the_semantic_diff() -> None:
    _, plan = first_plan()
    fusion = plan_deploy(PROJECT.profile("glm5-nvfp4-fusion"), target(), facts(current=deployed(plan)), {},
                         False, NOW)
    assert [str(c) for c in fusion.changes] == ["+ flag --flashinfer-allreduce-fusion-backend = auto"]
    assert fusion.release.id != plan.release.id


def test_plan_against_another_profile_shows_the_same_diff_from_the_profiles_alone() -> None:
    """`plan --against`, decided in the library: from `old` to `new`, as a deploy from one to the other would show."""
    base, fusion = PROJECT.profile("glm5-nvfp4"), PROJECT.profile("glm5-nvfp4-fusion")
    assert [str(c) for c in plan_against(base, fusion, target(), "0.5.23")] == [
        "+ flag --flashinfer-allreduce-fusion-backend = auto"]
    assert [str(c) for c in plan_against(fusion, base, target(), "0.5.23")] == [
        "- flag --flashinfer-allreduce-fusion-backend (was auto)"]
    assert plan_against(base, base, target(), "0.5.23") == ()


def test_a_unit_file_edited_by_hand_is_drift_and_force_overwrites_it() -> None:
    """Input tried: the current release's sglang.service with a checksum other than the one recorded."""
    loaded, plan = first_plan()
    edited = {UNIT_FILE: "0" * 64, ENV_FILE: plan.release.record()["files"][ENV_FILE]}
    with pytest.raises(DriftDetected, match=r"sglang\.service was edited on the host"):
        plan_deploy(loaded, target(), facts(current=deployed(plan), active="active", sums=edited), {}, False, NOW)
    forced = plan_deploy(loaded, target(), facts(current=deployed(plan), active="active", sums=edited), {}, True,
                         NOW)
    assert [batch.kind for batch in forced.batches.in_order()] == ["stage", "switch and restart", "once verified"]
    rewritten = {step.dest.name for step in forced.batches.stage if not isinstance(step, Step)}
    assert rewritten == {UNIT_FILE, ENV_FILE, LAUNCHER_FILE}, "the published release is repaired in place"


def test_a_launcher_edited_by_hand_is_drift() -> None:
    """Input tried: the current release's launcher with a checksum other than the one recorded."""
    loaded, plan = first_plan()
    edited = {**plan.release.record()["files"], LAUNCHER_FILE: "0" * 64}
    with pytest.raises(DriftDetected, match=r"current/launch was edited on the host"):
        plan_deploy(loaded, target(), facts(current=deployed(plan), active="active", sums=edited), {}, False, NOW)


def test_preflight_refuses_too_few_gpus() -> None:
    """Input tried: an 8-GPU profile against nvidia-smi showing 4 GPUs (the hint said `lower parallel.tp` whatever
    the layout)."""
    loaded, plan = first_plan()
    with pytest.raises(PreflightError, match="needs 8 GPUs per node, nvidia-smi shows 4") as refused:
        preflight(plan, loaded, target(), facts(plan.release.args, gpus=4))
    assert "parallel: tp 8 needs" in str(refused.value)
    assert refused.value.hint == "tp x dp x pp (per node) must be at most 4: use tp 4, or a host with 8 GPUs"


@pytest.mark.parametrize(("overrides", "gpus", "note"), [
    (("parallel.tp=4",), 6, "parallel: tp 4 takes 4 of the host's 6 GPUs; 2 stay idle (tp x dp x pp per node may "
                            "be up to 6)"),
    (("parallel.tp=2", "parallel.dp=3"), 8, "parallel: tp 2 x dp 3 takes 6 of the host's 8 GPUs; 2 stay idle"),
    ((), 8, None)])
def test_a_plan_says_which_gpus_a_layout_leaves_idle(overrides: tuple[str, ...], gpus: int, note: str | None) -> None:
    """Input tried: TP 4 on 6 GPUs and TP 2 x DP 3 on 8 (planned without a word); TP 8 on 8 has no note."""
    loaded = PROJECT.profile("glm5-nvfp4", overrides)
    plan = plan_deploy(loaded, target(), facts(gpus=gpus), {}, False, NOW)
    said = [each for each in plan.notes if "stay idle" in each]
    assert [each[:len(note)] for each in said] == [note] if note else said == []


@pytest.mark.parametrize(("overrides", "said"), [(("features.metrics=false",), True), ((), False)])
def test_a_plan_says_when_the_release_will_serve_no_metrics(overrides: tuple[str, ...], said: bool) -> None:
    """Input tried: the reference profile with features.metrics off (a note naming what needs them) and as written,
    metrics on (no note; the release gets --enable-metrics)."""
    plan = plan_deploy(PROJECT.profile("glm5-nvfp4", overrides), target(), facts(gpus=8), {}, False, NOW)
    notes = [note for note in plan.notes if note.startswith("features.metrics is off")]
    assert notes == (["features.metrics is off: the server will serve no /metrics, which the live-traffic watch and "
                      "`workload` read (set features.metrics: true)"] if said else [])
    assert ("--enable-metrics" in plan.release.args) is not said


def test_preflight_refuses_a_host_without_nvidia_smi() -> None:
    loaded, plan = first_plan()
    no_gpus = replace(facts(plan.release.args), gpus=None, gpu_error="nvidia-smi not found on the host")
    with pytest.raises(PreflightError, match="cannot read the GPUs: nvidia-smi not found"):
        preflight(plan, loaded, target(), no_gpus)


def test_preflight_refuses_a_flag_the_installed_sglang_does_not_know() -> None:
    """Input tried: the 0.5.23 argv against an SGLang whose parser lacks --dsa-decode-backend."""
    loaded, plan = first_plan()
    known = tuple(a for a in plan.release.args if a != "--dsa-decode-backend")
    with pytest.raises(PreflightError, match="--dsa-decode-backend") as refused:
        preflight(plan, loaded, target(), facts(known))
    assert "  unrecognized arguments: --dsa-decode-backend trtllm" in refused.value.message.splitlines()
    assert "ArgvProblem" not in refused.value.message  # a sentence, not a Python repr


def test_preflight_accepts_the_argv_when_every_flag_is_known() -> None:
    loaded, plan = first_plan()
    preflight(plan, loaded, target(), facts(plan.release.args))


def test_preflight_refuses_a_port_held_by_another_process() -> None:
    """Input tried: port 8000 listened on by nginx while our unit is inactive."""
    loaded, plan = first_plan()
    busy = facts(plan.release.args, listeners=('LISTEN 0 511 0.0.0.0:8000 0.0.0.0:* users:(("nginx",pid=7,fd=6))',))
    with pytest.raises(PreflightError, match=r"port 8000 is already in use.*nginx"):
        preflight(plan, loaded, target(), busy)
    preflight(plan, loaded, target(), replace(busy, unit=replace(busy.unit, active_state="active")))


def test_preflight_refuses_a_working_directory_that_shadows_the_installed_sglang() -> None:
    """Input tried: an editable SGLang from /root/sglang/python with the unit's working directory /root, where
    `python -m` would import /root/sglang as a namespace package (output of the host-side script, as on the guest)."""
    loaded, plan = first_plan()
    script_out = json.dumps({"served": ["/root/sglang"], "installed": ["/root/sglang/python/sglang"]})
    shadow = parse_import_shadow(StepResult(Step(FACT_IMPORT, ("env",)), 0, script_out + "\n", "", 0.0))
    assert shadow == "/root/sglang"
    with pytest.raises(PreflightError, match=r"would import SGLang from /root/sglang, not from") as refused:
        preflight(plan, loaded, target(), replace(facts(plan.release.args), import_shadow=shadow))
    assert refused.value.hint and "service.working_directory" in refused.value.hint
    same = json.dumps({"served": ["/opt/ml-env/lib/python3.11/site-packages/sglang"],
                       "installed": ["/opt/ml-env/lib/python3.11/site-packages/sglang"]})
    assert parse_import_shadow(StepResult(Step(FACT_IMPORT, ("env",)), 0, same, "", 0.0)) is None
    assert parse_import_shadow(StepResult(Step(FACT_IMPORT, ("env",)), 125, "", "env: cannot change directory", 0.0)) \
        is None


def test_preflight_refuses_an_inventory_that_misdeclares_the_architecture() -> None:
    loaded, plan = first_plan()
    hopper = facts(plan.release.args)
    hopper = replace(hopper, gpus=tuple(replace(g, compute_cap="9.0") for g in hopper.gpus or ()))
    with pytest.raises(PreflightError, match="declares sm120, nvidia-smi reports sm90"):
        preflight(plan, loaded, target(), hopper)


def test_missing_secret_is_a_config_error_before_any_connection(tmp_path: Path) -> None:
    """Input tried: secrets.HF_TOKEN referring to an environment variable that is not set."""
    (tmp_path / "p.yaml").write_text("model: {path: m}\nsecrets:\n  HF_TOKEN: {env: NOT_SET_ANYWHERE}\n")
    with pytest.raises(ConfigError, match="environment variable NOT_SET_ANYWHERE is not set"):
        resolve_secrets(load_profile(tmp_path, "p").profile, {})


def test_secrets_reach_only_the_env_file() -> None:
    (loaded, _) = first_plan()
    profile = loaded.profile.model_copy(update={"secrets": {"HF_TOKEN": SecretRef(env="T")}})
    secrets = resolve_secrets(profile, {"T": "hf_SECRET_VALUE"})
    plan = plan_deploy(loaded.model_copy(update={"profile": profile}), target(), facts(), secrets, False, NOW)
    assert 'HF_TOKEN="hf_SECRET_VALUE"' in plan.release.env_text
    shown = "\n".join([plan.release.unit_text, plan.release.env_text_redacted, json.dumps(
        plan.release.record()), *plan.dry_run_lines()])
    assert "hf_SECRET_VALUE" not in shown


def with_token(loaded):
    profile = loaded.profile.model_copy(update={"secrets": {"HF_TOKEN": SecretRef(env="HF_TOKEN")}})
    return loaded.model_copy(update={"profile": profile})


def test_a_plan_works_without_secret_values_and_never_claims_one() -> None:
    """Input tried: a dry run of a profile with secrets.HF_TOKEN while HF_TOKEN is unset (plan refused, exit 2)."""
    loaded = with_token(first_plan()[0])
    values, not_available = available_secrets(loaded.profile, {})
    assert (values, not_available) == ({}, {"HF_TOKEN": "environment variable HF_TOKEN is not set on this machine"})
    plan = plan_deploy(loaded, target(), facts(), values, False, NOW, secrets_not_available=not_available)
    lines = plan.dry_run_lines()
    assert lines[0].startswith("release id not known here (it depends on secret values)")
    assert "  + secret HF_TOKEN = {env: HF_TOKEN}" in lines
    assert ("  secret HF_TOKEN: not available here (environment variable HF_TOKEN is not set on this machine); "
            "its value is not compared") in lines
    assert not any("(set)" in line or "(changed)" in line for line in lines)
    assert plan.release_id is None


def test_a_plan_against_a_release_with_the_same_secret_does_not_guess_whether_its_value_changed() -> None:
    loaded = with_token(first_plan()[0])
    before = plan_deploy(loaded, target(), facts(), {"HF_TOKEN": "hf_old"}, False, NOW)
    plan = plan_deploy(loaded, target(), facts(current=deployed(before), active="active"), {}, False, NOW,
                       secrets_not_available={"HF_TOKEN": "environment variable HF_TOKEN is not set on this machine"})
    assert plan.changes == ()
    assert "no changes, unless a secret's value changed" in plan.dry_run_lines()
    known = plan_deploy(loaded, target(), facts(current=deployed(before), active="active"), {"HF_TOKEN": "hf_new"},
                        False, NOW)
    assert [str(change) for change in known.changes] == ["~ secret values: (previous) -> (changed)"]


def test_free_disk_is_read_from_the_nearest_existing_directory() -> None:
    df_out = ("Filesystem     1-blocks      Used Available Capacity Mounted on\n"
              "overlay      270465425408 2254857 2654983168  9% /\n"
              "tmpfs             1048576         0    1048576   0% /srv/small\n")
    assert parse_free_bytes(df_out) == 1048576
    assert parse_free_bytes("") is None


def test_preflight_refuses_a_store_on_a_nearly_full_disk() -> None:
    """Input tried: 1 MiB free under the deploy root."""
    loaded, plan = first_plan()
    with pytest.raises(PreflightError, match="only 1 MiB free"):
        preflight(plan, loaded, target(), replace(facts(plan.release.args), free_bytes=2**20))


def test_gpu_and_checksum_parsers_read_real_output() -> None:
    csv_out = ("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-1, 12.0, 97887, 1024, 250.50, 600.00, 40, "
               "580.82\n1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-2, 12.0, 97887, 0, [N/A], 600.00, 0, "
               "580.82\n")
    gpus, error = parse_gpus(StepResult(Step("g", ("nvidia-smi",)), 0, csv_out, "", 0.0))
    assert error is None and [g.arch for g in gpus or ()] == ["sm120", "sm120"]
    assert gpus and gpus[0].power_draw_w == 250.5 and gpus[1].power_draw_w is None
    sums = parse_sha256sums(f"{'a' * 64}  /opt/x/current/sglang.service\n")
    assert sums == {"sglang.service": "a" * 64}
    assert PurePosixPath("/opt/x/current/sglang.service").name in sums


def test_changing_only_the_benchmark_settings_is_not_a_new_release() -> None:
    loaded, plan = first_plan()
    profile = loaded.profile.model_copy(update={"bench": loaded.profile.bench.model_copy(update={"prompts": 2048})})
    again = plan_deploy(loaded.model_copy(update={"profile": profile}), target(),
                        facts(current=deployed(plan), active="active"), {}, False, NOW)
    assert again.release.id == plan.release.id and again.unchanged


def test_a_model_that_loads_too_long_for_the_start_limit_gets_a_note() -> None:
    """Input tried: three healthy starts of glm5-nvfp4 of 420-450 s in history, against the default 3 restarts in
    900 s: a crash while loading would restart every ~450 s and never reach the start limit."""

    tags = Tags(who="ops@laptop", host="gpu1", release="r0", profile="glm5-nvfp4", profile_hash="h")
    slow = tuple(history_entry("deploy", HEALTHY, tags, NOW, timings={"ready": seconds}) for seconds in (420, 440, 450))
    loaded = PROJECT.profile("glm5-nvfp4")
    host = facts()
    plan = plan_deploy(loaded, target(), replace(host, store=replace(host.store, history=slow)), {}, False, NOW)
    [note] = [note for note in plan.notes if "start_limit_interval_s" in note]
    assert note == ("starts of this profile take 440 s (median): a server that crashes while loading would restart "
                    "every ~450 s, and 3 restarts do not fit in service.start_limit_interval_s (900 s), so systemd "
                    "would never give up; raise it above 1350 s")
    assert not any("start_limit" in note for note in first_plan()[1].notes), "no history, no note"


def test_redeploying_a_release_whose_files_are_damaged_stages_it_again() -> None:
    """Input tried: the current release's release.json garbled on the host, then the same profile deployed."""
    loaded, plan = first_plan()
    damaged = facts(current=deployed(plan), active="active")
    store = replace(damaged.store, releases=(), damaged=(DamagedRelease(plan.release.id, "release.json is not valid "
                                                                                          "JSON (...)"),))
    again = plan_deploy(loaded, target(), replace(damaged, store=store), {}, False, NOW)
    assert not again.unchanged, "a damaged current release is never 'no changes'"
    names = [getattr(step, "name", "") for step in again.batches.stage]
    assert names[-3:] == ["stage: remove the damaged release", "stage: publish", "stage: flush the publish"]
    assert any("is damaged (release.json is not valid JSON" in note for note in again.notes)


def test_the_unit_fact_reads_whether_systemd_needs_a_daemon_reload() -> None:
    def unit(text: str) -> bool:
        return parse_unit(StepResult(Step("u", ("systemctl",)), 0, text, "", 0.0)).need_daemon_reload

    assert unit("ActiveState=active\nNeedDaemonReload=no\n") is False
    loaded = parse_unit(StepResult(Step("u", ("systemctl",)), 0, "Description=SGLang server sglang (unit "
                                   "0123456789abcdef)\n", "", 0.0))
    assert loaded.unit_digest == "0123456789abcdef"
    hand = parse_unit(StepResult(Step("u", ("systemctl",)), 0, "Description=SGLang (mine, release 0)\n", "", 0.0))
    assert hand.unit_digest is None
    assert unit("ActiveState=active\nNeedDaemonReload=yes\n") and unit("ActiveState=active\n"), "unknown reads as yes"


def test_the_unit_file_times_are_read_per_release() -> None:
    """`find releases -name sglang.service -printf '%h %T@\\0'` as GNU find 4.9 prints it."""
    found = "/opt/s d/releases/a1 1733034000.1234567890\0/opt/s d/releases/b2 1733030000.0000000000\0"
    assert parse_unit_times(found) == {"a1": Decimal("1733034000.1234567890"), "b2": Decimal("1733030000")}


def _upgraded(loaded: LoadedProfile) -> LoadedProfile:
    """`loaded` as a later version of the tool reads it: the profile's schema has gained a top-level field and a
    field in a section, each with a default (set nowhere), that decide nothing rendered on the host."""
    from pydantic import Field

    from deploy_lib.profile import Profile, ServiceSpec

    class LaterService(ServiceSpec):
        later_service_setting: int = 7

    class LaterProfile(Profile):
        later_setting: str = "default"
        service: LaterService = Field(default_factory=LaterService)

    later = LaterProfile.model_validate(loaded.profile.model_dump(mode="json", exclude_unset=True))
    assert "later_setting" in later.model_dump() and "later_service_setting" in later.model_dump()["service"]
    return loaded.model_copy(update={"profile": later})


def test_a_tool_upgrade_adding_a_defaulted_profile_field_renders_the_same_release_and_restarts_nothing() -> None:
    """Input tried: the same profile read by a tool whose Profile has two more fields with defaults (issue 41: the
    release id hashes what the host runs, not the profile's whole dump)."""
    loaded, plan = first_plan()
    upgraded = plan_deploy(_upgraded(loaded), target(), facts(), {}, False, NOW)
    assert upgraded.release.id == plan.release.id
    again = plan_deploy(_upgraded(loaded), target(), facts(current=deployed(plan), active="active"), {}, False, NOW)
    assert again.unchanged and again.changes == ()


def _with_id(record: ReleaseRecord, release_id: str) -> ReleaseRecord:
    """`record` as a release written under another id (an earlier version of the tool computed ids otherwise)."""
    tags = {**record.metadata["tags"], "release": release_id}
    return ReleaseRecord(release_id, record.staged_at, {**record.metadata, "id": release_id, "tags": tags})


def test_a_current_release_whose_id_was_computed_the_old_way_but_renders_the_same_is_a_no_op() -> None:
    """Input tried: current is a release of this very profile written under an id an earlier tool computed (its
    files, venv, patches and weights are what the profile renders now); then one whose env file differs, and one
    whose unit file differs (another TimeoutStopSec): those are changes, shown before anything restarts."""
    loaded, plan = first_plan()
    old = _with_id(deployed(plan), "0123456789ab")
    again = plan_deploy(loaded, target(), facts(current=old, active="active"), {}, False, NOW)
    assert again.unchanged and again.changes == () and again.release.id == "0123456789ab"
    assert "no changes" in again.dry_run_lines()
    other_env = _with_id(deployed(plan_deploy(with_profile(loaded, env={"NCCL_DEBUG": "WARN"}), target(), facts(),
                                              {}, False, NOW)), "0123456789ab")
    changed = plan_deploy(loaded, target(), facts(current=other_env, active="active"), {}, False, NOW)
    assert not changed.unchanged and changed.release.id == plan.release.id
    assert [str(c) for c in changed.changes] == ["- env NCCL_DEBUG (was WARN)"]
    other_unit = _with_id(deployed(plan_deploy(with_profile(loaded, service={"stop_timeout_s": 77}), target(),
                                               facts(), {}, False, NOW)), "0123456789ab")
    changed = plan_deploy(loaded, target(), facts(current=other_unit, active="active"), {}, False, NOW)
    assert not changed.unchanged and "~ unit TimeoutStopSec: 77 -> 120" in [str(c) for c in changed.changes]
    assert any("systemctl restart" in line for line in changed.dry_run_lines())


def test_plan_shows_a_change_of_a_unit_setting() -> None:
    """Input tried: service.stop_timeout_s and service.startup_timeout_s changed: each is a line of the plan, as a
    flag's change is (they were a new release id with no change listed)."""
    loaded, plan = first_plan()
    other = with_profile(loaded, service={"stop_timeout_s": 300, "startup_timeout_s": 600})
    changed = plan_deploy(other, target(), facts(current=deployed(plan), active="active"), {}, False, NOW)
    assert [str(c) for c in changed.changes] == ["~ unit TimeoutStartSec: 1800 -> 600",
                                                 "~ unit TimeoutStopSec: 120 -> 300"]


def _step(steps: tuple[Step | object, ...] | list[Step | object], name: str) -> Step:
    return next(step for step in steps if isinstance(step, Step) and step.name == name)


def test_the_old_server_is_given_the_profiles_stop_bound_to_drain_not_a_fixed_wait() -> None:
    """Input tried: service.stop_timeout_s 600 (long generations in flight) deployed over a release of 120, then a
    rollback to that one, and a gpu check's stop. SGLang drains on SIGTERM with no bound of its own; systemd bounds
    it by TimeoutStopSec= and SIGKILLs after as long again: the tool's restart and stop steps wait for that, not the
    60 s every other step gets."""
    from deploy_lib.deploy.plan import RESTART, STOP_SLACK_S, stop_wait_s

    loaded, plan = first_plan()
    assert _step(plan.batches.switch.activate, RESTART).timeout_s == 2 * 120 + STOP_SLACK_S
    patient = with_profile(loaded, service={"stop_timeout_s": 600})
    host = facts(current=deployed(plan), active="active")
    longer = plan_deploy(patient, target(), host, {}, False, NOW)
    assert "TimeoutStopSec=600" in longer.release.unit_text
    assert _step(longer.batches.switch.activate, RESTART).timeout_s == stop_wait_s(600) == 1230
    # back to 120 from a current release of 600: the loaded unit's bound still holds while it stops
    on_longer = facts(current=deployed(longer), active="active")
    back = plan_deploy(loaded, target(), on_longer, {}, False, NOW)
    assert _step(back.batches.switch.activate, RESTART).timeout_s == stop_wait_s(600)
    both = replace(on_longer, store=replace(on_longer.store, releases=(deployed(plan), deployed(longer))))
    rollback = recorded_switch(StoreLayout("sglang"), both, plan.release.id)
    assert _step(rollback.activate, RESTART).timeout_s == stop_wait_s(600)
    checked = with_profile(patient, preflight={"gpu_check": True})
    with_check = plan_deploy(checked, target(), facts(venv_versions={"torch_version": "2.9.1",
                                                                     "nccl_version": "2.27.3"}), {}, False, NOW)
    assert _step(with_check.batches.gpu_check, "systemd: stop").timeout_s == stop_wait_s(600)


def test_a_recorded_release_s_stop_bound_is_its_unit_s_or_its_profile_s() -> None:
    """Input tried: a release.json with the unit's settings, one written before they were recorded (the profile's
    service.stop_timeout_s), and one with neither (the default)."""
    from deploy_lib.deploy.plan import recorded_stop_timeout_s, stop_bound_s

    assert recorded_stop_timeout_s({"unit": {"TimeoutStopSec": "300"}, "profile": {}}) == 300
    assert recorded_stop_timeout_s({"profile": {"service": {"stop_timeout_s": 45}}}) == 45
    assert recorded_stop_timeout_s({}) == recorded_stop_timeout_s(None) == 120
    assert stop_bound_s({"unit": {"TimeoutStopSec": "300"}}, None, {"unit": {"TimeoutStopSec": "30"}}) == 300
