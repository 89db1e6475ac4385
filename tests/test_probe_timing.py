"""What a probe's times mean, against the loopback SSE server: TTFT from the send with the connect apart,
the instants plot markers belong at, the engine's own TTFT beside the client's (and the words for a gap),
and a result that says when a prompt cache served it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sse_server import Scenario, SSEServer, running

from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR, ProbeResult
from tui.probe.runner import ProbeRunner
from tui.probe.sweep import SweepConfig
from tui.probe.timings import ServerTimings
from tui.probe.workloads import WorkloadParams, request_body

BODY = {"messages": [{"role": "user", "content": "one two three four five six seven eight"}], "max_tokens": 8}


async def chat(url: str, body: dict | None = None, **kw: object) -> ProbeResult:
    # an OpenAI server by its target: the probe's own request alone (no GET asking whether it is Ollama)
    async with ProbeClient() as client:
        return await client.chat(EngineTarget(name="sse", url=url, api="openai"), body or BODY, **kw)


async def test_ttft_starts_at_the_send_and_the_connect_is_measured_apart() -> None:
    # The listener's accept queue is full for 0.5 s: the kernel drops the client's SYN and retries it
    # about a second later, so connecting takes that long while the server answers at once.
    with running(accept_after_s=0.5) as server:
        before = time.monotonic()
        r = await chat(server.url_for("ok"))
        after = time.monotonic()
    assert r.ok, r.error
    assert r.connect_s is not None and r.connect_s >= 0.45, r.connect_s
    assert r.tls_s is None  # http://
    assert r.sent_at is not None and before + r.connect_s <= r.sent_at  # the send follows the connect
    assert r.ended_at is not None and r.ended_at <= after  # one clock: time.monotonic()
    # Neither TTFT nor end-to-end time carries the connect.
    assert r.ttft_s is not None and r.e2e_s is not None
    assert r.e2e_s < r.connect_s / 2, (r.e2e_s, r.connect_s)
    out = r.to_json()
    assert out["connect_s"] == r.connect_s and "tls_s" not in out


async def test_marker_instants_are_the_middle_of_what_each_figure_measures() -> None:
    with running({"paced": Scenario(first_token_delay_s=0.2, per_token_delay_s=0.03)}) as server:
        r = await chat(server.url_for("paced"))
    assert r.ok and r.sent_at is not None and r.first_token_at is not None and r.last_token_at is not None
    assert r.ttft_s is not None and r.ttft_s >= 0.2
    assert r.ttft_at == pytest.approx(r.sent_at + r.ttft_s / 2)
    assert r.decode_s is not None and r.decode_s >= 7 * 0.03 * 0.9
    assert r.decode_at == pytest.approx(r.first_token_at + r.decode_s / 2)
    # Both lie well before the request ended, where markers used to be placed.
    assert r.ended_at is not None and r.ttft_at < r.decode_at < r.ended_at
    failed = ProbeResult(engine="e", url="u", workload="short", index=0, wall_start=0, sent_at=None,
                         error="cannot connect")
    assert failed.ttft_at is None and failed.decode_at is None and failed.ttft_s is None


@pytest.fixture(scope="module")
def engines() -> Iterator[SSEServer]:
    scenarios = {
        # The engine makes its first token at once; the frontend writes it out 150 ms later.
        "late_frontend": Scenario(timings=False, vllm_metrics=True, write_delay_s=0.15),
        # The request waits 150 ms in the engine's queue; the engine's TTFT leaves the queue out.
        "queued": Scenario(timings=False, vllm_metrics=True, queue_s=0.15),
        "prompt_ms": Scenario(first_token_delay_s=0.1),  # llama.cpp-style timings, no gap
    }
    with running(scenarios) as server:
        yield server


async def test_engine_ttft_beside_the_clients_and_a_late_frontend_is_flagged(engines: SSEServer) -> None:
    r = await chat(engines.url_for("late_frontend"))
    assert r.ok and r.server is not None and r.server.source == "vllm"
    assert r.server_ttft_s is not None and r.server_ttft_s < 0.05
    assert r.ttft_s is not None and r.ttft_s >= 0.15
    gap = r.ttft_gap()
    assert gap is not None and gap.factor == DEFAULT_TTFT_GAP_FACTOR
    assert gap.cause.startswith("frontend or detokenizer bound: the engine had the first token after")
    assert "queue 0.0 ms" in gap.cause
    assert gap.text().startswith(f"client TTFT {r.ttft_s * 1000:.0f} ms vs the engine's ")
    out = json.loads(json.dumps(r.to_json()))
    assert out["server_ttft_s"] == r.server_ttft_s and out["ttft_gap"]["cause"] == gap.cause
    # The factor is the user's: past the observed ratio, nothing is flagged.
    assert r.ttft_gap(factor=gap.ratio * 1.1) is None
    assert r.to_json(ttft_gap_factor=gap.ratio * 1.1)["ttft_gap"] is None


async def test_a_queued_request_is_explained_by_queueing(engines: SSEServer) -> None:
    r = await chat(engines.url_for("queued"))
    assert r.ok and r.server_queue_s == pytest.approx(0.15)
    gap = r.ttft_gap()
    assert gap is not None
    assert gap.cause == "queueing: the request waited 150 ms before the engine scheduled it"


async def test_llamacpp_prompt_ms_is_the_engine_ttft_and_no_gap_is_flagged(engines: SSEServer) -> None:
    r = await chat(engines.url_for("prompt_ms"))
    assert r.ok and r.server is not None and r.server.prompt_ms is not None
    assert r.server_ttft_s == pytest.approx(r.server.prompt_ms / 1000)
    assert r.ttft_s is not None and r.ttft_s >= r.server_ttft_s
    assert r.ttft_gap() is None and r.to_json()["ttft_gap"] is None


def test_a_slow_connect_is_named_as_the_cause_when_it_is_most_of_the_gap() -> None:
    # Built by hand: a real connect long enough to matter needs a real distant network.
    base = dict(engine="e", url="u", workload="short", index=0, wall_start=0.0, sent_at=10.0,
                first_token_at=10.3, last_token_at=10.5, ended_at=10.6, completion_tokens=8)
    far = ProbeResult(**base, connect_s=0.2, server=ServerTimings(source="llamacpp", prompt_ms=50.0))
    gap = far.ttft_gap()
    assert gap is not None and gap.cause.startswith("a slow connection path: connecting alone took 200 ms")
    near = ProbeResult(**base, connect_s=0.001, server=ServerTimings(source="llamacpp", prompt_ms=50.0))
    near_gap = near.ttft_gap()
    assert near_gap is not None and near_gap.cause.startswith("frontend or detokenizer bound")
    assert "the engine reports no queue time" in near_gap.cause  # llama.cpp: nothing on a wait for a slot
    tiny = ProbeResult(**{**base, "first_token_at": 10.004}, server=ServerTimings(source="llamacpp",
                                                                                   prompt_ms=1.0))
    assert tiny.ttft_gap() is None  # 4x, but 3 ms: noise, not a finding


async def test_a_repeated_prompt_says_the_cache_served_it() -> None:
    with running() as server:
        first = await chat(server.url_for("ok"))
        again = await chat(server.url_for("ok"))
    assert first.ok and again.ok
    assert not first.cache_served and first.cache_note is None
    assert again.cached_share is not None and again.cached_share >= 0.5
    note = f"prompt cache served {again.cached_tokens} of {again.prompt_tokens} prompt tokens: " \
           "TTFT/prefill measure a cache hit"
    assert again.cache_served and again.cache_note == note and note in again.notes
    out = again.to_json()
    assert out["cache_served"] is True and note in out["notes"]
    # Agent turns after the first are meant to hit the cache: no warning there; a first turn gets one.
    assert not replace(again, workload="agent", turn=2).cache_served
    assert replace(again, workload="agent", turn=1).cache_served


async def test_the_runner_sends_a_new_prompt_every_call_with_the_same_params() -> None:
    """As the dashboard does: ProbeRunner.probe(target, workload, params, repeat=1) with one params object."""
    params = WorkloadParams(max_tokens=4)
    sweep = SweepConfig(levels=(1, 2), requests_per_stream=1, params=params)
    runner = ProbeRunner()
    with running() as server:
        target = EngineTarget(name="sse", url=server.url_for("ok"))
        results = [(await runner.probe(target, "short", params, repeat=1))[0] for _ in range(5)]
        swept = [await runner.sweep(target, sweep) for _ in range(2)]  # the same config twice, too
        prompts = [req.body["messages"][0]["content"] for req in server.requests if req.body is not None]
    await runner.aclose()
    assert all(r.ok and r.index == 0 for r in results) and all(s.ok == 3 for s in swept)
    assert len(prompts) == 5 + 2 * 3
    assert len({p.split()[0] for p in prompts}) == len(prompts)  # they differ from the first word on
    # The loopback server's prefix cache matches only its role marker: nothing the prompt says.
    assert all(r.cached_tokens == 1 and not r.cache_served for r in results[1:])


def test_every_new_params_has_its_own_nonce_and_a_fixed_one_repeats() -> None:
    a, b = WorkloadParams(), WorkloadParams()
    assert a.nonce != b.nonce
    assert request_body("short", a, 0)["messages"] != request_body("short", b, 0)["messages"]
    fixed = WorkloadParams(nonce="x")
    assert request_body("short", fixed, 3) == request_body("short", WorkloadParams(nonce="x"), 3)

