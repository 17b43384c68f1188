"""NCCL all-reduce check that runs ON THE HOST, under the release venv's python (it needs torch with CUDA).

deploy_lib.gpu_check sends this file's text to `<venv>/bin/python3 -` with one call appended,
`run_check_and_print(<config JSON>, <this source>)`; run as a file, it takes the config JSON as its argument.
The parent starts one worker process per GPU (`python -c <source>`; torch.distributed, NCCL backend, exactly the
environment in the config plus NCCL_DEBUG=INFO), collects what each worker prints, and prints exactly one JSON
object. The parent uses the standard library only, so a venv without torch or without a GPU is reported ("needs
torch with CUDA"), never faked; the parsers below are pure and tested on recorded real NCCL output.

Each rank r contributes 2**r * ((i % 7) + 1) at element i, so the exact sum is (2**W - 1) * ((i % 7) + 1) and a
wrong element names the rank whose data was lost, doubled or corrupted (the difference is +-2**k * (i % 7 + 1)).
Bandwidth is computed as nccl-tests does for all_reduce: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any  # the config and the records are JSON objects

VALUE_PERIOD = 7
# NCCL INFO lines: "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read" (2.2x) and "... via SHM/direct/direct"
CHANNEL_LINE = re.compile(r"Channel (\d+)(?:/\d+)? : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\] (?:\[\w+\] )?via (\S+)")
NCCL_VERSION_LINE = re.compile(r"NCCL version (\S+)")
# the last line of a Python traceback: "torch.distributed.DistBackendError: NCCL error in: ..."; once the process
# group is up, torch.distributed prefixes a rank's traceback lines with "[rank1]: "
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b")
PEER_GRACE_S = 15.0  # once a rank has failed, how long the others get to fail too (they wait on it for ever)


def bus_bandwidth(algbw_gbps: float, world_size: int) -> float:
    """nccl-tests' all_reduce bus bandwidth: the algorithm bandwidth times 2 (n - 1) / n."""
    return algbw_gbps * 2 * (world_size - 1) / world_size


def parse_transports(nccl_log: str) -> list[dict[str, Any]]:
    """The transport NCCL chose per channel and peer, from NCCL_DEBUG=INFO lines, each (channel, from, to) once."""
    seen: dict[tuple[int, int, int], dict[str, Any]] = {}
    for match in CHANNEL_LINE.finditer(nccl_log):
        channel, src, dst = int(match.group(1)), int(match.group(2)), int(match.group(4))
        seen.setdefault((channel, src, dst), {"channel": channel, "from_rank": src, "to_rank": dst,
                                              "via": match.group(6)})
    return sorted(seen.values(), key=lambda t: (t["channel"], t["from_rank"], t["to_rank"]))


def nccl_version(nccl_log: str) -> str | None:
    found = NCCL_VERSION_LINE.search(nccl_log)
    return found.group(1) if found else None


def explain_wrong_element(index: int, got: float, world_size: int) -> str:
    """Which rank's contribution is off at one wrong element of the result."""
    unit = (index % VALUE_PERIOD) + 1
    expected = ((1 << world_size) - 1) * unit
    off = (got - expected) / unit
    ranks = [k for k in range(world_size) if abs(abs(off) - (1 << k)) < 1e-6]
    culprit = f"the contribution of rank {ranks[0]} is {'missing' if off < 0 else 'doubled'}" if ranks else \
        "no single rank's contribution explains it (corrupted data)"
    return f"element {index}: expected {expected:g}, got {got:g}: {culprit}"


# ---------------------------------------------------------------------------------------------------------
# worker: one process per GPU


