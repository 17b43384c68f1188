"""Why did the server not start? A table of startup-failure signatures matched against the unit's journal.

The table is data. Order is priority: the first signature that matches any line wins, and it is ordered so
a root cause beats the errors it triggers (an architecture or memory error surfaces again as "Capture cuda
graph failed"; one rank that dies leaves the other ranks in an NCCL timeout and trips the watchdog).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from deploy_lib.remote import Step

UNKNOWN_TAIL_LINES = 30
MAX_EVIDENCE_LINES = 8
PROFILE_IN_HINT = "{profile}"  # replaced by the failed release's profile name
SERVER_ARGS_PREVIEW_CHARS = 200


@dataclass(frozen=True)
class Signature:
    """One known failure: a regex over single log lines; `cause` may use the regex's named groups."""

    name: str
    pattern: re.Pattern[str]
    cause: str
    hint: str


@dataclass(frozen=True)
class Diagnosis:
    """The verdict: a one-line cause, what to do, and the log lines that show it."""

    signature: str
    cause: str
    hint: str
    evidence: tuple[str, ...]

    def one_line(self) -> str:
        return f"{self.cause} [{self.signature}]"


def _signature(name: str, pattern: str, cause: str, hint: str) -> Signature:
    return Signature(name, re.compile(pattern), cause, hint)


MISSING_VENV_HINT = ("restore or rebuild the venv (`invoke venv.build` for a locked one), or roll back to a release "
                     "whose venv is present (`invoke releases`)")
