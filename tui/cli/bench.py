"""`enginetop bench WORKLOAD --engine NAME=URL ...`: the workload's requests on every engine, on one plan,
side by side; `enginetop capacity WORKLOAD --engine ... --slo ...`: the highest arrival rate each engine takes
within the SLO (tui.workload). Engines run one after another unless --parallel-engines (engines on different
machines). Exit status: 0, 1 when an engine's part failed, 2 for bad input (a workload, SLO, flag), 130 when
Ctrl-C ended the run (what was measured is printed and written all the same)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tui.cli.options import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, add_output, add_targets

if TYPE_CHECKING:
    from tui.lifecycle.profiles import Profile
    from tui.model.bench import RunState
    from tui.model.findings import Finding
    from tui.model.samples import EngineSample
    from tui.model.targets import EngineTarget
    from tui.probe.results import ProbeResult
    from tui.workload.bench import Bench
    from tui.workload.capacity import Capacity
    from tui.workload.live import LiveFile, Shown
    from tui.workload.schedule import Mode, Planned
    from tui.workload.workers import WorkerBench


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", metavar="WORKLOAD", help="PATH, or KIND:PATH to name the format")
    add_targets(p, profiles=True)
    p.add_argument("--profiles-dir", type=Path, action="append", help="where profiles are (default: the "
                   "repo's profiles/ and the user's)")
    p.add_argument("--model", default=None, help="model name to send (default: none; the server's own)")
    p.add_argument("--parallel-engines", action="store_true",
                   help="run every engine at once (only for engines on different machines)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random arrivals")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds of silence before a request fails")
    p.add_argument("--workers", default="1", metavar="N|auto",
                   help="send each engine's plan from N worker processes (auto: one per core this process "
                        "may use); each request by exactly one of them, at its planned moment (default 1)")
    p.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                   help="make prompts from hash ids in this Hugging Face tokenizer's tokens (a "
                        "tokenizer.json, its folder, or a model already in the local HF cache; never "
                        "downloaded) instead of the engine's own /tokenize: for an engine that cannot "
                        "tokenise (a gateway, a hosted API)")
    add_output(p, output="write the results as JSON to FILE (`enginetop report` draws them)",
               json="print the results as JSON")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="your workload (a trace, or AIPerf, Mooncake, Azure, BurstGPT, ShareGPT, vLLM "
                      "files) on every engine, side by side",
        description="Replay a workload on each engine on the same plan: at its recorded times (--speed "
                    "scales them), at an arrival rate (--rate, --arrival), or closed-loop (--concurrency). "
                    "Each request asks for its recorded output length, exactly.")
    _common(p)
    p.add_argument("--speed", type=float, default=1.0, help="replay the recorded times this much faster")
    p.add_argument("--schedule", choices=["session", "timestamp"], default="session",
                   help="a session's later turns: after the previous reply plus its recorded delay "
                        "(session), or at their recorded times, held while the previous turn runs "
                        "(timestamp)")
    p.add_argument("--rate", type=float, default=None, metavar="R", help="requests per second, instead of "
                   "the recorded times")
    p.add_argument("--arrival", default="poisson", metavar="poisson|constant|gamma:CV",
                   help="how --rate's requests arrive (default poisson)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="closed loop: N requests in flight, instead of the recorded times")
    p.add_argument("--slo", default=None, metavar="TERMS",
                   help='e.g. "ttft:500 tpot:50 e2el:4000" (ms; every term must hold): attainment and '
                        "goodput")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N requests")
    p.set_defaults(func=cmd_bench)

    c = subparsers.add_parser(
        "capacity", help="the highest arrival rate of your workload each engine serves within an SLO",
        description="Search, per engine, the highest arrival rate at which the SLO holds for --attainment of "
                    "the requests: levels at rising rates (doubling, then bisecting), each at least "
                    "--level-s seconds and --min-requests requests, a level ended early when the engine is "
                    "over-saturated. Prints the curve and the capacity side by side.")
    _common(c)
    c.add_argument("--slo", required=True, metavar="TERMS",
                   help='e.g. "ttft:500 tpot:50 e2el:4000" (ms; every term must hold)')
    c.add_argument("--attainment", type=float, default=0.95, help="share of requests that must meet the SLO "
                   "(default 0.95)")
    c.add_argument("--arrival", default="poisson", metavar="poisson|constant|gamma:CV|trace",
                   help="how requests arrive at each rate; trace: the workload's own timeline compressed "
                        "(default poisson)")
    c.add_argument("--start-rate", type=float, default=1.0, metavar="R", help="the first level (req/s)")
    c.add_argument("--level-s", type=float, default=20.0, metavar="S", help="seconds per level (default 20)")
    c.add_argument("--min-requests", type=int, default=20, metavar="N", help="requests per level, at least")
    c.add_argument("--precision", type=float, default=0.1, help="stop when the lowest failing rate is within "
                   "this share above the highest passing one (default 0.1)")
    c.add_argument("--max-levels", type=int, default=12, metavar="N", help="levels per engine, at most")
    c.set_defaults(func=cmd_capacity)


def _bad(command: str, exc: Exception) -> int:
    print(f"enginetop {command}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _write(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    # imported when the command runs, so --help and the other commands never pay for it
    import orjson

    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(text)


def _told(engines: list[dict[str, Any]]) -> str:
    """Each engine's configuration as captured, and what its run revealed, under the figures."""
    lines = []
    for e in engines:
        if e.get("config"):
            lines.append(f"{e['engine']}: configuration: {e['config']['summary'] or 'n/a'}")
        for f in e.get("findings") or ():
            lines.append(f"{e['engine']}: {f['severity'].upper()} {f['id']}: {f['title']}")
            lines.append(f"{e['engine']}:   try: {f['suggestion']}")
    return "".join("\n" + line for line in lines)


