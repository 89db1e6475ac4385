"""How well `enginetop bench` keeps to its plan, from one process and from worker processes (--workers).

    .venv/bin/python bench/bench_workload.py [--rate 100] [--seconds 10] [--tokens 4] [--workers 1,2]
                                            [--sections rate,ingest,cost]

A loopback SSE server (tests/sse_server.py, its own process, answering at once) takes the load; every figure
is measured for each --workers value in the same run, one after the other:
- rate: --rate requests per second for --seconds, constant and then Poisson arrivals, each a streamed chat of
  --tokens tokens, sent by `tui.workload.bench.Bench` (one process) or `tui.workload.workers.WorkerBench`
  exactly as `enginetop bench --rate R --workers N` sends them. Printed: the send lateness (the moment a
  request was handed to the client, minus its planned moment) p50/p99/max (goal: p99 <= 2 ms), the send rate
  achieved against the planned one (goal: >= 99 %), and the clients' self-check (CPU share, event-loop lag,
  per worker).
- ingest: a closed loop of --streams streams of --ingest-tokens tokens each: the tokens per second the
  client side takes in (its ceiling, when the server answers at once).
- cost: what a worker costs: the pool's start (spawn, imports, prompts) and each worker's resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_probe import start_server  # noqa: E402
from tui.model.targets import EngineTarget  # noqa: E402
from tui.model.workload import Workload, WorkloadRequest  # noqa: E402
from tui.workload.bench import summarize  # noqa: E402
from tui.workload.schedule import plan  # noqa: E402
from tui.workload.workers import WorkerPool, make_bench  # noqa: E402


def workload(n: int, tokens: int) -> Workload:
    return Workload("synthetic", "vllm-custom", tuple(
        WorkloadRequest(line=i + 1, prompt="bench", output_length=tokens) for i in range(n)))


async def one_run(url: str, planned, workers: int, concurrency: int | None = None):
    pool = WorkerPool(workers) if workers > 1 else None
    try:
        bench = make_bench(EngineTarget("sse", url), planned, pool, concurrency=concurrency)
        await bench.ready()
        memory = [psutil.Process(p.pid).memory_info().rss for p in pool.processes] if pool else []
        run = await bench.go()
        return bench, run, (pool.start_s if pool else None), memory
    finally:
        if pool is not None:
            await asyncio.to_thread(pool.close)


def rate_section(url: str, args: argparse.Namespace, workers_list: list[int]) -> None:
    n = int(args.rate * args.seconds)
    for arrival in ("constant", "poisson"):
        for workers in workers_list:
            planned = plan(workload(n, args.tokens), "rate", rate=args.rate, arrival=arrival)
            _, run, _, _ = asyncio.run(one_run(url, planned, workers))
            s = summarize(run)
            late = s.lateness_s
            times = [p.at_s or 0.0 for p in planned]
            planned_rate = (len(times) - 1) / (max(times) - min(times))  # Poisson: this draw's own rate
            sent = sorted(r.sent_at for _, r in run.results if r.sent_at is not None)
            achieved = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else 0.0
            print(f"{arrival:8s} {args.rate:g} req/s x {args.seconds:g} s, {workers} worker(s): "
                  f"{s.ok}/{s.requests} ok; sent at {achieved:.1f} req/s ({achieved / planned_rate:.1%} of "
                  f"the plan's {planned_rate:.1f}); send lateness p50 {(late.p50 or 0) * 1000:.2f} ms, p99 "
                  f"{(late.p99 or 0) * 1000:.2f} ms, max {max(run.lateness_s, default=0) * 1000:.2f} ms "
                  "(goal p99 <= 2 ms)")
            loads = [(f"worker {w['worker'] + 1}", w["client"]) for w in run.workers] if run.workers else [
                ("client", run.client.to_json() if run.client else None)]
            for who, c in loads:
                if c is not None:
                    print(f"         {who}: {c['cpu_share']:.0%} of a core, event-loop lag p99 "
                          f"{c['loop_lag_p99_ms'] or 0:.2f} ms" + "".join(f"; {note}" for note in c["notes"]))


def ingest_section(url: str, args: argparse.Namespace, workers_list: list[int]) -> None:
    for workers in workers_list:
        planned = plan(workload(args.streams * 2, args.ingest_tokens), "concurrency")
        started = time.perf_counter()
        _, run, _, _ = asyncio.run(one_run(url, planned, workers, concurrency=args.streams))
        tokens = sum(r.completion_tokens or 0 for _, r in run.results if r.ok)
        cpu = sum((w["client"] or {}).get("cpu_s", 0.0) for w in run.workers) if run.workers else (
            run.client.cpu_s if run.client else 0.0)
        print(f"ingest, {args.streams} streams x {args.ingest_tokens} tokens, {workers} worker(s): "
              f"{tokens / run.duration_s:,.0f} tok/s ({tokens} tokens in {run.duration_s:.2f} s of sending, "
              f"{time.perf_counter() - started:.2f} s in all; client CPU {cpu:.2f} s)")


def cost_section(url: str, workers_list: list[int]) -> None:
    for workers in [w for w in workers_list if w > 1]:
        planned = plan(workload(workers, 1), "concurrency")
        _, _, start_s, memory = asyncio.run(one_run(url, planned, workers, concurrency=workers))
        print(f"cost, {workers} workers: ready {start_s:.2f} s after the pool started (spawn, imports, "
              f"prompts); RSS per worker {', '.join(f'{m / 2**20:.0f} MiB' for m in memory)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, e.g. 1,2")
    parser.add_argument("--streams", type=int, default=32, help="ingest: streams at once")
    parser.add_argument("--ingest-tokens", type=int, default=2000, help="ingest: tokens a stream")
    parser.add_argument("--sections", default="rate,ingest,cost")
    args = parser.parse_args()
    workers_list = [int(x) for x in args.workers.split(",")]
    sections = set(args.sections.split(","))
    server, url = start_server("--uvloop")  # the server's CPU is not what is measured: the less, the better
    try:
        if "rate" in sections:
            rate_section(url, args, workers_list)
        if "ingest" in sections:
            ingest_section(url, args, workers_list)
        if "cost" in sections:
            cost_section(url, workers_list)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