SIGNATURES: tuple[Signature, ...] = (
    # The NCCL check a deploy runs before the start (preflight.gpu_check): lines of its report, never a server's
    # journal; first, because a failed rank's line quotes NCCL's and CUDA's errors that later signatures match.
    _signature(
        "nccl_check",
        r"^gpu-check: (?P<detail>(?:verification failed at|error:|hang:|all-reduce not run:) .+|all-reduce check "
        r"FAILED)",
        "the NCCL check before the start failed: {detail}",
        "SGLang was not started: this release's NCCL settings (nccl.*, NCCL_* in env) or its venv's torch/NCCL do "
        "not work on this host; `invoke gpu-check --profile {profile}` runs the check alone, with advice from the "
        "GPUs' topology",
    ),
    # systemd could not even start the interpreter (status 203/EXEC): the venv was removed or moved.
    _signature(
        "missing_venv",
        r"Failed to locate executable (?P<detail>/[^:]+): No such file or directory",
        "the release's venv is gone: {detail} does not exist (systemd status 203/EXEC)",
        MISSING_VENV_HINT,
    ),
    # the same, for a release's launcher: sh could not exec the venv's python (dash: "exec: PATH: not found", 127)
    _signature(
        "missing_venv",
        r": exec: (?P<detail>/.+): not found$",
        "the release's venv is gone: {detail} does not exist (the launcher's exec failed, exit status 127)",
        MISSING_VENV_HINT,
    ),
    # Launch-line and environment errors stop the start before any GPU work, so nothing else can explain them.
    _signature(
        "unrecognized_arguments",
        r"error: unrecognized arguments: (?P<detail>.+)",
        "the installed SGLang does not know these flags: {detail}",
        "flags are renamed between SGLang versions (e.g. --nsa-*-backend became --dsa-*-backend); "
        "deploy a profile rendered for the version in this venv",
    ),
    _signature(
        "invalid_argument",
        r"error: argument (?P<detail>--[\w/-]+: (?:invalid .*|expected .*))",
        "the installed SGLang rejects a flag value: {detail}",
        "use a value listed in the error for this SGLang version",
    ),
    _signature(
        "address_in_use",
        r"address already in use|\[Errno 98\]|Port is already in use|(?P<detail>\w+ at \d+) is not available in \d+ s",
        "a port the server needs is held by another process",
        "find the holder with `ss -ltnp` on the host; another server (or a stale one of ours) still runs",
    ),
    _signature(
        "model_not_found_offline",
        r"is not a local folder and is not a valid model identifier|outgoing traffic has been disabled"
        r"|We couldn't connect to 'https://huggingface\.co'|OfflineModeIsEnabled|Can't load tokenizer for"
        r"|Repo id must be in the form|Incorrect path_or_model_id",
        "the model or its tokenizer is not on the host, and the hub is not reachable (offline)",
        "check that model.path (and tokenizer) exist on the host as an absolute path, or download them into "
        "the host's HF_HOME before deploying; HF_HUB_OFFLINE=1 forbids downloads",
    ),
    # Gates and architecture errors: they also appear inside "Capture cuda graph failed: ...", so they go first.
    _signature(
        "fusion_gate",
        r"FlashInfer allreduce fusion (?P<detail>requires SM90 or SM10X NVIDIA GPUs|does not support multi-node"
        r"[^.]*|trtllm backend supports single-node only)",
        "SGLang's FlashInfer allreduce-fusion gate rejects this setup: {detail}",
        "turn features.allreduce_fusion off, or on SM120 run `invoke patch-fusion --enable --profile {profile}` "
        "(single node only)",
    ),
    _signature(
        "ninja_not_found",
        r"No such file or directory: 'ninja'",
        "FlashInfer's JIT could not run `ninja`: it is not on the server's PATH",
        "FlashInfer builds kernels by running `ninja` by name (flashinfer/jit/cpp_ext.py); it comes from the `ninja` "
        "package in the venv (a dependency of flashinfer-python that a --no-deps install misses): install it into "
        "the venv; the rendered env file puts the venv's bin/ first on PATH",
    ),
    _signature(
        "flashinfer_jit_arch",
        r"No supported CUDA architectures found for major versions \[(?P<detail>[\d, ]+)\]",
        "a FlashInfer JIT module is built only for SM major versions [{detail}], not this GPU",
        "FlashInfer's TRT-LLM allreduce fusion is gated to SM90/SM100 before 0.6.17: turn allreduce fusion off, "
        "use FlashInfer >= 0.6.17, or `invoke patch-fusion --enable --profile {profile}`",
    ),
    # "Unsupported architecture: NAME" is a model config's refusal of a model class, not a GPU's: SGLang 0.5.23's
    # InternVL config raises it for an llm_config it does not know (srt/configs/internvl.py:328). A kernel's error
    # ends with the two words (FlashInfer's fmhaRunner.cuh: "...: Unsupported architecture").
    _signature(
        "model_architecture_unsupported",
        r"Unsupported architecture: (?P<detail>\w+)",
        "the model's config names a model class this SGLang's config does not support: {detail}",
        "not a GPU problem: the model's config.json (for InternVL, its llm_config.architectures) names that class; "
        "use a model whose architecture this SGLang supports, or an SGLang version that supports it",
    ),
    _signature(
        "unsupported_arch_kernel",
        r"Unsupported architecture(?!: \w)|no kernel image is available for execution on the device",
        "a kernel in this build does not support this GPU's architecture",
        "pick a backend this GPU supports (on SM120, e.g., not the trtllm attention/DSA backends) or a build "
        "with kernels for it",
    ),
    # Memory: a root cause of graph-capture failures and of the other ranks' NCCL timeouts.
    _signature(
        "cuda_out_of_memory",
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation",
        "CUDA out of memory while starting",
        "lower memory.mem_fraction_static (--mem-fraction-static, e.g. by 0.05) or the CUDA graph batch size; "
        "check nvidia-smi for another process holding GPU memory",
    ),
    # A kernel that faults while serving (one batch shape, a backend bug); its rank's death then times out the others.
    _signature(
        "cuda_runtime_error",
        r"CUDA error: (?P<detail>an illegal memory access was encountered|an illegal instruction was encountered"
        r"|misaligned address|unspecified launch failure|device-side assert triggered)",
        "a CUDA kernel failed while running: {detail}",
        "often one batch shape or one backend: the traceback names the kernel; try another attention/MoE backend "
        "or disable CUDA graphs to narrow it down, and report it upstream with the log",
    ),
    _signature(
        "kv_cache_too_small",
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        "the weights left no room for the KV cache",
        "raise memory.mem_fraction_static, shorten the context length, or use more GPUs (larger TP)",
    ),
    _signature(
        "host_out_of_memory",
        r"killed by the OOM killer|oom-kill",
        "the kernel's OOM killer killed the server (host RAM, not GPU memory)",
        "free host memory or lower what the server holds in RAM (e.g. fewer tokenizer workers, no CPU offload)",
    ),
    # NCCL: a broken peer-to-peer path is the cause; a collective timeout is often its symptom.
    _signature(
        "nccl_p2p",
        r"peer access is not supported|failed to open CUDA IPC handle|ncclUnhandledCudaError|ncclSystemError"
        r"|ncclInternalError|NCCL error in:.*(?:unhandled cuda error|unhandled system error|internal error)",
        "NCCL could not set up GPU peer-to-peer communication",
        "set nccl.p2p_level (NCCL_P2P_LEVEL, e.g. PHB or SYS) or nccl.p2p_disable; on a VM, peer-to-peer needs "
        "the IOMMU and PCIe ACS set up for it",
    ),
    _signature(
        "rendezvous",
        r"(?P<detail>Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined"
        r"|The client socket has timed out after \d+m?s while trying to connect to .+?)\.?$",
        "the nodes of a multi-node release did not all meet at --dist-init-addr: {detail}",
        "every node must start (a multi-node release is deployed to its group: --group G), and node 0's "
        "--dist-init-addr port must be reachable from the other nodes (firewall, address)",
    ),
    _signature(
        "nccl_timeout",
        r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out"
        r"|ProcessGroupNCCL's watchdog got stuck",
        "an NCCL collective timed out: the ranks stopped talking to each other",
        "check NCCL_P2P_LEVEL and the IOMMU/ACS setup for peer-to-peer, and whether one rank died first "
        "(its own error is earlier in the log)",
    ),
    _signature(
        "cuda_graph_capture",
        r"Capture cuda graph failed(?P<detail>: .+)?",
        "capturing CUDA graphs failed{detail}",
        "lower memory.mem_fraction_static or the CUDA graph max batch size; as a last resort disable CUDA graphs",
    ),
    _signature(
        "watchdog_timeout",
        r"(?P<detail>\w+) watchdog timeout \(self\.watchdog_timeout=",
        "SGLang's {detail} watchdog fired: a step made no progress within --watchdog-timeout",
        "the server hung (often in a collective or a kernel); look at the lines before the watchdog message",
    ),
)