@dataclass
class Part:
    """One engine's part of a run: an engine given by URL, or a profile started for it through the safe
    switch (and stopped after it)."""

    name: str
    target: EngineTarget | None = None
    profile: Profile | None = None
    steps: list[str] = field(default_factory=list)  # the switch's steps, as they went
    error: str | None = None  # the engine could not be started
    before: EngineSample | None = None  # the engine read before its part (its configuration) and after it
    after: EngineSample | None = None

    def json(self, results: list[tuple[Planned, ProbeResult]], block_size: int | None,
             concurrency_max: int | None, findings: list[Finding] | None = None) -> dict[str, Any]:
        """The part's start, the configuration captured from the running engine, and the findings its requests
        and the engine's own figures revealed (`findings`: judged by the caller, as a capacity search judges
        each level on its own requests)."""
        from tui.sources.config import config_json
        from tui.workload.evidence import run_findings

        if findings is None:
            findings = run_findings(self.name, results, block_size, self.before, self.after,
                                    concurrency_max) if self.before is not None else []
        return {"profile": self.profile.name if self.profile else None, "switch_steps": self.steps,
                "start_error": self.error,
                "config": config_json(self.before.config if self.before else None),
                "findings": [f.json() for f in findings]}


def _parts(args: argparse.Namespace) -> list[Part]:
    from tui.lifecycle.profile_files import load_profiles
    from tui.run.targets import build_targets

    parts = [Part(t.name, target=t) for t in build_targets(args.engine, args.api_key_file, args.api_key_env)]
    if args.profile:
        if args.parallel_engines:
            raise ValueError("--parallel-engines is for engines on different machines; profiles take turns "
                             "through the safe switch")
        found = load_profiles(args.profiles_dir) if args.profiles_dir else load_profiles()
        parts += [Part(name, profile=found.get(name)) for name in args.profile]
    if not parts:
        raise ValueError("give at least one --engine NAME=URL or --profile NAME")
    if len({p.name for p in parts}) != len(parts):
        raise ValueError(f"each engine needs a distinct name, got {', '.join(p.name for p in parts)}")
    return parts


