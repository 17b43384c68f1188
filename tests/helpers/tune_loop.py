"""A host a sweep runs on (scripted candidates, their measurements) and the sweep's request."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import PurePosixPath

from deploy_lib import store
from deploy_lib.commands.tune import tune
from deploy_lib.commands.tune_request import Planned, Request
from deploy_lib.facts import host as host_facts
from deploy_lib.host.benchmark import STEP_BENCH_MODULE
from deploy_lib.interrupts import Interrupt
from deploy_lib.profile import LoadedProfile
from deploy_lib.release.model import build_release
from deploy_lib.remote import OutputLine, Put, Step, StepResult
from deploy_lib.store import StoreLayout
from deploy_lib.tune import TuneReport, sweep_spec
from deploy_lib.versions import BENCH_MODULES
from helpers.deploy_plan import PROJECT, options_accepting, target
from helpers.recording_progress import RecordingProgress
from helpers.rollback import DEAD, READY, ScriptedHost, a_host
from helpers.store_output import release_entries

LAYOUT = StoreLayout("sglang")


BASE = PROJECT.profile("glm5-nvfp4").model_copy()


BENCH = {"prompts": 1024, "input_len": 32, "output_len": 32}


def decode_rate(profile: dict, concurrency: int) -> float:
    """The host's figures: ~3.65 tok/s per running request up to max_running_requests, fusion 0.27x."""
    running = min(concurrency, profile["memory"].get("max_running_requests") or 1024)
    return running * 3.65 * (0.27 if profile["features"].get("allreduce_fusion") else 1.0)


class SweepHost(ScriptedHost):
    """a_host's releases A and B (B current), plus every release the engine stages; history as appended."""

    def __init__(self) -> None:
        host = a_host()
        self.__dict__.update(host.__dict__)
        self.probes = _Probes(self)
        self.releases: dict[str, dict] = {}
        for line in self._rules[::-1]:  # a_host's canned release.json files, read back
            if line.matches(Step(store.FACT_RELEASE_FILES, ("true",))):
                for record in line.stdout.splitlines():
                    path, _, text = record.partition("\0")
                    self.releases[path.split("/")[-2]] = json.loads(text)
                break
        self.lines = [line for line in self._history_text().splitlines(keepends=True)]
        self.interrupt_at: tuple[int, int] | None = None   # (max_running_requests, concurrency): Ctrl-C there, once
        self.interrupt_output_len: int | None = None       # ... in a benchmark of this many output tokens only
        self.interrupt_start: int | None = None            # max_running_requests: SIGTERM while it starts, once

    def _history_text(self) -> str:
        rule = next(r for r in reversed(self._rules) if r.matches(Step(store.FACT_HISTORY, ("true",))))
        return rule.stdout

    def current_metadata(self) -> dict:
        return self.releases[self.current]

    def _refresh(self) -> None:
        files = "".join(f"{LAYOUT.releases}/{rid}/release.json\0{json.dumps(meta)}\n"
                        for rid, meta in self.releases.items())
        sums = "".join(f"{d}  /x/{n}\n" for n, d in self.current_metadata()["files"].items())
        for name, out in ((store.FACT_CURRENT, f"releases/{self.current}\n"),
                          (store.FACT_RELEASE_DIRS, release_entries(*self.releases)),
                          (store.FACT_RELEASE_FILES, files), (store.FACT_HISTORY, "".join(self.lines)),
                          (host_facts.FACT_FILE_SUMS, sums),
                          ("router: serving release", json.dumps(self.current_metadata()))):
            self.reply(name, stdout=out)

    def run(self, batch: Sequence[Step | Put], on_output: OutputLine | None = None) -> list[StepResult]:
        self._refresh()
        for step in batch:
            if isinstance(step, Step) and step.name == host_facts.FACT_RELEASE_SUMS:
                rid = PurePosixPath(step.argv[-1]).parent.name
                sums = self.releases.get(rid, {}).get("files", {})
                self.reply(step.name, stdout="".join(f"{d}  /x/{n}\n" for n, d in sums.items()), times=1)
            if isinstance(step, Step) and step.name.startswith("bench: concurrency "):
                level = int(step.name.rsplit(" ", 1)[1])
                running = self.current_metadata()["profile"]["memory"].get("max_running_requests")
                argv = list(step.argv)
                output_len = int(argv[argv.index("--random-output-len") + 1]) if "--random-output-len" in argv else 0
                if self.interrupt_at == (running, level) and self.interrupt_output_len in (None, output_len):
                    self.interrupt_at = None
                    raise Interrupt(signal.SIGINT)
                self.reply(f"bench: read c{level}.jsonl", stdout=self._jsonl(level), times=1)
                watts = 100 + decode_rate(self.current_metadata()["profile"], level) / 25
                self.reply("bench: read gpus.csv", times=1, stdout="".join(
                    f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 90000, {watts:.2f}, "
                    "600.00, 90, 580.95.05\n" for i in range(8)))
        results = super().run(batch, on_output)
        for step in batch:
            if isinstance(step, Put) and step.dest.name == store.RELEASE_FILE:
                meta = json.loads(step.data)
                self.releases[meta["id"]] = meta
            if isinstance(step, Step) and step.name == "history: append":
                self.lines.append(step.stdin.decode())  # type: ignore[union-attr]
        return results

    def _jsonl(self, concurrency: int) -> str:
        profile = self.current_metadata()["profile"]
        rate = decode_rate(profile, concurrency)
        queued = max(1.0, concurrency / (profile["memory"].get("max_running_requests") or 1024))
        duration = 1024 * 32 / rate
        return json.dumps({"completed": 1024, "duration": duration, "output_throughput": rate,
                           "mean_ttft_ms": 90 * queued, "median_ttft_ms": 80 * queued, "p99_ttft_ms": 100 * queued,
                           "mean_itl_ms": 9.0, "median_itl_ms": 9.0, "p99_itl_ms": 12.0, "mean_tpot_ms": 9.0,
                           "median_tpot_ms": 9.0, "p99_tpot_ms": 11.0, "max_concurrency": concurrency}) + "\n"

    def tune_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.lines if json.loads(line)["event"] == "tune"]