def worker(config: dict[str, Any]) -> None:
    import torch  # only the workers need torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    emit({"rank": rank, "event": "ready", "gpu": torch.cuda.get_device_name(device)})
    iterations, warmup = int(config.get("iterations", 5)), int(config.get("warmup", 2))
    for size_bytes in config["sizes"]:
        count = max(1, int(size_bytes) // 4)
        pattern = (torch.arange(count, device=device, dtype=torch.int64) % VALUE_PERIOD + 1).to(torch.float32)
        contribution = pattern * float(1 << rank)
        if config.get("corrupt_rank") == rank:  # the planted fault of the check's own test
            contribution[count // 2] += 1.0
        buffer = contribution.clone()
        if config.get("hang_rank") == rank:  # the planted hang of the check's own test
            time.sleep(3600)
        if config.get("fail_rank") == rank:  # the planted error of the check's own test
            raise RuntimeError(f"planted failure on rank {rank}")
        emit({"rank": rank, "event": "enter", "size_bytes": count * 4})
        dist.all_reduce(buffer)
        wrong = (buffer != pattern * float((1 << world) - 1)).nonzero()
        failure = None
        if wrong.numel():
            index = int(wrong[0, 0])
            failure = explain_wrong_element(index, float(buffer[index]), world) + f" ({wrong.numel()} wrong)"
        for _ in range(warmup):
            dist.all_reduce(buffer)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iterations):
            dist.all_reduce(buffer)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iterations
        emit({"rank": rank, "event": "size", "size_bytes": count * 4, "seconds": seconds, "wrong": failure})
    dist.destroy_process_group()
    emit({"rank": rank, "event": "done"})


def emit(record: dict[str, Any]) -> None:
    print("GPUCHECK " + json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------------------
# parent: starts the workers, enforces the deadline, prints one JSON object


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def has_torch_cuda() -> str | None:
    """None when torch sees enough GPUs for the check, else why not."""
    probe = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return "needs torch with CUDA: " + (done.stderr.strip().splitlines() or ["torch failed to import"])[-1]
    _, cuda, count = done.stdout.split()
    if cuda == "None" or int(count) == 0:
        return f"needs torch with CUDA: torch {done.stdout.split()[0]} sees no CUDA GPU"
    return None


def summarise(world: int, records: list[dict[str, Any]], nccl_log: str, hung: list[dict[str, Any]],
              exit_codes: dict[int, int | None], failed: list[dict[str, Any]]) -> dict[str, Any]:
    """The check's result from what the workers printed: per size the slowest rank's time, every wrong result."""
    by_size: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["event"] != "size":
            continue
        row = by_size.setdefault(int(record["size_bytes"]), {"size_bytes": record["size_bytes"], "seconds": 0.0,
                                                              "wrong": []})
        row["seconds"] = max(float(row["seconds"]), float(record["seconds"]))
        if record["wrong"]:
            row["wrong"].append({"rank": record["rank"], "detail": record["wrong"]})
    for row in by_size.values():
        algbw = int(row["size_bytes"]) / float(row["seconds"]) / 1e9 if row["seconds"] else 0.0
        row["algbw_gbps"], row["busbw_gbps"] = round(algbw, 3), round(bus_bandwidth(algbw, world), 3)
    gpus = {int(r["rank"]): r["gpu"] for r in records if r["event"] == "ready"}
    done = sorted(int(r["rank"]) for r in records if r["event"] == "done")
    sizes = [by_size[size] for size in sorted(by_size)]
    return {"world_size": world, "gpus": [gpus.get(rank) for rank in range(world)], "sizes": sizes,
            "transports": parse_transports(nccl_log), "nccl_version": nccl_version(nccl_log), "hung": hung,
            "failed": failed,
            "exit_codes": {str(rank): code for rank, code in exit_codes.items()},
            "verified": bool(sizes) and not any(row["wrong"] for row in sizes) and not hung and not failed
            and len(done) == world,
            "error": None}


def rank_report(rank: int, records: list[dict[str, Any]], output: str, exit_code: int | None
                ) -> dict[str, Any]:
    """Where a rank that did not finish stopped: inside an all-reduce (waiting on a peer), or outside one; and, for
    one that exited by itself, its error (a traceback's last line) and NCCL's warnings."""
    entered = [r["size_bytes"] for r in records if r["rank"] == rank and r["event"] == "enter"]
    finished = [r["size_bytes"] for r in records if r["rank"] == rank and r["event"] == "size"]
    ready = any(r["rank"] == rank and r["event"] == "ready" for r in records)
    if len(entered) > len(finished):
        where = f"inside the all-reduce of {entered[-1]} bytes (waiting on a peer)"
    elif not ready:
        where = "before NCCL was initialised"
    else:
        where = f"outside any all-reduce, after {finished[-1] if finished else 0} bytes (never entered the next)"
    lines = [line for line in output.splitlines() if not line.startswith("GPUCHECK ")]
    errors = [line.strip() for line in lines if EXCEPTION_LINE.match(line.strip())]
    return {"rank": rank, "where": where, "exit_code": exit_code, "log_tail": lines[-3:],
            "error": errors[-1] if errors else None,
            "nccl_warnings": [line.strip() for line in lines if "NCCL WARN" in line][:5]}


def run_check(config: dict[str, Any], source: str) -> dict[str, Any]:
    world = int(config["world_size"])
    missing = has_torch_cuda()
    if missing:
        return {"world_size": world, "error": missing, "verified": False}
    env = {**os.environ, **{str(k): str(v) for k, v in config.get("env", {}).items()},
           "NCCL_DEBUG": "INFO", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(world)}
    logs = [f"/tmp/gpucheck-{os.getpid()}-{rank}.log" for rank in range(world)]
    workers = []
    for rank in range(world):
        with open(logs[rank], "w") as log:
            program = f"{source}\nworker(json.loads(sys.argv[1]))\n"
            workers.append(subprocess.Popen([sys.executable, "-c", program, json.dumps(config)],
                                            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                            stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + float(config.get("deadline_s", 120))
    while time.monotonic() < deadline and any(w.poll() is None for w in workers):
        if any(w.poll() not in (None, 0) for w in workers):
            deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
        time.sleep(0.2)
    outputs, killed = [], set()
    for rank, process in enumerate(workers):
        if process.poll() is None:
            process.kill()
            process.wait()
            killed.add(rank)
        with open(logs[rank]) as log:
            outputs.append(log.read())
        os.unlink(logs[rank])
    records = [json.loads(line.split(" ", 1)[1]) for text in outputs for line in text.splitlines()
               if line.startswith("GPUCHECK ")]
    unfinished = {rank: rank_report(rank, records, text, workers[rank].returncode) for rank, text in enumerate(outputs)
                  if not any(r["rank"] == rank and r["event"] == "done" for r in records)}
    # killed at the deadline: a hang; exited by itself before the end: an error (NCCL's, CUDA's, ...)
    hung = [report for rank, report in unfinished.items() if rank in killed]
    failed = [report for rank, report in unfinished.items() if rank not in killed]
    result = summarise(world, records, "\n".join(outputs), hung, {r: w.returncode for r, w in enumerate(workers)},
                       failed)
    result["nccl_info"] = [line for text in outputs for line in text.splitlines() if "NCCL INFO" in line][:400]
    return result


def run_check_and_print(config_json: str, source: str) -> None:
    config = json.loads(config_json)
    try:
        result = run_check(config, source)
    except Exception as exc:  # one JSON object always: the tool reports it
        result = {"world_size": config.get("world_size"), "error": f"{type(exc).__name__}: {exc}", "verified": False}
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[0].endswith(".py"):  # run as a file (not `-` or a worker's `-c`)
    with open(__file__) as own_source:
        run_check_and_print(sys.argv[1], own_source.read())
