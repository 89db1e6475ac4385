"""The traffic proxy in front of the real vLLM: the client's events are what vLLM sends it directly, with and
without usage, the tokens counted are vLLM's own, and the trace's ids come from vLLM's own tokenizer."""

from __future__ import annotations

import math

import httpx
import orjson

from tests.test_proxy_llama import normalised, proxy_options, stream_events, text_of
from tui.model.targets import EngineTarget
from tui.proxy.options import build_proxy
from tui.proxy.stream import event_json


async def test_vllm_events_are_unchanged_through_the_proxy_and_its_usage_is_counted(vllm_server, tmp_path):
    trace = tmp_path / "vllm.jsonl"
    proxy = build_proxy(proxy_options("vllm", tmp_path, trace=trace, block_size=4),
                        [EngineTarget("vllm", vllm_server.url)])
    await proxy.start()
    via = proxy.routes[0].proxy_url
    proxied_requests = 0
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for usage in (False, True):
                body = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12,
                        "temperature": 0, "stream": True, "ignore_eos": True}
                if usage:
                    body["stream_options"] = {"include_usage": True}
                # vLLM hands its frontend every token ready at once when the frontend lags (a loaded 2-core
                # machine), so two generations can chunk the same text differently: a pair is asked again
                # when they do. A proxy that changed events would change them on every try.
                for _ in range(3):
                    direct = await stream_events(client, vllm_server.url, body)
                    proxied = await stream_events(client, via, body)
                    proxied_requests += 1
                    if normalised(proxied) == normalised(direct):
                        break
                assert normalised(proxied) == normalised(direct)
                assert text_of(proxied) == text_of(direct)
                events = [event_json(e + b"\n\n") for e in proxied]
                usage_chunks = [e for e in events if e and e.get("choices") == []]
                assert len(usage_chunks) == usage  # the proxy's own request for usage is not seen
                assert not any(e and "metrics" in e for e in events) or usage
                record = proxy.books["vllm"].recent()[-1]
                assert record.outcome == "ok" and record.completion_tokens == 12 and record.prompt_tokens
                assert record.engine_ttft_ms is not None  # --enable-per-request-metrics, from the usage chunk
                if usage:
                    assert record.prompt_tokens == usage_chunks[0]["usage"]["prompt_tokens"]
    finally:
        await proxy.stop()
    lines = [orjson.loads(line) for line in trace.read_text().splitlines()]
    assert len(lines) == proxied_requests and proxy.trace.failures == []
    assert all(line["hash_ids"] == lines[0]["hash_ids"] for line in lines)  # the same prompt, the same blocks
    assert len(lines[0]["hash_ids"]) == math.ceil(lines[0]["input_length"] / 4)