async def _on_engine(part: Part, manager: Any, work: Callable[[EngineTarget], Awaitable[Any]]) -> None:
    """Run `work` on the part's engine: started first when it is a profile (the switch stops whatever the
    manager ran before), stopped after."""
    import asyncio

    from tui.compare.engines import ProfileEngine, StartError
    from tui.model.targets import EngineTarget

    if part.profile is None:
        assert part.target is not None
        await _measured(part, part.target, work)
        return
    print(f"enginetop: {part.name}: starting through the safe switch", file=sys.stderr, flush=True)
    engine = ProfileEngine(part.profile, manager)
    try:
        started = await asyncio.to_thread(engine.start)
    except (StartError, OSError) as exc:
        part.error = str(exc)
        print(f"enginetop: {part.name}: not started: {exc}", file=sys.stderr, flush=True)
        return
    part.steps = list(started.steps)
    t = started.target
    part.target = EngineTarget(part.name, t.url, t.api_key, t.basic_auth, model=t.model)
    try:
        await _measured(part, part.target, work)
    finally:
        await asyncio.to_thread(engine.stop)


async def _measured(part: Part, target: EngineTarget, work: Callable[[EngineTarget], Awaitable[Any]]) -> None:
    """The engine read (with its configuration) before the part and after it: its findings rest on both."""
    from tui.sources.engine_source import read_once

    part.before = await read_once(target)
    try:
        await work(target)
    finally:
        part.after = await read_once(target)


def _run_all(parts: list[Part], work: Callable[[Part, EngineTarget], Awaitable[Any]], parallel: bool,
             live: LiveFile, snapshot: Callable[[], dict[str, Shown]]) -> bool:
    """Every engine's part, one after another or at once, its figures written live for the dashboard; True
    when Ctrl-C ended the run (what was measured is kept: each part records as it goes)."""
    import asyncio

    from tui.compare.engines import new_manager
    from tui.net.loop import run_loop

    manager = new_manager(None) if any(p.profile for p in parts) else None

    def one(part: Part) -> Awaitable[None]:
        return _on_engine(part, manager, lambda target: work(part, target))

    async def go() -> None:
        writer = asyncio.ensure_future(live.keep_writing(snapshot))
        try:
            if parallel:
                await asyncio.gather(*(one(p) for p in parts))
            else:
                for part in parts:
                    await one(part)
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    try:
        run_loop(go())
    except KeyboardInterrupt:
        return True
    return False


def _workers(args: argparse.Namespace) -> int:
    """--workers; and --tokenizer read now, so one that cannot be read is refused before anything is sent."""
    from tui.workload.tokenizer import load_tokenizer
    from tui.workload.workers import parse_workers

    workers = parse_workers(args.workers)
    if args.tokenizer:
        load_tokenizer(args.tokenizer)
    return workers


