"""Workloads are deterministic and vary what must vary; the runner allows one probe per engine; stats."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from sse_server import Scenario, SSEServer, running

from tui.base.stats import median, quantile
from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient
from tui.probe.results import ProbeResult, ProbeSummary
from tui.probe.runner import ProbeBusy, ProbeRunner
from tui.probe.workloads import (
    WORKLOADS,
    AgentConversation,
    WorkloadParams,
    request_body,
    run_workload,
)


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    with running({"slow": Scenario(per_token_delay_s=0.05)}) as server:
        yield server


def test_bodies_are_deterministic_and_vary_per_request() -> None:
    params = WorkloadParams(seed=3)
    for name in ("short", "long-prefill", "thinking-off"):
        first = request_body(name, params, 0)
        assert first == request_body(name, params, 0)
        other = request_body(name, params, 1)
        # The prompt differs from its first characters on, so no prompt cache can serve a repeat.
        assert first["messages"][0]["content"][:10] != other["messages"][0]["content"][:10]
        assert request_body(name, WorkloadParams(seed=4), 0) != first
        assert first["ignore_eos"] is True and "model" not in first


def test_workload_parameters() -> None:
    short = request_body("short", WorkloadParams(max_tokens=33, model="m", ignore_eos=False), 0)
    assert short["max_tokens"] == 33 and short["model"] == "m" and "ignore_eos" not in short
    off = request_body("thinking-off", WorkloadParams(), 0)
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    long = request_body("long-prefill", WorkloadParams(prompt_tokens=1000), 0)
    assert long["max_tokens"] == 1
    assert 950 <= len(long["messages"][0]["content"].split()) <= 1000
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        request_body("nope", WorkloadParams(), 0)
    with pytest.raises(ValueError, match="stateful"):
        request_body("agent", WorkloadParams(), 0)


async def test_agent_conversation_grows_with_replies(sse: SSEServer) -> None:
    target = EngineTarget(name="sse", url=sse.url_for("ok"))
    async with ProbeClient() as client:
        results = [r async for r in run_workload(client, target, "agent", WorkloadParams(max_tokens=5), 3)]
    assert [r.turn for r in results] == [1, 2, 3]
    assert all(r.ok for r in results)
    bodies = [req.body for req in list(sse.requests)[-3:]]
    assert [len(b["messages"]) for b in bodies] == [3, 5, 7]
    # Turn 2 carries turn 1's request and reply unchanged: a prefix a cache can reuse.
    assert bodies[1]["messages"][:3] == bodies[0]["messages"]
    assert bodies[1]["messages"][3] == {"role": "assistant", "content": results[0].text}
    assert [r.prompt_tokens for r in results] == sorted(r.prompt_tokens for r in results)
    assert all(r.cached_share and r.cached_share > 0.5 for r in results[1:])


def test_agent_drops_a_failed_turn() -> None:
    conv = AgentConversation(WorkloadParams())
    conv.next_body()
    failed = ProbeResult(engine="e", url="u", workload="agent", index=0, wall_start=0, sent_at=0, error="x")
    conv.observe(failed)
    assert len(conv.messages) == 2
    assert len(conv.next_body()["messages"]) == 3


async def test_runner_one_probe_per_engine_and_cancel(sse: SSEServer) -> None:
    runner = ProbeRunner()
    slow = EngineTarget(name="sse", url=sse.url_for("slow"))
    other = EngineTarget(name="other", url=sse.url_for("ok"))
    seen: list[ProbeResult] = []
    task = asyncio.create_task(runner.probe(slow, "short", WorkloadParams(max_tokens=100), repeat=3))
    await asyncio.sleep(0.3)
    assert runner.busy(slow)
    with pytest.raises(ProbeBusy, match="already running on sse"):
        await runner.probe(slow, "short")
    # Another engine is free meanwhile.
    results = await runner.probe(other, "short", WorkloadParams(max_tokens=4), repeat=2,
                                 on_result=seen.append)
    assert [r.index for r in seen] == [0, 1] and results == tuple(seen)
    task.cancel()  # as the dashboard cancels its probe worker
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not runner.busy(slow)
    again = await runner.probe(slow, "short", WorkloadParams(max_tokens=2))  # the engine is free again
    assert again[0].ok, again[0].error
    await runner.aclose()


def test_summary_counts_failures_apart() -> None:
    ok = ProbeResult(engine="e", url="u", workload="w", index=0, wall_start=0, sent_at=0.0,
                     first_token_at=0.1, last_token_at=1.1, ended_at=1.2, completion_tokens=11,
                     prompt_tokens=5, chunks=11, status=200)
    bad = ProbeResult(engine="e", url="u", workload="w", index=1, wall_start=0, sent_at=0.0,
                      error="HTTP 500: x")
    s = ProbeSummary.of([ok, bad, bad])
    assert (s.requests, s.ok, s.failed) == (3, 1, 2)
    assert s.decode_tps_p50 == pytest.approx(10.0) and s.ttft_s_p50 == pytest.approx(0.1)
    assert s.errors == ("HTTP 500: x",) and s.token_source == "server"
    assert ProbeSummary.of([bad]).token_source is None and ProbeSummary.of([bad]).decode_tps_p50 is None


def test_stats() -> None:
    assert median([]) is None and median([None]) is None
    assert median([3, 1, 2]) == 2 and median([1, 2, 3, 4]) == 2.5
    assert quantile([1, 2, 3, 4, 5], 0.9) == pytest.approx(4.6)
    with pytest.raises(ValueError):
        quantile([1], 2)
    assert median([float("nan"), 1.0, None]) == 1.0  # not-a-number is "not available", not a value


def test_workload_names() -> None:
    assert WORKLOADS == ("short", "long-prefill", "agent", "thinking-off")
