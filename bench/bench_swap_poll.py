"""What one poll of llama-swap costs enginetop: wall and CPU time per EngineSource.read() of the loopback
llama-swap stand-in (tests/swap_server.py, its own process, no model running), which reads /running,
/v1/models, /api/profiles and the in-flight snapshot of /api/events each poll.

    .venv/bin/python bench/bench_swap_poll.py [--polls 200]

The event stream never ends: it is read through the poller's keep-alive pool only until its in-flight
snapshot came (tui.net.keepalive `until`), then dropped. For comparison, the same snapshot read with a new
httpx client per poll (what a plain httpx stream costs: its client and TLS context each time) is timed in
the same run. Printed: ms of wall and of CPU per poll, each way, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from tests.test_swap import StandIn  # noqa: E402
from tui.model.targets import EngineTarget  # noqa: E402
from tui.net.keepalive import Transports  # noqa: E402
from tui.net.policy import client_kwargs  # noqa: E402
from tui.sources import swap as swap_source  # noqa: E402
from tui.sources.engine_source import EngineSource  # noqa: E402


async def per_poll(polls: int, url: str) -> tuple[float, float]:
    source = EngineSource(EngineTarget("swap", url), Transports(), interval_s=0.1)
    [first] = await source.read()
    assert first.models is not None and first.models[0].in_flight is not None, first
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(polls):
        await source.read()
    return (time.perf_counter() - wall) / polls, (time.process_time() - cpu) / polls


async def fresh_client_snapshot(polls: int, url: str) -> tuple[float, float]:
    async def once() -> None:
        async with httpx.AsyncClient(**client_kwargs(url)) as client, \
                client.stream("GET", url + swap_source.EVENTS_PATH) as reply:
            async for line in reply.aiter_lines():
                if swap_source.inflight_snapshot(line.encode()) is not None:
                    return

    await once()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(polls):
        await once()
    return (time.perf_counter() - wall) / polls, (time.process_time() - cpu) / polls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()
    stand_in = StandIn()
    stand_in.start()
    try:
        poll_wall, poll_cpu = asyncio.run(per_poll(args.polls, stand_in.url))
        fresh_wall, fresh_cpu = asyncio.run(fresh_client_snapshot(args.polls, stand_in.url))
    finally:
        stand_in.stop()
    print(f"llama-swap poll (4 requests, events through the keep-alive pool): {poll_wall * 1e3:.2f} ms wall, "
          f"{poll_cpu * 1e3:.2f} ms CPU")
    print(f"the events snapshot alone with a new httpx client each time: {fresh_wall * 1e3:.2f} ms wall, "
          f"{fresh_cpu * 1e3:.2f} ms CPU ({fresh_cpu / poll_cpu:.1f}x the whole poll's CPU)")


if __name__ == "__main__":
    main()