def cmd_bench(args: argparse.Namespace) -> int:
    import asyncio

    from tui.lifecycle.profiles import ProfileError
    from tui.model.slo import Slo, SloError
    from tui.probe.client import ProbeLimits
    from tui.sources.energy_meter import EnergyMeter, EnginePids
    from tui.sources.engine_source import is_local
    from tui.sources.gpu import GpuSampler
    from tui.workload.bench import EngineRun, engine_json, summarize, table
    from tui.workload.formats import WorkloadError, load_workload
    from tui.workload.live import LiveFile, Shown, progress_of
    from tui.workload.report import BENCH_SCHEMA
    from tui.workload.schedule import ScheduleError, parse_arrival, plan
    from tui.workload.workers import WorkerPool, make_bench

    try:
        parts = _parts(args)
        slo = Slo.parse(args.slo) if args.slo is not None else None
        if args.rate is not None and args.concurrency is not None:
            raise ValueError("--rate and --concurrency are two plans: give one")
        if args.concurrency is not None and args.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        parse_arrival(args.arrival)
        workload = load_workload(args.workload)
        mode: Mode = "rate" if args.rate is not None else "concurrency" if args.concurrency else "trace"
        planned = plan(workload, mode, speed=args.speed, turns=args.schedule, rate=args.rate,
                       arrival=args.arrival, seed=args.seed, limit=args.limit)
        workers = _workers(args)
    except (WorkloadError, ScheduleError, SloError, ProfileError, ValueError) as exc:
        return _bad("bench", exc)
    print(f"enginetop bench: {len(planned)} requests of {workload.path} ({workload.kind}, "
          f"{workload.sessions} sessions) on {', '.join(p.name for p in parts)}", file=sys.stderr,
          flush=True)
    runs = {p.name: EngineRun(p.name, "") for p in parts}
    benches: dict[str, Bench | WorkerBench] = {}
    states: dict[str, RunState] = {p.name: "preparing" for p in parts}
    gpus = GpuSampler()  # the machine's energy over each engine's part (EnergyMeter)

    async def work(part: Part, target: EngineTarget) -> None:
        pool = WorkerPool(workers) if workers > 1 else None
        bench = make_bench(target, planned, pool, concurrency=args.concurrency, model=args.model,
                           block_size=workload.block_size, limits=ProbeLimits(read_s=args.timeout),
                           prompt_seed=workload.prompt_seed, tokenizer=args.tokenizer)
        runs[part.name], benches[part.name], states[part.name] = bench.run, bench, "running"
        meter = EnergyMeter(gpus.sample, pids=EnginePids(part.name, target.url))
        try:
            with meter:
                await bench.go()
        except Exception as exc:  # this engine's part ends with what it measured; the others go on
            bench.run.error = f"{type(exc).__name__}: {exc}"
        finally:
            if pool is not None:
                await asyncio.to_thread(pool.close)
        # the engines that ran at once on this machine: their work is in its devices' joules too
        together = tuple(p.name for p in parts if p is not part and (
            p.profile is not None or (p.target is not None and is_local(p.target.url)))) \
            if args.parallel_engines else ()
        bench.run.energy = meter.result(sum(r.completion_tokens or 0 for _, r in bench.run.results if r.ok),
                                        is_local(target.url), together)
        states[part.name] = "failed" if bench.run.error else "done"

    def snapshot() -> dict[str, Shown]:
        now = time.monotonic()
        return {p.name: Shown(p.target.url if p.target else "", progress_of(
            benches.get(p.name), "bench", workload.path, slo, states[p.name], len(planned), now,
            error=runs[p.name].error or p.error)) for p in parts}

    interrupted = _run_all(parts, work, args.parallel_engines, LiveFile("bench"), snapshot)
    for part in parts:
        if part.error is not None:
            runs[part.name].error = f"not started: {part.error}"
    summaries = [summarize(runs[p.name], slo) for p in parts]
    result = {"schema": BENCH_SCHEMA, "workload": workload.path, "kind": workload.kind,
              "requests": len(planned), "mode": mode, "speed": args.speed, "rate": args.rate,
              "arrival": args.arrival,
              "concurrency": args.concurrency, "slo": str(slo) if slo else None, "interrupted": interrupted,
              "wall": time.time(), "engines": [
                  {**engine_json(runs[p.name], slo),
                   **p.json(runs[p.name].results, workload.block_size,
                            benches[p.name].max_in_flight if p.name in benches else None)} for p in parts]}
    _write(args, result, table(summaries) + _told(result["engines"]))
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if any(s.error or s.ok == 0 for s in summaries) else 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from tui.lifecycle.profiles import ProfileError
    from tui.model.slo import Slo, SloError
    from tui.probe.client import ProbeLimits
    from tui.proxy.headroom import MeasuredCapacity, save_capacities
    from tui.sources.energy_meter import EnergyMeter, EnginePids
    from tui.sources.gpu import GpuSampler
    from tui.workload.capacity import Capacity, CapacityResult, Search, curve_table
    from tui.workload.formats import WorkloadError, load_workload
    from tui.workload.live import LiveFile, Shown, progress_of
    from tui.workload.report import CAPACITY_SCHEMA
    from tui.workload.schedule import ScheduleError

    try:
        parts = _parts(args)
        search = Search(Slo.parse(args.slo), attainment=args.attainment, arrival=args.arrival,
                        start_rate=args.start_rate, level_s=args.level_s, min_requests=args.min_requests,
                        precision=args.precision, max_levels=args.max_levels, seed=args.seed)
        workload = load_workload(args.workload)
        workers = _workers(args)
    except (WorkloadError, ScheduleError, SloError, ProfileError, ValueError) as exc:
        return _bad("capacity", exc)
    print(f"enginetop capacity: {len(workload.requests)} requests of {workload.path} ({workload.kind}) on "
          f"{', '.join(p.name for p in parts)}, SLO {search.slo} for {search.attainment * 100:g}%",
          file=sys.stderr, flush=True)

    def told(engine: str, level: Any) -> None:
        verdict = "pass" if level.passed else f"fail ({level.stopped})" if level.stopped else "fail"
        att = "n/a" if level.attainment is None else f"{level.attainment * 100:.1f}%"
        print(f"enginetop capacity: {engine} at {level.rate:.3g} req/s: {level.sent} sent, SLO met {att}: "
              f"{verdict}", file=sys.stderr, flush=True)

    results = {p.name: CapacityResult(p.name, "", str(search.slo), search.attainment, search.arrival)
               for p in parts}
    searches: dict[str, Capacity] = {}

    levels: dict[str, tuple[Bench | WorkerBench, float]] = {}  # each engine's current level: bench, rate
    states: dict[str, RunState] = {p.name: "preparing" for p in parts}
    gpus = GpuSampler()  # the machine's energy over each level (EnergyMeter)

    async def work(part: Part, target: EngineTarget) -> None:
        def level_started(bench: Bench | WorkerBench, rate: float) -> None:
            levels[part.name] = (bench, rate)

        found = Capacity(target, workload, search, model=args.model, limits=ProbeLimits(read_s=args.timeout),
                         tokenizer=args.tokenizer, workers=workers, on_level=told, on_bench=level_started,
                         meter=lambda: EnergyMeter(gpus.sample, pids=EnginePids(part.name, target.url)))
        results[part.name], searches[part.name], states[part.name] = found.result, found, "running"
        await found.run()
        states[part.name] = "failed" if found.result.error else "done"

    def snapshot() -> dict[str, Shown]:
        now = time.monotonic()
        shown = {}
        for p in parts:
            result = results[p.name]
            bench, rate = levels.get(p.name, (None, None))
            passed = [x.rate for x in result.levels if x.passed]
            level = len(result.levels) + (states[p.name] == "running")
            shown[p.name] = Shown(p.target.url if p.target else "", progress_of(
                bench, "capacity", workload.path, search.slo, states[p.name],
                len(bench.planned) if bench else 0, now, level=level, level_rate=rate,
                capacity_rps=max(passed) if passed else None, error=result.error or p.error))
        return shown

    interrupted = _run_all(parts, work, args.parallel_engines, LiveFile("capacity"), snapshot)
    for part in parts:
        if part.error is not None:
            results[part.name].error = f"not started: {part.error}"
    engines = [{**results[p.name].json(),
                **p.json([], workload.block_size, None,
                         searches[p.name].findings(workload.block_size, p.before, p.after)
                         if p.name in searches else [])} for p in parts]
    out = {"schema": CAPACITY_SCHEMA, "workload": workload.path, "kind": workload.kind,
           "slo": str(search.slo), "attainment": search.attainment, "arrival": search.arrival,
           "level_s": search.level_s,
           "interrupted": interrupted, "wall": time.time(), "engines": engines}
    _write(args, out, curve_table(list(results.values())) + _told(engines))
    measured = [MeasuredCapacity(r.url, r.engine, r.capacity_rps, r.slo, r.attainment, r.arrival,
                                 workload.path, time.time())
                for r in results.values() if r.capacity_rps is not None]
    if measured and not interrupted:
        where = save_capacities(measured)
        print(f"enginetop capacity: kept as the engines' capacity in {where} (the proxy shows the headroom)",
              file=sys.stderr)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if any(r.error or not r.levels for r in results.values()) else 0