def _cause(signature: Signature, match: re.Match[str]) -> str:
    groups = {"detail": ""} | {k: v.strip() for k, v in match.groupdict().items() if v}
    return signature.cause.format(**groups).rstrip(": ")


def diagnose(journal_lines: Iterable[str], signatures: Sequence[Signature] = SIGNATURES,
             profile: str | None = None) -> Diagnosis:
    """The first signature (in table order) that matches, with its matching lines; else the log's tail.
    A hint that names a command names `profile`, the failed release's, so following it acts on that profile."""
    lines = [line.rstrip("\n") for line in journal_lines]
    for signature in signatures:
        matches = [(line, m) for line in lines if (m := signature.pattern.search(line))]
        if matches:
            evidence = tuple(dict.fromkeys(line.strip() for line, _ in matches))[:MAX_EVIDENCE_LINES]
            hint = signature.hint.replace(PROFILE_IN_HINT, profile or "PROFILE")
            return Diagnosis(signature.name, _cause(signature, matches[0][1]), hint, evidence)
    if not any(line.strip() for line in lines):
        return Diagnosis("unknown", "the server logged nothing since the restart",
                         "run the unit's ExecStart by hand on the host to see why it does not start", ())
    return Diagnosis("unknown", "no known failure signature in the log; its last lines are below",
                     "read the evidence; add a signature to deploy_lib/facts/diagnose.py once the cause is known",
                     tuple(lines[-UNKNOWN_TAIL_LINES:]))


def shorten_log_line(line: str) -> str:
    """SGLang logs its whole `server_args=ServerArgs(...)` (~10 KB) on one line at startup; failure output shows
    its start only and says where the rest is."""
    if "server_args=ServerArgs(" in line and len(line) > SERVER_ARGS_PREVIEW_CHARS:
        return f"{line[:SERVER_ARGS_PREVIEW_CHARS]}... (full line: `invoke logs`)"
    return line


def unit_matches(unit: str) -> tuple[str, ...]:
    """journalctl's matches for the unit's messages, for every read of its journal (diagnosis, cursor, the probe's
    newest line, logs): -u's (systemd 252, add_matches_for_unit), but UNIT= from any process, not only PID 1.
    systemd's exec child writes "Failed to locate executable" with UNIT= and exits at once, and journald cannot
    give a message the unit (_SYSTEMD_UNIT) of a process that is gone before the message is read."""
    return (f"_SYSTEMD_UNIT={unit}", "+", f"UNIT={unit}", "+", f"COREDUMP_UNIT={unit}", "+",
            f"OBJECT_SYSTEMD_UNIT={unit}")


def journal_argv(unit: str, max_lines: int, *options: str) -> tuple[str, ...]:
    """journalctl for the unit's own messages (text only), at most the newest `max_lines`, then `options`.
    Run it with sudo: reading a system unit's journal needs root or the systemd-journal group."""
    return ("journalctl", "-o", "cat", "--no-pager", "-q", "-n", str(max_lines), *options, *unit_matches(unit))


def journal_step(unit: str, after_cursor: str | None = None, max_lines: int = 2000) -> Step:
    """Read the unit's journal (messages only) since `after_cursor`, for `diagnose`."""
    after = (f"--after-cursor={after_cursor}",) if after_cursor else ()
    return Step(name=f"read {unit} journal", argv=journal_argv(unit, max_lines, *after), sudo=True, timeout_s=30)


# journald takes messages from its socket asynchronously: a failed exec's own line ("Failed to locate executable")
# may still be queued when the unit's exit status is already known; --sync returns once queued messages are written
JOURNAL_SYNC = Step(name="journal: sync", argv=("journalctl", "--sync"), sudo=True, ok=frozenset({0, 1}), timeout_s=30)


def journal_cursor_step(unit: str) -> Step:
    """The unit's newest journal entry as JSON; read before a restart so later reads start after it."""
    return Step(name=f"read {unit} journal cursor", sudo=True, timeout_s=30,
                argv=("journalctl", "-n", "1", "-o", "json", "--no-pager", "-q", *unit_matches(unit)))


def parse_journal_cursor(stdout: str) -> str | None:
    """The __CURSOR of `journal_cursor_step`'s output; None when the unit has no journal yet."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        cursor = json.loads(lines[-1]).get("__CURSOR")
    except ValueError:
        return None
    return cursor if isinstance(cursor, str) and cursor else None
