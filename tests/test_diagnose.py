"""Startup-failure diagnosis on real log excerpts (tests/data/logs: one file per signature, see its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy_lib.facts.diagnose import (
    PROFILE_IN_HINT,
    SIGNATURES,
    UNKNOWN_TAIL_LINES,
    diagnose,
    journal_cursor_step,
    journal_step,
    parse_journal_cursor,
    shorten_log_line,
    unit_matches,
)

LOGS = Path(__file__).parent / "data" / "logs"
LOG_FILES = sorted(LOGS.glob("*.log"))


def lines_of(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.mark.parametrize("log", LOG_FILES, ids=lambda path: path.name)
def test_each_real_log_is_diagnosed_as_its_signature(log: Path) -> None:
    expected = log.name.split(".")[0]
    diagnosis = diagnose(log.read_text().splitlines())
    assert diagnosis.signature == expected
    assert diagnosis.cause and diagnosis.hint
    assert diagnosis.evidence


def test_every_signature_has_a_real_log() -> None:
    covered = {log.name.split(".")[0] for log in LOG_FILES}
    assert {signature.name for signature in SIGNATURES} | {"unknown"} == covered


@pytest.mark.parametrize(("log", "cause", "evidence"), [
    ("fusion_gate.sglang-0.5.23.log",
     "SGLang's FlashInfer allreduce-fusion gate rejects this setup: requires SM90 or SM10X NVIDIA GPUs",
     "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."),
    ("flashinfer_jit_arch.sglang-0.5.7.log",
     "a FlashInfer JIT module is built only for SM major versions [9, 10], not this GPU",
     "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."),
    ("unrecognized_arguments.sglang-0.5.23.log",
     "the installed SGLang does not know these flags: --nsa-decode-backend trtllm --nsa-prefill-backend trtllm",
     "sglang serve: error: unrecognized arguments: --nsa-decode-backend trtllm --nsa-prefill-backend trtllm"),
    ("invalid_argument.log",
     "the installed SGLang rejects a flag value: --tokenizer-mode: invalid choice: 'fast' (choose from 'auto', "
     "'slow')", None),
    ("cuda_graph_capture.triton-ptxas.log",
     "capturing CUDA graphs failed: Internal Triton PTX codegen error", None),
    ("watchdog_timeout.log",
     "SGLang's Scheduler watchdog fired: a step made no progress within --watchdog-timeout",
     "[2026-11-29 12:45:19 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"),
    ("model_architecture_unsupported.internvl-0.5.23.log",
     "the model's config names a model class this SGLang's config does not support: Phi3ForCausalLM",
     "ValueError: Unsupported architecture: Phi3ForCausalLM"),
    ("unsupported_arch_kernel.log", "a kernel in this build does not support this GPU's architecture", None),
    ("kv_cache_too_small.log", "the weights left no room for the KV cache",
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
     "Current value: mem_fraction_static=0.55"),
])
def test_the_cause_names_what_the_log_says(log: str, cause: str, evidence: str | None) -> None:
    diagnosis = diagnose(lines_of(log))
    assert diagnosis.cause == cause
    if evidence is not None:
        assert evidence in diagnosis.evidence


def test_a_missing_venv_is_named_as_the_cause_of_203_exec() -> None:
    diagnosis = diagnose(lines_of("missing_venv.systemd-252.log"))
    assert diagnosis.cause == ("the release's venv is gone: /opt/ml-env-old/bin/python3 does not exist "
                               "(systemd status 203/EXEC)")
    assert "venv.build" in diagnosis.hint


def test_a_missing_venv_is_named_as_the_cause_when_the_launcher_cannot_exec_it() -> None:
    diagnosis = diagnose(lines_of("missing_venv.launcher-dash.log"))
    assert diagnosis.cause == ("the release's venv is gone: /opt/ml-env-old/bin/python3 does not exist "
                               "(the launcher's exec failed, exit status 127)")
    assert "venv.build" in diagnosis.hint


def test_the_server_args_line_is_shortened_in_failure_output() -> None:
    """SGLang's one-line ServerArgs dump is ~10 KB; failure output keeps 200 characters and says where the rest is."""
    line = next(line for line in lines_of("fusion_gate.sglang-0.5.23.log") if "server_args=" in line)
    long_line = line.replace("...)", ", ".join(f"option_{i}=None" for i in range(600)) + ")")
    assert len(long_line) > 10_000
    shown = shorten_log_line(long_line)
    assert shown == long_line[:200] + "... (full line: `invoke logs`)"
    short = "[2026-11-29 11:02:05 TP0] Load weight begin."
    assert shorten_log_line(short) == short


def test_an_architecture_error_wins_over_the_graph_capture_failure_that_reports_it() -> None:
    lines = lines_of("flashinfer_jit_arch.sglang-0.5.7.log")
    assert any("Capture cuda graph failed" in line for line in lines)
    assert diagnose(lines).signature == "flashinfer_jit_arch"


