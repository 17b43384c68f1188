"""`python -m sglang.launch_server ARGS` in the sandbox: startup phases, gates, faults, serving, drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from sglang_sim import startup_texts as texts
from sglang_sim.argcheck import RESULT_MARKER
from sglang_sim.compile_caches import CacheLayout, CompileCache, KernelSet, uses_deep_gemm
from sglang_sim.config import SimConfig
from sglang_sim.engine import Engine, Launch
from sglang_sim.gpus import Gpu, query_gpus
from sglang_sim.rendezvous import Rendezvous, RendezvousFailed, Topology
from sglang_sim.server import ServerState, SimHTTPServer, Status, log
from sglang_sim.startup_texts import LogStyle
from sglang_sim.throughput import MemoryNeed, ThroughputModel
from sglang_sim.upstream import JIT_MESSAGE, RESOLVER_MESSAGE, Fusion, InstalledUpstream, line_of
from sglang_sim.weights import OFFLINE_MESSAGE, missing_weights, read_shard, shard_files, snapshot_dir

GIB = 1024.0
TORCH_MODULE_TO = (Path(sys.prefix) / "lib/python3.11/site-packages/torch/nn/modules/module.py", "to")


def parse_launch_args(argv: list[str]) -> dict[str, Any]:
    """Parse with the installed SGLang's parser in a child process; exit 2 with its message if it refuses."""
    checked = subprocess.run([sys.executable, "-m", "sglang_sim.argcheck"], input=json.dumps(argv),
                             capture_output=True, text=True)
    if checked.returncode != 0:
        sys.stderr.write(checked.stderr)
        sys.exit(checked.returncode)
    line = next(line for line in checked.stdout.splitlines() if line.startswith(RESULT_MARKER))
    return json.loads(line[len(RESULT_MARKER):])


