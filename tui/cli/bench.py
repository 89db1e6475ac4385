"""`enginetop bench WORKLOAD --engine NAME=URL ...`: the workload's requests on every engine, on one plan,
side by side (tui.workload). Engines run one after another unless --parallel-engines (engines on different
machines). Exit status: 0, 1 when an engine's part failed, 2 for bad input (a workload, SLO, flag)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from tui.cli.options import EXIT_BAD_INPUT, EXIT_FAILED, add_output, add_targets
from tui.probe.client import ProbeLimits
from tui.run.targets import build_targets
from tui.workload.bench import Bench, summarize, summary_json, table
from tui.workload.formats import WorkloadError, load_workload
from tui.workload.schedule import Mode, ScheduleError, parse_arrival, plan
from tui.workload.slo import Slo, SloError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="your workload (a trace, or AIPerf, Mooncake, Azure, BurstGPT, ShareGPT, vLLM "
                      "files) on every engine, side by side",
        description="Replay a workload on each engine on the same plan: at its recorded times (--speed "
                    "scales them), at an arrival rate (--rate, --arrival), or closed-loop (--concurrency). "
                    "Each request asks for its recorded output length, exactly.")
    p.add_argument("workload", metavar="WORKLOAD", help="PATH, or KIND:PATH to name the format")
    add_targets(p)
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
    p.add_argument("--model", default=None, help="model name to send (default: none; the server's own)")
    p.add_argument("--parallel-engines", action="store_true",
                   help="run every engine at once (only for engines on different machines)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --rate arrivals")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds of silence before a request fails")
    add_output(p, output="write the results as JSON to FILE", json="print the results as JSON")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
        if not targets:
            raise ValueError("give at least one --engine NAME=URL")
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
    except (WorkloadError, ScheduleError, SloError, ValueError) as exc:
        print(f"enginetop bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"enginetop bench: {len(planned)} requests of {workload.path} ({workload.kind}, "
          f"{workload.sessions} sessions) on {', '.join(t.name for t in targets)}", file=sys.stderr,
          flush=True)
    benches = [Bench(t, planned, concurrency=args.concurrency, model=args.model,
                     block_size=workload.block_size, limits=ProbeLimits(read_s=args.timeout))
               for t in targets]
    interrupted = False
    try:
        asyncio.run(_run(benches, args.parallel_engines))
    except KeyboardInterrupt:  # what was measured is kept and written
        interrupted = True
    summaries = [summarize(b.run, slo) for b in benches]
    result = {"workload": workload.path, "kind": workload.kind, "requests": len(planned), "mode": mode,
              "speed": args.speed, "rate": args.rate, "arrival": args.arrival,
              "concurrency": args.concurrency,
              "slo": str(slo) if slo else None, "interrupted": interrupted, "wall": time.time(),
              "engines": [summary_json(s) for s in summaries]}
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print(table(summaries))
    failed = interrupted or any(s.error or s.ok == 0 for s in summaries)
    return EXIT_FAILED if failed else 0


async def _run(benches: list[Bench], parallel: bool) -> None:
    async def one(bench: Bench) -> None:
        try:
            await bench.go()
        except Exception as exc:  # this engine's part ends with what it measured; the others go on
            bench.run.error = f"{type(exc).__name__}: {exc}"

    if parallel:
        await asyncio.gather(*(one(b) for b in benches))
    else:
        for bench in benches:
            await one(bench)
