"""Running an interleaved A/B(/C...) comparison of engines: its arms, its schedules, its blocks.

An arm's engine is either restarted (each "instance" a fresh start, through the safe switch for profiles)
or attached (never restarted: its "instances" are rounds in time). What a run actually did, arm by arm,
is recorded in the result's "method" (method_facts), and the report's Method is written from that alone.

- After each start (attached: at each round) `warmup_requests` unrecorded requests.
- A block is `requests_per_block` sequential single-stream requests of one workload; its value is the
  median over its successful requests. Each block also records the GPU state sampled while it ran.
- Two schedules:
  * "coresident": round i of every arm runs at the same time (fresh instances on distinct ports, or the
    attached servers as they are); blocks alternate arms A B A B ... (B A B A in odd rounds), so drift
    hits every arm alike.
  * "switch": one engine at a time (a GPU that holds only one). Round i starts instance i of each arm in
    turn, A B in even rounds and B A in odd ones, and runs that instance's blocks back to back.
    Arms are interleaved at the instance level; restarting for every block would turn blocks into
    instances and multiply cold starts (165 s for vLLM in the seeds).

What the result says (per arm, per pair of arms, the findings) is tui.compare.analysis: it reads the
stored result alone, so a result is analysed and reported again from its JSON.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from tui.base.defaults import DEFAULT_CV_THRESHOLD_PCT, WORKLOADS
from tui.compare.analysis import METRICS, analyze
from tui.compare.engines import ArmEngine, Started, StartError, Target, engine_version
from tui.compare.gpu_watch import GpuSource, GpuWatch
from tui.compare.platform_info import platform_info
from tui.compare.stats import median
from tui.engines.argv import mask_argv
from tui.engines.known import by_name
from tui.findings.facts import spec_between
from tui.model.samples import EngineReading
from tui.model.targets import EngineTarget
from tui.net.loop import run_loop
from tui.probe.client import ProbeClient, ProbeLimits
from tui.probe.results import ProbeResult, token_source_of
from tui.probe.sweep import SweepConfig, SweepResult, run_sweep
from tui.probe.workloads import WorkloadParams, request_body, run_workload
from tui.sources.config import config_json
from tui.sources.energy import run_energy
from tui.sources.energy_meter import EnginePids
from tui.sources.engine_source import is_local, read_once
from tui.sources.host import CpuMeter
from tui.sources.rapl import RaplSpan

SCHEMA = "enginetop.compare/1"
Mode = Literal["switch", "coresident"]


@dataclass(frozen=True)
class ABConfig:
    instances: int = 3
    blocks: int = 4
    requests_per_block: int = 3
    workload: str = "short"
    max_tokens: int | None = None  # None: the workload's default
    warmup_requests: int = 1
    cv_threshold_pct: float = DEFAULT_CV_THRESHOLD_PCT
    exclude_throttled: bool = False
    mode: Mode = "switch"
    seed: int = 0
    concurrency: tuple[int, ...] = ()  # levels for a sweep on each arm's first instance; () = none
    gpu_interval_s: float = 0.5
    bootstrap_samples: int = 5000
    request_timeout_s: float = 300.0
    workload_file: str | None = None  # blocks replay this workload's requests (a BlockSource); warm-ups stay

    def check(self) -> None:
        if self.instances < 1 or self.blocks < 1 or self.requests_per_block < 1:
            raise ValueError("instances, blocks and requests per block must each be at least 1")
        if self.workload not in WORKLOADS or self.workload == "agent":
            allowed = ", ".join(w for w in WORKLOADS if w != "agent")
            raise ValueError(
                f"workload {self.workload!r} cannot be compared in blocks; choose one of {allowed}"
            )
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError("max tokens must be at least 2: decode speed needs two tokens")
        if any(level < 1 for level in self.concurrency):
            raise ValueError("concurrency levels must be positive integers")
        if self.cv_threshold_pct <= 0:
            raise ValueError("the CV threshold must be a positive percentage")


@dataclass
class Arm:
    """One configuration under test. `argv` is exactly what gets launched (None: attached)."""

    name: str
    engine: ArmEngine
    argv: list[str] | None = None
    engine_kind: str | None = None
    url: str | None = None
    profile_path: str | None = None
    param: dict[str, str] | None = None  # sweeps: {"option": "--threads", "value": "2"}
    notes: str = ""
    # How an engine this comparison does not start came to run, in words for the report ("started by the
    # dashboard from profile X, PID n"); None for engines the comparison starts itself.
    origin: str | None = None

    @property
    def unit(self) -> str:
        """What one repetition of this arm is: a fresh engine instance, or a round in time."""
        return "round" if self.engine.attached else "instance"


Progress = Callable[[str], None]


class BlockSource(Protocol):
    """Where blocks' requests come from instead of the probe workload: the user's workload, replayed
    (tui.workload.blocks). The block at one place gets the same requests on every arm."""

    async def requests(self, target: Target, instance: int, block: int, n: int) -> list[ProbeResult]:
        ...

    def facts(self) -> dict[str, Any]:
        ...


def _engine_target(target: Target) -> EngineTarget:
    return EngineTarget(target.name, target.url, target.api_key, target.basic_auth, model=target.model)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class _Run:
    arms: Sequence[Arm]
    config: ABConfig
    gpu: GpuSource | None
    progress: Progress
    source: BlockSource | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)
    instances: list[dict[str, Any]] = field(default_factory=list)
    concurrency: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    seq: int = 0
    resident: dict[str, Started] = field(default_factory=dict)  # coresident: the arms up in this round
    _before: dict[tuple[str, int], EngineReading | None] = field(default_factory=dict)
    # Made once per run: whatever per-run values WorkloadParams draws (its nonce) stay the same for every
    # request of this run, and are recorded as what the request bodies used.
    base_params: WorkloadParams = field(init=False)

    def __post_init__(self) -> None:
        self.base_params = WorkloadParams(max_tokens=self.config.max_tokens, seed=self.config.seed)

    # ---- one instance (attached: one round) -----------------------------------------------------------
    def start(self, arm: Arm, instance: int) -> Started | None:
        label = f"{arm.unit} {instance + 1}"
        self.progress(f"{arm.name}: {label}" if arm.engine.attached else f"{arm.name}: starting {label}")
        t0 = time.time()
        try:
            started = arm.engine.start()
        except (StartError, OSError) as exc:
            self.errors.append(f"{arm.name} {label}: {exc}")
            self.progress(f"{arm.name}: {label} failed to start: {exc}")
            self.instances.append(
                {"arm": arm.name, "instance": instance, "ok": False, "error": str(exc), "wall_start": t0,
                 "fresh": not arm.engine.attached}
            )
            return None
        if arm.name not in self.versions:
            self.versions[arm.name] = engine_version(started.target)
        arm.url = arm.url or started.target.url
        if started.argv is not None:
            arm.argv = list(started.argv)
        self.instances.append(
            {
                "arm": arm.name,
                "instance": instance,
                "ok": True,
                "fresh": not arm.engine.attached,  # False: an attached engine, this is a round in time
                "wall_start": t0,
                "cold_start_s": started.cold_start_s,
                "pid": started.pid,
                "url": started.target.url,
                "log_path": started.log_path,
                "switch_steps": list(started.steps),
            }
        )
        self.instances[-1]["warmup_sent"], self.instances[-1]["warmup_ok"] = self.warmup(started, instance)
        # What this instance really runs, read from it (never from its profile), and its speculative counters
        # before its blocks: finish() takes them again after, so warm-ups and other arms never count
        before = run_loop(read_once(_engine_target(started.target)))
        self.instances[-1]["config"] = config_json(before.config)
        self._before[(arm.name, instance)] = before.reading
        return started

    def finish(self, arm: Arm, started: Started, instance: int) -> None:
        """After an instance's blocks: what speculative decoding did over them, from the engine's counters."""
        before = self._before.pop((arm.name, instance), None)
        after = run_loop(read_once(_engine_target(started.target))).reading
        spec = spec_between(before, after)
        for record in self.instances:
            if record["arm"] == arm.name and record["instance"] == instance and record["ok"]:
                record["spec"] = dataclasses.asdict(spec) if spec is not None else None

    def stop(self, arm: Arm) -> None:
        try:
            arm.engine.stop()
        except (StartError, OSError) as exc:
            self.errors.append(f"{arm.name}: {exc}")

    def params(self, seed: int) -> WorkloadParams:
        return dataclasses.replace(self.base_params, seed=seed)

    def warmup(self, started: Started, instance: int) -> tuple[int, int]:
        """(sent, answered) unrecorded requests."""
        if self.config.warmup_requests < 1:
            return 0, 0
        seed = 10_000_000 + self.config.seed * 100_000 + self.seq * 10 + instance
        results = run_loop(self._requests(started, self.config.warmup_requests, seed))
        return len(results), sum(r.ok for r in results)

    async def _requests(self, started: Started, n: int, seed: int) -> list[ProbeResult]:
        limits = ProbeLimits(read_s=self.config.request_timeout_s, total_s=self.config.request_timeout_s)
        async with ProbeClient(limits) as client:
            return [
                r
                async for r in run_workload(
                    client, started.target, self.config.workload, self.params(seed), repeat=n
                )
            ]

    # ---- one block ------------------------------------------------------------------------------------
    def block_seed(self, seq: int) -> int:
        return self.config.seed * 100_000 + seq

    def block(self, arm: Arm, started: Started, instance: int, block: int) -> None:
        seed = self.block_seed(self.seq)
        wall_start = time.time()
        cpu = CpuMeter()  # its own baseline: the dashboard's host panel reads the CPU at the same time
        n = self.config.requests_per_block
        # the engine's processes, named to the GPU source: an AMD or Intel GPU lists only those it is given
        pids = EnginePids(arm.name, started.target.url, started.pid)
        # coresident: the other arms' engines stay up, idle, meanwhile; named to the GPU source too, so a GPU
        # they share reads as shared with them (not with "a process enginetop does not watch")
        resident = {name: EnginePids(name, other.target.url, other.pid)
                    for name, other in self.resident.items()
                    if name != arm.name and other.target.url != started.target.url}

        def everyone() -> dict[str, set[int]]:
            return {k: v for p in (pids, *resident.values()) for k, v in p().items()}
        # the CPU packages' energy over the block (for an engine on the CPU), read every few seconds in its
        # own thread so that a long block loses no wrap of the counter
        with RaplSpan() as cpu_energy, GpuWatch(self.gpu, self.config.gpu_interval_s, everyone) as watch:
            if self.source is not None:
                results = run_loop(self.source.requests(started.target, instance, block, n))
            else:
                results = run_loop(self._requests(started, n, seed))
        host_cpu = cpu.percent()
        gpu = watch.summary()
        good = [r for r in results if r.ok]
        # Joules per generated token over the block (its prefills included): the energy of the GPUs holding
        # the engine, or the CPU package's for an engine on the CPU; never for an engine on another machine
        energy = run_energy(gpu, cpu_energy.result(), sum(r.completion_tokens or 0 for r in good),
                            is_local(started.target.url), arm.name if pids.found else None)
        if resident and energy["energy_scope"] == "cpu package":
            energy["energy_scope"] = (f"cpu package (shared with {', '.join(sorted(resident))}: up and idle "
                                      "during this block)")
        record: dict[str, Any] = {
            "arm": arm.name,
            "instance": instance,
            "block": block,
            "seq": self.seq,
            "wall_start": wall_start,
            "wall_end": time.time(),
            "requests": [r.to_json() for r in results],
            "ok": len(good),
            "failed": len(results) - len(good),
            "errors": sorted({r.error for r in results if r.error}),
            "token_source": token_source_of(results),
            "gpu": gpu,
            "throttled": bool(gpu.get("throttled")),
            # Whole-host CPU busy % during the block: engines, probes and anything else running. On a CPU
            # engine a busy host is the first suspect for a slow or scattered block.
            "host_cpu_pct": host_cpu,
            **energy,
        }
        for metric in METRICS:
            record[metric] = median([v for r in good if (v := getattr(r, metric)) is not None])
        self.blocks.append(record)
        self.seq += 1
        flag = "  THROTTLED" if record["throttled"] else ""
        decode = record["decode_tps"]
        jpt = record["joules_per_token"]
        self.progress(
            f"{arm.name}: {arm.unit} {instance + 1} block {block + 1}: "
            f"decode {'n/a' if decode is None else f'{decode:.1f}'} tok/s, "
            f"{'' if jpt is None else f'{jpt:.3g} J/token, '}{record['ok']}/{len(results)} ok{flag}"
        )

    # ---- concurrency sweep (tui.probe.sweep) -----------------------------------------------------
    def sweep(self, arm: Arm, started: Started) -> None:
        seed = 20_000_000 + self.config.seed * 100_000 + self.seq
        sweep_config = SweepConfig(levels=self.config.concurrency, requests_per_stream=2,
                                   workload=self.config.workload, params=self.params(seed))
        self.progress(f"{arm.name}: concurrency sweep {', '.join(map(str, self.config.concurrency))}")
        swept = run_loop(self._sweep(started, sweep_config))
        for level in swept.levels:
            self.concurrency.append({"arm": arm.name, **level.to_json()})
        self.seq += 1

    async def _sweep(self, started: Started, sweep_config: SweepConfig) -> SweepResult:
        limits = ProbeLimits(read_s=self.config.request_timeout_s, total_s=self.config.request_timeout_s)
        async with ProbeClient(limits) as client:
            return await run_sweep(client, started.target, sweep_config)


def run_comparison(
    arms: Sequence[Arm],
    config: ABConfig,
    *,
    gpu: GpuSource | None = None,
    progress: Progress | None = None,
    kind: str = "ab",
    extra: dict[str, Any] | None = None,
    gpu_origin: str = "NVML, sampled in a thread while each block ran",
    source: BlockSource | None = None,
) -> dict[str, Any]:
    """Run the whole schedule and return the result (JSON-ready dict) with its analysis.

    `gpu_origin` says in words where `gpu`'s readings come from, for the report's Method.
    """
    config.check()
    names = [a.name for a in arms]
    if len(arms) < 1 or len(set(names)) != len(names):
        raise ValueError(f"arms need distinct names, got {names}")
    run = _Run(arms, config, gpu, progress or (lambda _msg: None), source)
    started_at = _now_iso()
    first_gpu = gpu() if gpu is not None else None
    try:
        if config.mode == "coresident":
            _coresident(run)
        else:
            _switch(run)
    finally:
        for arm in arms:
            run.stop(arm)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": kind,
        "started": started_at,
        "finished": _now_iso(),
        "platform": platform_info(first_gpu),
        "config": {**asdict(config), "concurrency": list(config.concurrency)},
        "arms": [
            {
                "name": a.name,
                "engine": a.engine_kind,
                "argv": _masked(a),
                "url": a.url,
                "attached": a.engine.attached,
                "profile_path": a.profile_path,
                "param": a.param,
                "notes": a.notes,
                "origin": a.origin,
                "engine_version": run.versions.get(a.name),
            }
            for a in arms
        ],
        "method": method_facts(run, gpu_origin),
        "instances": run.instances,
        "blocks": run.blocks,
        "concurrency": run.concurrency,
        "errors": run.errors,
        **(extra or {}),
    }
    result["analysis"] = analyze(result)
    return result


def method_facts(run: _Run, gpu_origin: str) -> dict[str, Any]:
    """What this run did, recorded as it happened; the report's Method is written from these facts only."""
    cfg = run.config
    arms = []
    for arm in run.arms:
        starts = [i for i in run.instances if i["arm"] == arm.name]
        ok = [i for i in starts if i["ok"]]
        arms.append({
            "name": arm.name,
            "restarted": not arm.engine.attached,
            "unit": arm.unit,
            "origin": arm.origin,
            "starts": len(ok),  # fresh instances started, or (attached) rounds begun
            "failed_starts": len(starts) - len(ok),
            "safe_switch_starts": sum(1 for i in ok if i["fresh"] and i["switch_steps"]),
            "cold_start_s": [i["cold_start_s"] for i in ok if i["fresh"] and i["cold_start_s"] is not None],
            "warmup_sent": sum(i.get("warmup_sent", 0) for i in ok),
            "warmup_ok": sum(i.get("warmup_ok", 0) for i in ok),
        })
    first = request_body(cfg.workload, run.params(run.block_seed(0)), 0)  # the first recorded request
    return {
        "mode": cfg.mode,
        "arms": arms,
        "warmup_requests": cfg.warmup_requests,
        "requests": run.source.facts() if run.source is not None else {
            "workload": cfg.workload,
            "params": asdict(run.base_params),
            "block_seed": f"{cfg.seed} x 100000 + the block's place in the run",
            "first_prompt_start": first["messages"][-1]["content"][:60],
            "max_tokens": first.get("max_tokens"),
            "temperature": first.get("temperature"),
            "ignore_eos": bool(first.get("ignore_eos")),
        },
        "gpu": {
            "origin": gpu_origin if run.gpu is not None else None,
            "interval_s": cfg.gpu_interval_s if run.gpu is not None else None,
            "why_not": None if run.gpu is not None else "no GPU source was given to this run",
        },
    }


