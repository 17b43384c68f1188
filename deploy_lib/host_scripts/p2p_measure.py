"""Per-pair GPU copy measurement, run on the host by the release venv's python (torch with CUDA): for each ordered
pair (i, j) of GPUs, whether torch sees peer access, the copy bandwidth per size, the latency of a 4-byte copy, and
every element of the copy compared with the pattern sent. Imports nothing of deploy_lib; prints one JSON object.

With one GPU, `loopback` measures the device-local copy on GPU0 (the ceiling a peer copy is compared with), marked
as such; `plant_wrong_element` changes one received element before the comparison, to show a wrong copy is found."""

from __future__ import annotations

import json
import sys
import time
from typing import Any  # the config and the records are JSON objects

LATENCY_COPIES = 200
REPEATS = 5


def pattern(torch: Any, count: int, src: int, dst: int, device: str) -> Any:  # torch and a tensor of it
    """A pattern that differs per pair and per element: a copy that lands misplaced or stale is caught."""
    return (torch.arange(count, dtype=torch.int32, device=device) * 7 + src * 1000 + dst) % 2147483647


def measure_pair(torch: Any, src: int, dst: int, sizes: list[int], plant: bool) -> dict[str, Any]:
    source_device, dest_device = f"cuda:{src}", f"cuda:{dst}"
    result: dict[str, Any] = {"src": src, "dst": dst, "loopback": src == dst, "sizes": [], "wrong": [],
                                 "peer_access": src == dst or bool(torch.cuda.can_device_access_peer(src, dst))}
    for size in sizes:
        count = size // 4
        sent = pattern(torch, count, src, dst, source_device)
        received = torch.empty(count, dtype=torch.int32, device=dest_device)
        received.copy_(sent)  # warm-up: peer mappings, allocator
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        started = time.perf_counter()
        for _ in range(REPEATS):
            received.copy_(sent)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        seconds = (time.perf_counter() - started) / REPEATS
        if plant and size == sizes[-1]:
            received[count // 2] += 1
        expected = pattern(torch, count, src, dst, dest_device)
        mismatch = (received != expected).nonzero()
        if mismatch.numel():
            index = int(mismatch[0].item())
            result["wrong"].append({"size_bytes": size, "element": index, "count": int(mismatch.numel()),
                                    "expected": int(expected[index].item()), "got": int(received[index].item())})
        result["sizes"].append({"size_bytes": size, "seconds": seconds, "gbps": round(size / seconds / 1e9, 3)})
    tiny_sent = torch.ones(1, dtype=torch.int32, device=source_device)
    tiny = torch.empty(1, dtype=torch.int32, device=dest_device)
    tiny.copy_(tiny_sent)
    torch.cuda.synchronize(dst)
    started = time.perf_counter()
    for _ in range(LATENCY_COPIES):
        tiny.copy_(tiny_sent)
        torch.cuda.synchronize(dst)
    result["latency_us"] = round((time.perf_counter() - started) / LATENCY_COPIES * 1e6, 2)
    return result


def run_measure(config: dict[str, Any]) -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"error": f"needs torch with CUDA ({exc})"}
    if not torch.cuda.is_available():
        return {"error": "needs torch with CUDA (torch.cuda.is_available() is False)"}
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    pairs = [(i, j) for i in range(count) for j in range(count) if i != j]
    if not pairs and config.get("loopback"):
        pairs = [(0, 0)]
    sizes = [int(size) for size in config.get("sizes", [1 << 20, 64 << 20])]
    return {"gpus": names, "torch": torch.__version__, "error": None,
            "pairs": [measure_pair(torch, i, j, sizes, bool(config.get("plant_wrong_element"))) for i, j in pairs]}


def run_measure_and_print(config_json: str) -> None:
    config = json.loads(config_json)
    try:
        result = run_measure(config)
    except Exception as exc:  # one JSON object always: the tool reports it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[0].endswith(".py"):
    run_measure_and_print(sys.argv[1] if len(sys.argv) > 1 else "{}")