class _Probes(dict):  # type: ignore[type-arg]
    """Readiness: a release whose mem_fraction_static is 0.99 dies at start (SGLang's out of memory), one whose
    max_running_requests is `interrupt_start` gets Ctrl-C while it starts (once), the others serve."""

    def __init__(self, host: SweepHost) -> None:
        super().__init__()
        self.host = host

    def __missing__(self, release_id: str) -> list[object]:
        memory = self.host.releases[release_id]["profile"]["memory"]
        if memory.get("max_running_requests") == self.host.interrupt_start:
            self.host.interrupt_start = None
            return [Interrupt(signal.SIGTERM), READY]
        return [DEAD] if memory.get("mem_fraction_static") == 0.99 else [READY]


def sglang_knowing_every_flag(host: SweepHost, *profiles: LoadedProfile) -> None:
    args = [a for p in profiles for a in build_release(p, LAYOUT, "0.5.23", {}).args]
    sglang = {"sglang_version": "0.5.23", "flashinfer_version": "0.7.2",
              "options": options_accepting((*args, "--revision", "c" * 40))}
    host.reply(host_facts.FACT_SGLANG, stdout=json.dumps(sglang))
    host.reply(STEP_BENCH_MODULE, stdout=BENCH_MODULES[-1].module + "\n")


def request(*vary: str, **spec: object) -> Request:
    tune_spec, sources = sweep_spec(None, vary, {"bench": BENCH, "ladder": [64, 1024], **spec})
    return Request(tune_spec, sources, grace_s=0)


def sweep(host: SweepHost, req: Request, loaded: LoadedProfile = BASE) -> TuneReport | Planned:
    host.progress = RecordingProgress()
    return tune(loaded, target(), host, host.progress, req)


def a_sweep_host(*vary: str) -> SweepHost:
    host = SweepHost()
    host.releases = {rid: {**meta, "profile": {**meta["profile"], "memory": {
        **meta["profile"]["memory"], "max_running_requests": 64}}} for rid, meta in host.releases.items()}
    sglang_knowing_every_flag(host, BASE, *(c.loaded for c in _candidates(vary)))
    return host


def _candidates(vary: Sequence[str]) -> list:
    from deploy_lib.tune.sweep import build_sweep

    spec, sources = sweep_spec(None, vary, {"bench": BENCH})
    return list(build_sweep(BASE, spec, sources, (), None).candidates)


MRR = ("memory.max_running_requests=64,256,1024",)
