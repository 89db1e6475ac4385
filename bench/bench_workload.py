"""How well `enginetop bench` keeps to its plan: send lateness at a fixed arrival rate.

    .venv/bin/python bench/bench_workload.py [--rate 100] [--seconds 10] [--tokens 4]

A loopback SSE server (tests/sse_server.py, its own process, answering at once) takes --rate requests per
second for --seconds, constant and then Poisson arrivals, each a streamed chat of --tokens tokens, sent by
`tui.workload.bench.Bench` exactly as `enginetop bench --rate` sends them. Printed: the send lateness (the
moment a request was handed to the client, minus its planned moment) p50/p99/max (goal: p99 <= 2 ms at 100
req/s), the rate achieved, and the client's own self-check (CPU share, event-loop lag).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_probe import start_server  # noqa: E402
from tui.model.targets import EngineTarget  # noqa: E402
from tui.model.workload import Workload, WorkloadRequest  # noqa: E402
from tui.workload.bench import Bench, summarize  # noqa: E402
from tui.workload.schedule import plan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args()
    server, url = start_server()
    n = int(args.rate * args.seconds)
    workload = Workload("synthetic", "vllm-custom", tuple(
        WorkloadRequest(line=i + 1, prompt="bench", output_length=args.tokens) for i in range(n)))
    try:
        for arrival in ("constant", "poisson"):
            bench = Bench(EngineTarget("sse", url), plan(workload, "rate", rate=args.rate, arrival=arrival))
            run = asyncio.run(bench.go())
            s = summarize(run)
            late = s.lateness_s
            print(f"{arrival:8s} {args.rate:g} req/s x {args.seconds:g} s: {s.ok}/{s.requests} ok in "
                  f"{run.duration_s:.2f} s ({s.requests_per_s or 0:.1f} req/s); send lateness p50 "
                  f"{(late.p50 or 0) * 1000:.2f} ms, p99 {(late.p99 or 0) * 1000:.2f} ms, max "
                  f"{max(run.lateness_s, default=0) * 1000:.2f} ms (goal p99 <= 2 ms)")
            if run.client is not None:
                c = run.client
                print(f"         client: {c.cpu_share:.0%} of a core, event-loop lag p99 "
                      f"{c.loop_lag_p99_ms or 0:.2f} ms" + "".join(f"; {note}" for note in c.notes))
    finally:
        server.kill()


if __name__ == "__main__":
    main()