def test_out_of_memory_wins_over_the_graph_capture_failure_and_other_ranks_timing_out() -> None:
    # One rank runs out of memory while capturing; the ranks still waiting for it time out in NCCL.
    lines = lines_of("cuda_out_of_memory.graph-capture.log") + lines_of("nccl_timeout.log")
    diagnosis = diagnose(lines)
    assert diagnosis.signature == "cuda_out_of_memory"
    assert "--mem-fraction-static" in diagnosis.hint
    assert any(line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB")
               for line in diagnosis.evidence)


def test_a_broken_p2p_path_wins_over_the_timeouts_and_watchdog_it_causes() -> None:
    lines = lines_of("nccl_p2p.nccl-init.log") + lines_of("nccl_timeout.log") + lines_of("watchdog_timeout.log")
    diagnosis = diagnose(lines)
    assert diagnosis.signature == "nccl_p2p"
    assert "NCCL_P2P_LEVEL" in diagnosis.hint and "IOMMU" in diagnosis.hint
    assert "Cuda failure 217 'peer access is not supported between these two devices'" in diagnosis.evidence


def test_evidence_keeps_each_line_once_even_when_every_rank_prints_it() -> None:
    diagnosis = diagnose(lines_of("fusion_gate.sglang-0.5.23.log"))
    assert diagnosis.evidence.count("ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.") == 1


def test_a_hint_that_names_a_command_names_the_profile_that_failed() -> None:
    """Input tried: the fusion gate failing for a Qwen profile (the hint said `invoke patch-fusion --enable`,
    which deployed the GLM-5 default profile over it)."""
    diagnosis = diagnose(lines_of("fusion_gate.sglang-0.5.23.log"), profile="qwen3-fusion")
    assert "`invoke patch-fusion --enable --profile qwen3-fusion`" in diagnosis.hint
    assert "glm5" not in diagnosis.hint and "{profile}" not in diagnosis.hint


def test_both_port_conflicts_are_reported_as_address_in_use() -> None:
    for log in ("address_in_use.http-port.log", "address_in_use.zmq-port.log"):
        diagnosis = diagnose(lines_of(log))
        assert diagnosis.signature == "address_in_use"
        assert "ss -ltnp" in diagnosis.hint


def test_an_unknown_failure_shows_the_last_thirty_lines() -> None:
    noise = [f"[2026-11-29 13:19:{i:02d} TP0] step {i}" for i in range(40)]
    lines = noise + lines_of("unknown.segfault.log")
    diagnosis = diagnose(lines)
    assert diagnosis.signature == "unknown"
    assert len(diagnosis.evidence) == UNKNOWN_TAIL_LINES
    assert diagnosis.evidence[-1] == "sglang.service: Failed with result 'core-dump'."


def test_an_empty_journal_says_the_server_logged_nothing() -> None:
    diagnosis = diagnose([])
    assert diagnosis.signature == "unknown" and "logged nothing" in diagnosis.cause


def test_the_one_line_summary_names_cause_and_signature() -> None:
    summary = diagnose(lines_of("kv_cache_too_small.log")).one_line()
    assert summary == "the weights left no room for the KV cache [kv_cache_too_small]"


def test_journal_steps_read_only_this_start() -> None:
    step = journal_step("sglang.service", after_cursor="s=0a1b;i=3f2")
    # UNIT= from any process: the exec child's "Failed to locate executable" line carries no _SYSTEMD_UNIT when the
    # child exited before journald read it (a CI run's missing-venv diagnosis came out 'unknown')
    assert step.argv == ("journalctl", "-o", "cat", "--no-pager", "-q", "-n", "2000", "--after-cursor=s=0a1b;i=3f2",
                         "_SYSTEMD_UNIT=sglang.service", "+", "UNIT=sglang.service", "+",
                         "COREDUMP_UNIT=sglang.service", "+", "OBJECT_SYSTEMD_UNIT=sglang.service")
    assert step.sudo
    cursor = journal_cursor_step("sglang.service")
    # the cursor read before a restart is the newest entry of the same matches the later reads use
    assert cursor.argv == ("journalctl", "-n", "1", "-o", "json", "--no-pager", "-q",
                           *unit_matches("sglang.service"))
    assert step.argv[-len(unit_matches("sglang.service")):] == unit_matches("sglang.service")
    entry = {"__CURSOR": "s=0a1b;i=3f2", "MESSAGE": "sglang.service: Consumed 2.1s CPU time."}
    assert parse_journal_cursor(json.dumps(entry) + "\n") == "s=0a1b;i=3f2"
    assert parse_journal_cursor("") is None
    assert parse_journal_cursor("-- No entries --\n") is None


def test_no_hint_carries_a_placeholder_it_cannot_fill() -> None:
    """Only {profile} is filled in a hint; a regex group's name there would be printed as is."""
    assert all("{" not in signature.hint.replace(PROFILE_IN_HINT, "") for signature in SIGNATURES)