def _switch(run: _Run) -> None:
    for i in range(run.config.instances):
        order = list(run.arms) if i % 2 == 0 else list(reversed(run.arms))
        for arm in order:
            started = run.start(arm, i)
            if started is None:
                continue
            try:
                for b in range(run.config.blocks):
                    run.block(arm, started, i, b)
                run.finish(arm, started, i)
                if i == 0 and run.config.concurrency:
                    run.sweep(arm, started)
            finally:
                if not arm.engine.attached:
                    run.stop(arm)


def _coresident(run: _Run) -> None:
    for i in range(run.config.instances):
        live: dict[str, Started] = {}
        run.resident = live  # each block's energy says who else was up meanwhile
        try:
            for arm in run.arms:
                started = run.start(arm, i)
                if started is not None:
                    live[arm.name] = started
            for b in range(run.config.blocks):
                # A B A B within a round; the next round starts with B so no arm always goes first.
                order = list(run.arms) if i % 2 == 0 else list(reversed(run.arms))
                for arm in order:
                    if arm.name in live:
                        run.block(arm, live[arm.name], i, b)
            for arm in run.arms:
                if arm.name in live:
                    run.finish(arm, live[arm.name], i)
            if i == 0 and run.config.concurrency:
                for arm in run.arms:
                    if arm.name in live:
                        run.sweep(arm, live[arm.name])
        finally:
            for arm in run.arms:
                if arm.name in live and not arm.engine.attached:
                    run.stop(arm)


def _masked(arm: Arm) -> list[str] | None:
    """What the arm ran, as the result and its report keep it: masked like every argv enginetop keeps, however
    the arm got it (the profile as written, or what was launched)."""
    if arm.argv is None:
        return None
    known = by_name(arm.engine_kind)
    return list(mask_argv(arm.argv, known.options if known else None))
