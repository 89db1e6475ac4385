"""The probe client against the loopback SSE server: every odd stream gives a labelled figure or an error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from sse_server import Scenario, SSEServer, running

from tui.base.process import free_port
from tui.model.targets import EngineTarget
from tui.net.policy import public_url
from tui.probe.client import ProbeClient, ProbeLimits, chat_url
from tui.probe.results import CHUNK_ESTIMATE_NOTE, ProbeResult

BODY = {"messages": [{"role": "user", "content": "one two three four five"}], "max_tokens": 12}


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    scenarios = {
        "slow": Scenario(per_token_delay_s=0.01),
        "prefill": Scenario(first_token_delay_s=0.2),
        "multi4": Scenario(tokens_per_chunk=4),
        "no_usage_multi": Scenario(usage=False, timings=False, tokens_per_chunk=2),
        "trickle": Scenario(per_token_delay_s=0.2),
    }
    with running(scenarios) as server:
        yield server


def target(server: SSEServer, scenario: str, key: str | None = None) -> EngineTarget:
    return EngineTarget(name="sse", url=server.url_for(scenario), api_key=key)


async def probe(server: SSEServer, scenario: str, body: dict | None = None, **limits: float) -> ProbeResult:
    async with ProbeClient(ProbeLimits(**limits)) as client:
        return await client.chat(target(server, scenario), body or BODY, workload="test")


async def test_normal_stream_uses_server_counts_and_timings(sse: SSEServer) -> None:
    r = await probe(sse, "slow", {**BODY, "max_tokens": 20})
    assert r.ok, r.error
    assert (r.status, r.finish_reason, r.token_source) == (200, "length", "server")
    assert r.completion_tokens == 20 and r.chunks == 20 and r.chunk_gap == 0
    assert r.prompt_tokens == 6  # the server counts "<user>" plus five words
    assert r.ttft_s is not None and r.ttft_s > 0
    assert r.e2e_s is not None and r.e2e_s >= r.ttft_s
    # 19 gaps of ~10 ms: the client's rate and the server's own clock tell the same story (loosely: the
    # margin is for a busy machine; bench/ and the llama-server test hold the tight figure).
    assert r.server_decode_tps is not None and r.decode_tps is not None
    assert r.decode_tps == pytest.approx(r.server_decode_tps, rel=0.2)
    assert r.decode_tps == pytest.approx(19 / r.decode_s)
    assert r.prefill_source == "server" and r.prefill_tps == r.server.prompt_per_second
    assert r.text.split()[:3] == ["alpha", "beta", "gamma"]


async def test_request_asks_for_usage_and_a_fresh_connection(sse: SSEServer) -> None:
    before = len(sse.requests)
    async with ProbeClient() as client:
        for _ in range(3):
            r = await client.chat(target(sse, "ok"), BODY)
            assert r.ok, r.error
    # before the first probe, one GET asks whether the server is Ollama (tui.probe.ollama); then the probes
    sent = [req for req in list(sse.requests)[before:] if not req.path.endswith("/api/version")]
    assert len(sent) == 3
    for req in sent:
        assert req.path == "/s/ok/v1/chat/completions"
        assert req.body is not None and req.body["stream"] is True
        assert req.body["stream_options"] == {"include_usage": True}
        assert req.headers["connection"] == "close"
        assert "authorization" not in req.headers
    assert len({req.peer_port for req in sent}) == 3  # never a reused connection


async def test_several_tokens_per_chunk_count_from_usage(sse: SSEServer) -> None:
    r = await probe(sse, "multi4")
    assert r.ok and r.token_source == "server"
    assert (r.completion_tokens, r.chunks, r.chunk_gap) == (12, 3, 9)


async def test_empty_chunks_are_not_counted(sse: SSEServer) -> None:
    r = await probe(sse, "empty_chunks")
    assert r.ok and r.chunks == 12 and r.completion_tokens == 12


async def test_role_only_first_chunk_does_not_start_the_ttft_clock(sse: SSEServer) -> None:
    r = await probe(sse, "prefill")
    assert r.ok and r.ttft_s is not None and r.ttft_s >= 0.2
    no_role = await probe(sse, "no_role")
    assert no_role.ok and no_role.completion_tokens == 12


async def test_sse_comments_and_keepalives_are_ignored(sse: SSEServer) -> None:
    r = await probe(sse, "comments")
    assert r.ok and r.chunks == 12 and r.completion_tokens == 12


async def test_no_usage_is_an_estimate_from_chunks_and_says_so(sse: SSEServer) -> None:
    r = await probe(sse, "no_usage_multi")
    assert r.ok
    assert r.token_source == "chunks" and r.estimated
    assert r.completion_tokens == r.chunks == 6  # 12 real tokens, 2 a chunk: the estimate is what it is
    assert CHUNK_ESTIMATE_NOTE in r.notes
    assert r.prompt_tokens is None and r.server is None and r.server_decode_tps is None
    assert r.prefill_tps is None and r.prefill_source is None  # no prompt count: no rate at all
    assert r.chunk_gap is None
    out = r.to_json()
    assert out["estimated_from_chunks"] is True and out["token_source"] == "chunks"


async def test_usage_without_timings_gives_client_lower_bound_prefill(sse: SSEServer) -> None:
    fresh = {**BODY, "messages": [{"role": "user", "content": "fresh words"}]}
    r = await probe(sse, "usage_no_timings", fresh)
    assert r.ok and r.token_source == "server" and r.server is None
    assert r.server_decode_tps is None
    assert r.prefill_source == "client-lower-bound"
    # Cached tokens were not prefilled: only the rest count.
    assert r.cached_tokens is not None and r.prompt_tokens > r.cached_tokens
    assert r.prefill_tps == pytest.approx((r.prompt_tokens - r.cached_tokens) / r.ttft_s)


async def test_vllm_per_request_metrics(sse: SSEServer) -> None:
    r = await probe(sse, "vllm", {**BODY, "messages": [{"role": "user", "content": "vllm words here"}]})
    assert r.ok and r.server is not None and r.server.source == "vllm"
    assert r.server.mean_itl_ms is not None
    assert r.server_decode_tps == pytest.approx(1000 / r.server.mean_itl_ms)
    assert r.chunks == 12  # empty chunks skipped


async def test_http_500_before_the_stream(sse: SSEServer) -> None:
    r = await probe(sse, "http500")
    assert not r.ok and r.status == 500
    assert r.error == "HTTP 500: simulated failure"
    assert r.ttft_s is None and r.decode_tps is None and r.completion_tokens is None


async def test_error_event_in_the_middle_of_the_stream(sse: SSEServer) -> None:
    r = await probe(sse, "error_mid")
    assert not r.ok and r.status == 200
    assert r.error == "server error in the stream after 3 chunks: simulated engine crash mid-stream"
    assert r.decode_tps is None and r.prefill_tps is None
    assert r.completion_tokens == 3 and r.estimated  # what arrived, labelled as counted from chunks


async def test_dropped_connection(sse: SSEServer) -> None:
    r = await probe(sse, "drop")
    assert not r.ok and r.error is not None
    assert r.error.startswith("connection dropped after 3 chunks")
    assert r.decode_tps is None


async def test_server_that_never_answers_times_out(sse: SSEServer) -> None:
    r = await probe(sse, "hang", read_s=0.3)
    assert not r.ok and r.status is None
    assert r.error == "server silent for 0.3s before the response"


async def test_trickling_stream_hits_the_total_limit(sse: SSEServer) -> None:
    r = await probe(sse, "trickle", read_s=5, total_s=0.5)
    assert not r.ok and r.error == "request took longer than 0.5s in all; cancelled"
    assert r.e2e_s is not None and r.e2e_s < 2


async def test_oversized_chunk_is_refused(sse: SSEServer) -> None:
    r = await probe(sse, "oversized")
    assert not r.ok and r.error is not None and "over 1048576 bytes" in r.error


async def test_invalid_json_chunk(sse: SSEServer) -> None:
    r = await probe(sse, "bad_json")
    assert not r.ok and r.error is not None and r.error.startswith("invalid JSON in stream event")


async def test_connection_refused() -> None:
    dead = EngineTarget(name="dead", url=f"http://127.0.0.1:{free_port()}")
    async with ProbeClient() as client:
        r = await client.chat(dead, BODY)
    assert not r.ok and r.status is None and r.error is not None and r.error.startswith("cannot connect")


@pytest.mark.parametrize("scenario", sorted(SSEServer().scenarios))
async def test_every_scenario_serialises_and_invents_nothing(sse: SSEServer, scenario: str) -> None:
    r = await probe(sse, scenario, read_s=0.5)
    out = json.loads(json.dumps(r.to_json()))
    if not r.ok:
        assert out["error"] and out["decode_tps"] is None and out["prefill_tps"] is None
        assert out["server_decode_tps"] is None
    if out["token_source"] == "chunks" and out["completion_tokens"] is not None:
        assert out["estimated_from_chunks"] is True


async def test_cancelling_a_request_propagates(sse: SSEServer) -> None:
    async with ProbeClient() as client:
        task = asyncio.create_task(client.chat(target(sse, "hang"), BODY))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_urls() -> None:
    assert chat_url("http://h:1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1") == "http://h:1/v1/chat/completions"
    assert public_url("http://user:pw@h:1/x") == "http://h:1/x"
