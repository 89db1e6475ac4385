"""poll_engine against the real llama-server (Gemma 3 270M). A missing engine fails, never skips."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tui.base.paths import runs_dir
from tui.base.process import free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_model_path, llama_server_binary
from tui.model.targets import EngineTarget
from tui.sources.engine import poll_engine
from tui.sources.rates import derive

pytestmark = pytest.mark.engine

NEEDS_KEY = ("unauthorized: it answers, and needs an API key: give it with --api-key-file NAME=PATH or "
             "--api-key-env NAME=VAR")


async def test_counters_move_by_exactly_what_the_replies_report(llama_server) -> None:
    target = EngineTarget("llama", llama_server.url)
    request = {
        "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": False,
    }
    async with httpx.AsyncClient() as client, httpx.AsyncHTTPTransport() as transport:
        before = await poll_engine(transport, target)
        assert before.health == "up", before.health_reason
        assert before.metrics_error is None
        assert before.reading.dialect == "llamacpp"
        assert before.model  # /v1/models answered with the model id
        usages = []
        for _ in range(2):  # the same prompt twice: the second one is served from the prompt cache
            reply = await client.post(f"{llama_server.url}/v1/chat/completions", json=request, timeout=120)
            reply.raise_for_status()
            usages.append(reply.json()["usage"])
        completion = sum(u["completion_tokens"] for u in usages)
        # Generation counters are added when the slot is released, just after the reply is sent.
        deadline = time.monotonic() + 10
        while True:
            after = await poll_engine(transport, target)
            moved = after.reading.generation_tokens_total - before.reading.generation_tokens_total
            if moved >= completion or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    old, new = before.reading, after.reading
    assert completion > 0
    assert new.generation_tokens_total - old.generation_tokens_total == completion
    # prompt_tokens excludes cached tokens, so the lookups (prompt + cached) are the whole prompts
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    prompts = sum(u["prompt_tokens"] for u in usages)
    assert cached > 0
    assert new.prefix_cache_hits_total - old.prefix_cache_hits_total == cached
    assert new.prefix_cache_queries_total - old.prefix_cache_queries_total == prompts
    assert new.prompt_tokens_computed_total - old.prompt_tokens_computed_total == prompts - cached
    stats = derive(old, before.t, new, after.t)
    assert stats.counter_reset is False
    assert stats.gen_tps > 0
    assert stats.decode_tps_busy > 0  # tokens per second of decode time
    assert 0 < stats.prefix_cache_hit_rate < 1
    assert stats.ttft_p50_s is None  # llama.cpp has no latency histograms


async def test_llama_server_without_metrics_flag_and_with_api_key() -> None:
    key = "enginetop-test-key-4711"
    port = free_port()
    # demo_argv adds --metrics, so build the argv here; the key goes by environment, never argv.
    argv = [
        str(llama_server_binary()), "--model", str(demo_model_path()), "--host", "127.0.0.1",
        "--port", str(port), "--ctx-size", "512", "--threads", "1",
    ]
    launched = launch(argv, runs_dir() / f"test-nometrics-{port}.log", env={"LLAMA_API_KEY": key})
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncHTTPTransport() as transport:
            seen = set()
            deadline = time.monotonic() + 120
            while True:
                anonymous = await poll_engine(transport, EngineTarget("nometrics", url), launched_by_us=True)
                seen.add(anonymous.health)
                if anonymous.health == "up":
                    break
                assert launched.alive(), "\n".join(launched.log_tail(30))
                assert time.monotonic() < deadline, f"not up after 120 s: {anonymous.health_reason}"
                await asyncio.sleep(0.2)
            assert seen <= {"starting", "loading", "up"}  # never "down" while it starts
            assert anonymous.metrics_error == NEEDS_KEY
            assert anonymous.model is None  # /v1/models needs the key in this llama.cpp version

            keyed = await poll_engine(transport, EngineTarget("nometrics", url, key))
            assert keyed.health == "up"
            assert keyed.metrics_error == "metrics disabled: start llama-server with --metrics"
            assert keyed.model  # with the key /v1/models answers
            assert key not in repr(keyed)
            assert key not in " ".join(argv)
    finally:
        stop_group(launched)
    assert not launched.alive()
