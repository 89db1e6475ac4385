"""Concurrency sweep against the loopback SSE server, and the client watching itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from sse_server import Scenario, SSEServer, running

from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient
from tui.probe.sweep import ClientLoad, SelfMonitor, SweepConfig, run_sweep
from tui.probe.workloads import WorkloadParams


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    # 20 ms a token per stream, with no shared bottleneck: aggregate grows with streams.
    with running({"paced": Scenario(per_token_delay_s=0.02)}) as server:
        yield server


async def test_sweep_levels_scale_on_an_uncontended_server(sse: SSEServer) -> None:
    config = SweepConfig(levels=(1, 2, 4), requests_per_stream=2, params=WorkloadParams(max_tokens=10))
    seen: list[int] = []
    async with ProbeClient() as client:
        result = await run_sweep(client, EngineTarget(name="sse", url=sse.url_for("paced")), config,
                                 on_level=lambda lv: seen.append(lv.level))
    assert seen == [1, 2, 4]
    one, _, four = result.levels
    assert [lv.requests for lv in result.levels] == [2, 4, 8]
    assert all(lv.ok == lv.requests and lv.token_source == "server" for lv in result.levels)
    assert four.completion_tokens == 80
    assert one.aggregate_tps and four.aggregate_tps and four.aggregate_tps > 2 * one.aggregate_tps
    # Per stream, the server paces every stream alike.
    assert four.per_stream_tps_p50 == pytest.approx(one.per_stream_tps_p50, rel=0.5)
    assert four.ttft_p50_s is not None and four.ttft_p90_s is not None and four.ttft_p90_s >= four.ttft_p50_s
    assert four.client.loop_lag_p50_ms is not None and four.client.wall_s > 0
    # Distinct prompts across levels: no request repeats another's seed.
    indices = [r.index for lv in result.levels for r in lv.results]
    assert len(set(indices)) == len(indices) == 14
    summary = result.to_json()
    assert summary["best_level"] == 4 and summary["failed"] == 0
    json.dumps([lv.to_json() for lv in result.levels])


async def test_sweep_by_duration(sse: SSEServer) -> None:
    config = SweepConfig(levels=(2,), duration_s=0.5, params=WorkloadParams(max_tokens=5))
    async with ProbeClient() as client:
        result = await run_sweep(client, EngineTarget(name="sse", url=sse.url_for("paced")), config)
    (level,) = result.levels
    assert level.requests >= 4 and level.ok == level.requests
    assert 0.5 <= level.wall_s < 1.5  # stops starting requests at 0.5 s, waits for those in flight


async def test_sweep_of_a_failing_server_reports_errors(sse: SSEServer) -> None:
    config = SweepConfig(levels=(1, 2), requests_per_stream=1)
    async with ProbeClient() as client:
        result = await run_sweep(client, EngineTarget(name="sse", url=sse.url_for("http500")), config)
    assert result.ok == 0 and result.requests == 3
    for lv in result.levels:
        assert lv.failed == lv.requests and lv.aggregate_tps is None and lv.per_stream_tps_p50 is None
        assert lv.errors == ("HTTP 500: simulated failure",)


def test_sweep_config_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="positive stream counts"):
        SweepConfig(levels=(0, 2))
    with pytest.raises(ValueError, match="duration or a request count"):
        SweepConfig(duration_s=0)
    with pytest.raises(ValueError, match="sweep workload"):
        SweepConfig(workload="agent")


def burn_cpu(seconds: float) -> float:
    """Busy work on this thread for `seconds` of CPU time; returns the CPU time it took."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(range(1000))
    return time.process_time() - start


async def test_self_monitor_sees_a_blocked_loop_and_counts_the_cpu_burnt() -> None:
    async with SelfMonitor(0.005) as monitor:
        await asyncio.sleep(0.05)
        time.sleep(0.08)  # the loop is blocked without using the CPU: the ticker wakes late
        burnt = burn_cpu(0.2)  # blocked again, busy this time
        await asyncio.sleep(0.05)
    load = monitor.load
    assert load is not None and load.loop_lag_max_ms is not None and load.loop_lag_max_ms >= 70
    # The busy work is counted, the sleeps are not (the ticker itself costs a few ms at most).
    assert burnt <= load.cpu_s <= burnt + 0.05, (load.cpu_s, burnt)
    assert load.wall_s >= 0.08 + burnt + 0.1 and load.cpu_share < 1


def test_client_load_verdict() -> None:
    idle = ClientLoad(wall_s=10, cpu_s=1, loop_lag_p50_ms=0.1, loop_lag_p99_ms=1.0, loop_lag_max_ms=2.0,
                      host_cpu_percent=30)
    assert not idle.bottleneck and idle.notes == ()
    busy = ClientLoad(wall_s=10, cpu_s=9, loop_lag_p50_ms=3, loop_lag_p99_ms=25, loop_lag_max_ms=40,
                      host_cpu_percent=99)
    assert busy.bottleneck
    assert busy.notes == (
        "the client used 90% of a core: it may be the bottleneck",
        "the client's event loop ran up to 25 ms late (p99): arrival times are late by as much",
        "host CPUs were 99% busy: client and engine compete for cores",
    )
    assert busy.to_json()["bottleneck"] is True