class Simulation:
    def __init__(self, launch: Launch, config: SimConfig, upstream: InstalledUpstream, gpus: list[Gpu]) -> None:
        self.launch = launch
        self.config = config
        self.upstream = upstream
        self.gpus = gpus
        self.model = ThroughputModel.default()
        self.stop = threading.Event()
        self.state_file = config.state_dir / f"{launch.port}.json"
        self.memory_used_mib = 0
        self.engine: Engine | None = None
        self.topology = Topology.from_args(launch.server_args)
        self.nnodes = self.topology.nnodes if self.topology else 1
        self.node_rank = self.topology.node_rank if self.topology else 0
        pipeline = int(launch.server_args.get("pp_size") or 1)
        self.gpus_per_node = max(1, launch.tp_size * pipeline // self.nnodes)
        self.rank = f"TP{self.node_rank * self.gpus_per_node}"  # the first TP rank of this node, as SGLang logs it
        self.style = LogStyle.of(upstream.sglang_dir)
        self.cache_layout = CacheLayout.of(upstream.sglang_dir)

    # --- state for the nvidia-smi stand-in ----------------------------------
    def write_state(self) -> None:
        running = self.engine.running if self.engine else 0
        fused = self.engine.fused_on_sm120 if self.engine else False
        state = {"pid": os.getpid(), "gpus": list(range(self.gpus_per_node)),
                 "memory_used_mib": self.memory_used_mib,
                 "power_w": round(self.model.power_w(running, fused, self.launch.knobs), 2),
                 "util_pct": round(100 * self.model.load(running, fused, self.launch.knobs))}
        try:
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(state))
            tmp.replace(self.state_file)
        except OSError:
            pass  # a hardened unit may not be allowed to write there; nvidia-smi then shows idle GPUs

    def state_loop(self) -> None:
        while not self.stop.wait(0.5):
            self.write_state()

    def exit(self, code: int) -> NoReturn:
        self.state_file.unlink(missing_ok=True)
        sys.stdout.flush()
        os._exit(code)

    def crash(self, frames: list[tuple[Path, str]], exception: str) -> NoReturn:
        """Scheduler exception as SGLang prints it, then the launcher's own message; exit 1.

        Each frame is (file, function); its line is that of `def function` in the installed file.
        """
        lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
        for path, function in frames:
            lines.append(f'  File "{path}", line {line_of(path, f"def {function}(")}, in {function}')
        lines.append(exception)
        log("\n".join(lines), self.rank)
        log("Received sigquit from a child process. It usually means the child failed.")
        self.exit(1)

    def phase(self, name: str, parts: int = 1) -> None:
        """Wait out one startup phase (or 1/parts of it); SIGTERM while loading ends the process cleanly."""
        if self.stop.wait(self.config.phases_s[name] / parts):
            log("Received SIGTERM while loading; exiting.")
            self.exit(0)

    def avail_mib(self) -> float:
        return self.gpus[0].memory_mib - self.memory_used_mib

    def gib_avail(self) -> str:
        return texts.gb(self.avail_mib())

    # --- startup -------------------------------------------------------------
    def load(self, fusion: Fusion) -> None:
        srt = self.upstream.sglang_dir / "srt"
        total = self.gpus[0].memory_mib
        log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in self.launch.server_args.items())})")
        if missing_weights(self.launch.model_path, self.launch.server_args.get("revision"), os.environ):
            config = srt / "utils/hf_transformers/config.py"  # 0.5.23; hf_transformers_utils.py before
            self.crash([(config if config.is_file() else srt / "utils/hf_transformers_utils.py", "get_config")],
                       OFFLINE_MESSAGE)
        log("Init torch distributed begin.", self.rank)
        if self.topology is not None:
            self.rendezvous(self.topology, srt)
        init_started = time.perf_counter()
        self.phase("init")
        self.memory_used_mib = 580
        log(texts.init_distributed_end(self.style, time.perf_counter() - init_started, 580), self.rank)
        log(texts.load_weight_begin(self.avail_mib()), self.rank)
        if self.config.has_fault("hang-loading"):
            self.stop.wait()
            self.exit(0)
        weights_mib = int(total * 0.55)
        elapsed_s = self.load_weights(srt, weights_mib)
        quantization = self.launch.server_args.get("quantization")
        log(texts.load_weight_end(self.style, elapsed_s, self.config.architecture, quantization,
                                  self.avail_mib(), weights_mib), self.rank)
        self.phase("kv_cache")
        self.memory_used_mib = int(total * self.launch.mem_fraction_static)
        log(texts.kv_cache_allocated(self.style, self.max_total_num_tokens(),
                                     self.memory_used_mib - 580 - weights_mib), self.rank)
        log(texts.memory_pool_end(self.avail_mib()), self.rank)
        if fusion is Fusion.CRASH_RESOLVER:
            module = self.upstream.fusion_module
            self.crash([(srt / "managers/scheduler.py", "run_scheduler_process"),
                        (srt / "model_executor/model_runner.py", "_pre_initialize_flashinfer_allreduce_workspace"),
                        (module, "ensure_workspace_initialized"), (module, "_resolve_backend")],
                       f"ValueError: {RESOLVER_MESSAGE}")
        if fusion is Fusion.SKIPPED:
            log("FlashInfer workspace preflight probe failed on at least one rank "
                "(cuMulticastGetGranularity failed for FlashInfer workspace preflight). "
                "Skipping allreduce fusion.", self.rank)
        knobs = self.launch.knobs
        need = self.model.memory_need(knobs, total)
        capture_started = time.perf_counter()
        if knobs.decode_cuda_graph:
            log(texts.capture_decode_begin(self.style, self.launch.server_args.get("cuda_graph_backend_decode")
                                           or "full", self.avail_mib()), self.rank)
        self.compile_kernels()  # without decode graphs the first forward passes build them just the same
        if knobs.decode_cuda_graph:
            self.phase("cuda_graph")
        if not need.fits:
            self.out_of_memory(need, srt)
        if fusion is Fusion.CRASH_JIT:
            jit = self.upstream.jit_module
            assert jit is not None  # the JIT gate was read from it
            context = jit.parent.parent / "compilation_context.py"
            self.crash([(srt / "model_executor/model_runner.py", "init_device_graphs"),
                        (jit, "gen_trtllm_comm_module"), (context, "get_nvcc_flags_list")],
                       f"Exception: Capture cuda graph failed: RuntimeError: {JIT_MESSAGE}")
        if fusion is Fusion.FUSED:
            self.jit_build("trtllm_comm", [(srt / "model_executor/model_runner.py", "init_device_graphs")])
        if knobs.decode_cuda_graph:
            self.memory_used_mib = min(total, self.memory_used_mib + int(self.model.cuda_graph_mib))
            log(texts.capture_decode_end(self.style, knobs.cuda_graph_max_bs, time.perf_counter() - capture_started,
                                         self.model.cuda_graph_mib, self.avail_mib()), self.rank)
        if self.config.has_fault("nccl-timeout"):
            self.nccl_timeout()
        log(f"max_total_num_tokens={self.max_total_num_tokens()}, chunked_prefill_size={knobs.chunked_prefill_size}, "
            f"max_prefill_tokens={knobs.max_prefill_tokens}, max_running_requests={self.launch.max_running_requests}, "
            f"context_len={self.config.context_length}, available_gpu_mem={self.gib_avail()}", self.rank)

    def load_weights(self, srt: Path, weights_mib: int) -> float:
        """Read every shard from disk, then the modelled copy of its share to the GPUs (phases_s["weights"]: what a
        warm page cache cannot save); seconds taken. Without shards (a model the sim has no files of) only the copy."""
        snapshot = snapshot_dir(self.launch.model_path, self.launch.server_args.get("revision"), os.environ)
        shards = shard_files(snapshot)
        steps = max(1, len(shards))
        started = time.perf_counter()
        if shards:
            sys.stderr.write(texts.shard_progress(self.style, 0, len(shards), 0.0))
        for done in range(1, steps + 1):
            if shards and not read_shard(shards[done - 1], self.stop):
                log("Received SIGTERM while loading; exiting.")
                self.exit(0)
            self.phase("weights", steps)
            self.memory_used_mib = 580 + weights_mib * done // steps
            if shards:
                sys.stderr.write(texts.shard_progress(self.style, done, len(shards), time.perf_counter() - started))
                sys.stderr.flush()
            if done == (steps + 1) // 2 and self.config.has_fault("oom"):
                total = self.gpus[0].memory_mib
                self.crash([(srt / "managers/scheduler.py", "run_scheduler_process"),
                            (srt / "model_executor/model_runner.py", "load_model"), TORCH_MODULE_TO],
                           "torch.OutOfMemoryError: " + texts.cuda_out_of_memory(2048, total, 1.06 * GIB))
        if shards and self.style is not LogStyle.V0_5_9:
            sys.stderr.write("\n")  # tqdm's close: 0.5.23's bar has no newline of its own
        return time.perf_counter() - started

    def compile_kernels(self) -> None:
        """The capture's first forward passes build the kernels: DeepGEMM's (logged at every start, on SM90/SM100)
        and Triton's (silent); each costs its modelled time only when its cache is cold, then leaves it warm."""
        kernels = KernelSet(self.config.architecture, self.launch.tp_size)
        caches = [CompileCache.TRITON]
        if uses_deep_gemm(self.gpus[0].compute_major, os.environ):
            for line in texts.deep_gemm_precompile("GEMM_NT_F8F8BF16", 7168, 2048):
                log(line, self.rank)
            caches.append(CompileCache.DEEP_GEMM)
        for cache in caches:
            directory = self.cache_layout.directory(cache, os.environ)
            if not kernels.is_warm(directory):
                self.phase(cache.value)
                kernels.mark_warm(directory)

    def out_of_memory(self, need: MemoryNeed, srt: Path) -> NoReturn:
        """--mem-fraction-static left too little beside the static pool: torch's OOM while capturing the decode
        graphs (SGLang re-raises it with its advice), or in the eager warmup forward without them."""
        total = self.gpus[0].memory_mib
        oom = texts.cuda_out_of_memory(need.needed_mib - self.model.context_mib, total, need.free_mib)
        runner = srt / "model_executor/runner"
        if need.phase == "cuda_graph":
            self.crash([(srt / "model_executor/model_runner.py", "init_device_graphs"),
                        (runner / "decode_cuda_graph_runner.py", "capture")],
                       texts.capture_failed(oom))  # SGLang catches the RuntimeError (torch's OOM) and re-raises
        self.crash([(srt / "managers/scheduler.py", "run_scheduler_process"),
                    (runner / "base_runner.py", "_dummy_run"), (srt / "model_executor/model_runner.py", "forward"),
                    TORCH_MODULE_TO], "torch.OutOfMemoryError: " + oom)

    def jit_build(self, module: str, frames: list[tuple[Path, str]]) -> None:
        """FlashInfer's JitSpec.build_and_load: a module in the JIT cache is loaded; a cold one is built by running
        `ninja` by name from PATH (jit/cpp_ext.py run_ninja), whose FileNotFoundError nothing catches."""
        library = self.upstream.jit_library(module, self.gpus[0].compute_major,
                                            self.cache_layout.flashinfer_base(os.environ))
        if library.exists():
            return
        build_dir = library.parent
        build_dir.mkdir(parents=True, exist_ok=True)
        ninja_file = build_dir / "build.ninja"
        ninja_file.write_text(f"ninja_required_version = 1.3\nrule link\n  command = echo simulated > $out\n"
                              f"build {library}: link\n")
        log(f"Building JIT module {module}; this can take several minutes on first use.", self.rank)
        try:
            subprocess.run(["ninja", "-v", "-C", str(build_dir), "-f", str(ninja_file)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, cwd=str(build_dir), check=True, text=True)
        except FileNotFoundError as error:
            flashinfer = self.upstream.flashinfer_dir or Path("flashinfer")
            jit = flashinfer / "jit"
            self.crash([*frames, (flashinfer / "comm/trtllm_ar.py", f"get_{module}_module"),
                        (jit / "core.py", "build_and_load"), (jit / "core.py", "build"),
                        (jit / "cpp_ext.py", "run_ninja"), (Path(subprocess.__file__), "run"),
                        (Path(subprocess.__file__), "_execute_child")],
                       f"FileNotFoundError: {error}")

    def rendezvous(self, topology: Topology, srt: Path) -> None:
        """Wait for every node at --dist-init-addr (node 0 listens, the others dial it), then watch the others: a
        rank that dies leaves this one in a collective that never completes, until NCCL's watchdog fires."""
        meeting = Rendezvous(topology, self.config.rendezvous_timeout_s, self.stop)
        try:
            joined = meeting.join()
        except RendezvousFailed as failed:
            self.crash([(srt / "managers/scheduler.py", "run_scheduler_process"),
                        (srt / "model_executor/model_runner.py", "init_torch_distributed")], str(failed))
        if not joined:
            log("Received SIGTERM while loading; exiting.")
            self.exit(0)
        log(f"Rendezvous at {topology.host}:{topology.port}: {topology.nnodes} of {topology.nnodes} nodes joined "
            f"(node rank {topology.node_rank}).", self.rank)
        meeting.watch(self.peer_lost)

    def peer_lost(self, rank: int) -> None:
        """A peer node's connection dropped: unless this server is stopping too, NCCL's watchdog aborts it."""
        if self.stop.wait(self.config.nccl_timeout_s):
            return
        log(f"Node rank {rank} is gone; waiting on a collective that includes its ranks.", self.rank)
        self.nccl_abort()

    def nccl_timeout(self) -> NoReturn:
        """Collective hangs after loading; the NCCL watchdog aborts the process."""
        self.stop.wait(self.config.nccl_timeout_s)
        self.nccl_abort()

    def nccl_abort(self) -> NoReturn:
        timeout_ms = int(self.config.nccl_timeout_s * 1000)
        first = self.node_rank * self.gpus_per_node
        log(f"[Rank {first}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
            f"NumelIn=8192, NumelOut=8192, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 37} milliseconds "
            "before timing out.", self.rank)
        log(f"[Rank {first}] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed NCCL work: 0.",
            self.rank)
        log("terminate called after throwing an instance of 'c10::DistBackendError'", self.rank)
        log("Received sigquit from a child process. It usually means the child failed.")
        self.exit(1)

    def max_total_num_tokens(self) -> int:
        kv_mib = self.gpus[0].memory_mib * self.launch.mem_fraction_static * 0.45
        return int(kv_mib * 1024 * 1024 / 70000)  # ~70 kB of KV per token per GPU for the reference model

    # --- serving -------------------------------------------------------------
    def bind(self, state: ServerState) -> SimHTTPServer:
        address = (self.launch.host, self.launch.port)
        try:
            if self.config.has_fault("port-in-use"):
                raise OSError(98, "address already in use")
            return SimHTTPServer(address, state)
        except OSError as error:
            log(f"ERROR:    [Errno {error.errno}] error while attempting to bind on address {address}: "
                f"{(error.strerror or str(error)).lower()}")
            self.exit(1)

    def serve(self, fusion: Fusion) -> NoReturn:
        fused_on_sm120 = fusion is Fusion.FUSED and self.gpus[0].compute_major not in (9, 10)
        self.engine = Engine(
            model=self.model, launch=self.launch, fused_on_sm120=fused_on_sm120,
            scale=self.config.throughput_scale, hang_generation=self.config.has_fault("generation-hang"),
            die_after=fault.count if (fault := self.config.fault) is not None and fault.name == "die-after" else None,
            on_fatal=self.die_after_requests)
        state = ServerState(self.launch, self.engine, self.upstream.sglang_version,
                            self.upstream.has_ready_endpoint, self.config.architecture,
                            self.config.context_length, self.max_total_num_tokens())
        server = self.bind(state)
        pid = os.getpid()
        log(f"INFO:     Started server process [{pid}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        log(f"INFO:     Uvicorn running on http://{self.launch.host}:{self.launch.port} (Press CTRL+C to quit)")
        # uvicorn notices a SIGTERM within its 0.1 s tick (0.54.0 uvicorn/server.py main_loop), not socketserver's 0.5 s
        threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
        self.warmup(state)
        state.status = Status.UP
        log("The server is fired up and ready to roll!")
        self.stop.wait()
        self.drain(server, state)

    def warmup(self, state: ServerState) -> None:
        """As SGLang's warmup thread: /model_info, then one 8-token /generate, then status Up. The /generate goes
        through the HTTP side as any request does, so /metrics counts it (a 7-token prompt, not streamed)."""
        self.phase("warmup", 2)
        log('INFO:     127.0.0.1:0 - "GET /model_info HTTP/1.1" 200 OK')
        log("Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0", self.rank)
        assert self.engine is not None
        observed = state.served.request([0] * 7, stream=False, arrived_s=time.monotonic())
        produced = 0
        for step in self.engine.generate(7, 8, 0.05, internal=True):
            produced += step
            observed.produced(produced, time.monotonic(), finished=produced >= 8)
        observed.finished(time.monotonic())
        self.phase("warmup", 2)
        log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')

    def die_after_requests(self, detail: str) -> None:
        srt = self.upstream.sglang_dir / "srt"
        self.crash([(srt / "managers/scheduler.py", "run_scheduler_process"),
                    (srt / "managers/scheduler.py", "event_loop_overlap"),
                    (srt / "model_executor/model_runner.py", "forward")],
                   f"RuntimeError: CUDA error: an illegal memory access was encountered ({detail}, simulated)")

    def drain(self, server: SimHTTPServer, state: ServerState) -> NoReturn:
        """SIGTERM: stop accepting, let in-flight requests finish, exit 0 (as SGLang's graceful drain)."""
        assert self.engine is not None
        state.status = Status.DRAINING
        log("INFO:     Shutting down")
        server.shutdown()
        server.socket.close()
        self.engine.shutdown.set()  # a hung generation (fault) ends instead of blocking the drain
        while self.engine.running or self.engine.waiting:
            time.sleep(0.05)
        log("INFO:     Waiting for application shutdown.")
        log("INFO:     Application shutdown complete.")
        log(f"INFO:     Finished server process [{os.getpid()}]")
        self.exit(0)

    def run(self) -> NoReturn:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        if not self.gpus:
            self.crash([], "RuntimeError: No CUDA GPUs are available")
        if self.gpus_per_node > len(self.gpus):
            self.crash([], "torch.AcceleratorError: CUDA error: invalid device ordinal")
        fusion = self.upstream.fusion_outcome(self.launch.fusion_requested, self.gpus[0].compute_major)
        threading.Thread(target=self.state_loop, daemon=True).start()
        self.load(fusion)
        if self.node_rank > 0:
            self.follow()
        self.serve(fusion)

    def follow(self) -> NoReturn:
        """A node of rank > 0 runs its schedulers only, no HTTP server (SGLang's http_server.launch_server returns
        for node_rank >= 1), until SIGTERM."""
        log("The schedulers of this node are ready; node rank 0 serves HTTP.", self.rank)
        self.stop.wait()
        log("Received SIGTERM; shutting down the schedulers.", self.rank)
        self.exit(0)


def run() -> NoReturn:
    args = parse_launch_args(sys.argv[1:])
    Simulation(Launch.from_args(args), SimConfig.load(), InstalledUpstream.find(), query_gpus()).run()
